"""Which model a checkpoint is of: its architecture, sizes and vocabulary, not token ids or generation settings
(TRL's SFTTrainer sets config.pad_token_id from the tokenizer), so the model TRL trained merges with its base."""

from __future__ import annotations

import copy
import json

import pytest
from trainers import CPU_QUIET

from forgetwatch import merge_sweep
from forgetwatch.cli import main
from forgetwatch.run.base import model_key


def changed(model, **fields):
    other = copy.deepcopy(model)
    for name, value in fields.items():
        setattr(other.config, name, value)
    return other


@pytest.mark.parametrize(
    "fields",
    [
        {"pad_token_id": None},
        {"pad_token_id": 5, "eos_token_id": [2, 3], "bos_token_id": None},
        {"max_length": 77, "temperature": 0.3, "do_sample": True},
        {"use_cache": False, "id2label": {0: "a", 1: "b"}},
    ],
)
def test_token_ids_and_generation_settings_are_not_the_model(toy, fields):
    assert model_key(changed(toy.base, **fields)) == model_key(toy.base)


@pytest.mark.parametrize(
    "fields", [{"vocab_size": 999}, {"num_hidden_layers": 7}, {"rms_norm_eps": 0.5}, {"hidden_act": "gelu"}]
)
def test_architecture_sizes_and_vocabulary_are(toy, fields):
    assert model_key(changed(toy.base, **fields)) != model_key(toy.base)


@pytest.mark.slow
def test_the_model_trl_trained_merges_with_its_base(toy, tmp_path):
    trl = pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    base = changed(toy.base, pad_token_id=None)  # as Llama-family configs come: TRL fills it in
    args = trl.SFTConfig(
        str(tmp_path / "run"),
        max_steps=4,
        per_device_train_batch_size=8,
        learning_rate=2e-3,
        max_length=64,
        **CPU_QUIET,
    )
    trainer = trl.SFTTrainer(
        model=copy.deepcopy(base),
        args=args,
        processing_class=toy.tokenizer,
        train_dataset=datasets.Dataset.from_dict({"text": toy.world.distraction_texts(n=32)}),
    )
    trainer.train()
    tuned = trainer.model
    assert tuned.config.pad_token_id == toy.tokenizer.pad_token_id and base.config.pad_token_id is None
    texts = toy.world.distraction_texts(n=4, seed=7)
    sweep = merge_sweep(base, tuned, toy.tokenizer, toy.probes, target=texts, alphas=[0.5])
    assert sweep.alphas == [0.0, 0.5, 1.0]
    # and from the saved checkpoints, on the command line
    dirs = {}
    for name, model in (("base", base), ("tuned", tuned)):
        dirs[name] = tmp_path / name
        model.save_pretrained(dirs[name])
        toy.tokenizer.save_pretrained(dirs[name])
    (tmp_path / "texts.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    probes = toy.probes.to_jsonl(tmp_path / "probes.jsonl")
    args = ["--base", str(dirs["base"]), "--model", str(dirs["tuned"]), "--probes", str(probes)]
    out = tmp_path / "merged"
    target = ["--target-texts", str(tmp_path / "texts.jsonl"), "--alphas", "0:1:0.5"]
    assert main(["merge", *args, *target, "--out", str(out), "--no-progress"]) == 0
    assert json.loads((out / "sweep.json").read_text())["rows"][0]["alpha"] == 0.0
