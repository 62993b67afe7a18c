"""LoRA (PEFT) models: scored like their merged equivalent; base="adapter_disabled"."""

from __future__ import annotations

import copy
import logging

import numpy as np
import pytest
import torch

from forgetwatch import Scoring, compare, evaluate
from forgetwatch.common.distributed import Ranks
from forgetwatch.config import ConfigError, ForgetWatchConfig
from forgetwatch.integrations.callback import ForgetWatchCallback
from forgetwatch.scoring.next_tokens import base_distribution
from forgetwatch.scoring.scorer import pad_id

# trains models (or runs several processes, or a browser): pytest -m "not slow" leaves them out
pytestmark = pytest.mark.slow

peft = pytest.importorskip("peft")
trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

COMMON = dict(
    use_cpu=True,
    bf16=False,
    activation_checkpointing=False,
    logging_steps=1,
    report_to=[],
    dataloader_num_workers=0,
    dataloader_pin_memory=False,
    seed=0,
    disable_tqdm=True,
    per_device_train_batch_size=8,
    learning_rate=2e-2,
    max_length=64,
    packing=False,
)


def lora_config(init: bool = True):
    """``init=False``: adapters that already change the model when training begins."""
    return peft.LoraConfig(
        r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=0.0, task_type="CAUSAL_LM", init_lora_weights=init
    )


def sft(toy, tmp_path, callbacks, init=True, **overrides):
    args = trl.SFTConfig(str(tmp_path), **{**COMMON, "max_steps": 12, "save_strategy": "no", **overrides})
    return trl.SFTTrainer(
        model=copy.deepcopy(toy.base),
        args=args,
        processing_class=toy.tokenizer,
        train_dataset=datasets.Dataset.from_dict({"text": toy.world.distraction_texts(n=64)}),
        peft_config=lora_config(init),
        callbacks=callbacks,
    )


def test_lora_model_scores_like_its_merged_weights(toy, tmp_path):
    trainer = sft(toy, tmp_path, [])
    trainer.train()
    lora = trainer.model
    merged = copy.deepcopy(lora).merge_and_unload()  # a plain transformers model again
    assert not hasattr(merged, "peft_config")
    got = evaluate(
        lora, toy.tokenizer, toy.probes, batch_size=8, scoring=Scoring(max_new_tokens=6), show_progress=False
    )
    want = evaluate(
        merged, toy.tokenizer, toy.probes, batch_size=8, scoring=Scoring(max_new_tokens=6), show_progress=False
    )
    assert got.correct.tolist() == want.correct.tolist()
    assert got.outputs == want.outputs
    for x, y in zip(got.choice_logprobs, want.choice_logprobs):
        np.testing.assert_allclose(x, y, atol=1e-4)
    # the adapters learned something: the LoRA model is not the base
    base = evaluate(
        toy.base, toy.tokenizer, toy.probes, batch_size=8, scoring=Scoring(max_new_tokens=6), show_progress=False
    )
    assert compare(base, got).forgotten > 0


def test_adapter_disabled_base_is_the_model_before_training(toy, tmp_path):
    cb = ForgetWatchCallback(toy.probes, eval_steps=6, base="adapter_disabled", scoring=Scoring(max_new_tokens=6))
    trainer = sft(toy, tmp_path, [cb])
    trainer.train()
    base = evaluate(toy.base, toy.tokenizer, toy.probes, scoring=Scoring(max_new_tokens=6), show_progress=False)
    assert cb.base_answers.correct.tolist() == base.correct.tolist()
    assert cb.base_answers.meta["base"] == "adapter_disabled"
    assert [s for s, _ in cb.history] == [6, 12]
    final = compare(
        base, evaluate(trainer.model, toy.tokenizer, toy.probes, scoring=Scoring(max_new_tokens=6), show_progress=False)
    )
    assert cb.history[-1][1].forgotten_ids == final.forgotten_ids and final.forgotten > 0
    assert cb.history[-1][1].gained_ids == final.gained_ids


def test_adapter_disabled_base_is_scored_again_on_resume(toy, tmp_path):
    first = ForgetWatchCallback(toy.probes, eval_steps=4, base="adapter_disabled", scoring=Scoring(max_new_tokens=6))
    sft(toy, tmp_path, [first], save_strategy="steps", save_steps=8).train()
    # the resumed run finds no snapshot to trust: it scores the disabled-adapter model again
    (tmp_path / "forgetwatch" / "base_answers.npz").unlink()
    resumed = ForgetWatchCallback(toy.probes, eval_steps=4, base="adapter_disabled", scoring=Scoring(max_new_tokens=6))
    sft(toy, tmp_path, [resumed], save_strategy="steps", save_steps=8).train(
        resume_from_checkpoint=str(tmp_path / "checkpoint-8")
    )
    assert resumed.base_answers.correct.tolist() == first.base_answers.correct.tolist()
    assert [s for s, _ in resumed.history] == [4, 8, 12]
    for (_, a), (_, b) in zip(first.history, resumed.history):
        assert a.forgotten_ids == b.forgotten_ids


def test_adapter_disabled_needs_a_peft_model(toy, tmp_path):
    cb = ForgetWatchCallback(toy.probes, eval_steps=6, base="adapter_disabled")
    args = trl.SFTConfig(str(tmp_path), **{**COMMON, "max_steps": 2, "save_strategy": "no"})
    trainer = trl.SFTTrainer(
        model=copy.deepcopy(toy.base),
        args=args,
        processing_class=toy.tokenizer,
        train_dataset=datasets.Dataset.from_dict({"text": ["a b c"] * 16}),
        callbacks=[cb],
    )
    with pytest.raises(ValueError, match="needs a PEFT model"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_adapter_disabled_warns_when_base_weights_train(toy, tmp_path, caplog):
    model = peft.get_peft_model(copy.deepcopy(toy.base), lora_config())
    model.base_model.model.lm_head.weight.requires_grad_(True)
    from forgetwatch.run.base import adapters_disabled

    with caplog.at_level(logging.WARNING, logger="forgetwatch"), adapters_disabled(model):
        pass
    assert "outside the adapters are trained" in caplog.text and "lm_head" in caplog.text


def test_config_accepts_adapter_disabled(tmp_path):
    path = tmp_path / "fw.yaml"
    path.write_text("base: adapter_disabled\n")
    assert ForgetWatchConfig.from_yaml(path).base == "adapter_disabled"  # not made a path
    with pytest.raises(ConfigError, match="base"):
        ForgetWatchConfig(base="")


@pytest.mark.parametrize("loss", ["lm", "kl"])
def test_replay_trains_only_the_adapters_with_the_base_from_disabled_adapters(toy, tmp_path, loss):
    from forgetwatch import Output, ProbeSet, Replay, ReplayPool

    probes, rows = toy.world.replay_split()
    if loss == "kl":  # with prompts the base answers
        rows = rows + [
            {"id": f"p{i}", "prompt": f"Rivers counted in {c.name}:"} for i, c in enumerate(toy.world.known[:4])
        ]
    cb = ForgetWatchCallback(
        ProbeSet.from_records(probes),
        eval_steps=6,
        output=Output(verbose=False),
        base="adapter_disabled",
        replay=Replay(ReplayPool.from_records(rows, max_new_tokens=4), loss=loss, top_k=8),
    )
    trainer = sft(toy, tmp_path, [cb], init=loss == "lm")  # "kl": adapters that move the model from the start
    before = {k: v.clone() for k, v in trainer.model.named_parameters() if not v.requires_grad}
    trainer.train()
    losses = [e["forgetwatch/replay/loss"] for e in trainer.state.log_history if "forgetwatch/replay/loss" in e]
    assert len(losses) == 2 and all(x >= 0 for x in losses)
    for name, p in trainer.model.named_parameters():  # the frozen base stays frozen, replay or not
        if name in before:
            assert torch.equal(p, before[name]), name
    if loss == "kl":  # the base's distribution, from the model with its adapters disabled
        assert (tmp_path / "forgetwatch" / "replay_base.npz").is_file()
        # the answers and the base's distribution on the rows, as the plain base gives them
        from forgetwatch.replay.synthetic import answer_prompts

        replay = cb.replay
        prompts = replay.pool.prompt_ids(toy.tokenizer)
        answers = answer_prompts(toy.base, toy.tokenizer, replay.pool, prompts, Ranks(), 4)
        assert all(replay.encoded[i][replay.starts[i] :][: len(a.ids)] == list(a.ids) for i, a in answers.items())
        ids = list(replay.encoded)
        plain = base_distribution(
            toy.base,
            toy.tokenizer,
            ids,
            [replay.encoded[i] for i in ids],
            pad_id(toy.tokenizer),
            8,
            starts=[replay.starts.get(i, 1) for i in ids],
        )
        np.testing.assert_array_equal(replay.base.offsets, plain.offsets)
        np.testing.assert_allclose(
            np.exp(replay.base.top_logprobs.astype(np.float32)).sum(1),
            np.exp(plain.top_logprobs.astype(np.float32)).sum(1),
            atol=2e-3,
        )
