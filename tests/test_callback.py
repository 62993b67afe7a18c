"""ForgetWatchCallback inside a transformers Trainer: schedule, numbers, logs, stopping, resume."""

from __future__ import annotations

import copy
import json
import logging

import pytest
import torch
from transformers import DataCollatorForLanguageModeling, EarlyStoppingCallback, Trainer, TrainerCallback, TrainingArguments

from forgetwatch import Answers, compare, evaluate
from forgetwatch.callback import ForgetWatchCallback
from forgetwatch.config import ForgetWatchConfig

CONTRACT = ("forgetting", "backward_transfer", "forgetting_adjusted", "backward_transfer_adjusted",
            "forgotten", "gained", "accuracy", "accuracy_base")


@pytest.fixture(scope="module")
def train_data(toy):
    from datasets import Dataset

    texts = toy.world.distraction_texts()
    return Dataset.from_dict({"text": texts}).map(
        lambda b: toy.tokenizer(b["text"]), batched=True, remove_columns=["text"])


def make_trainer(toy, train_data, tmp_path, callbacks, model=None, **overrides):
    settings = dict(max_steps=30, per_device_train_batch_size=16, learning_rate=3e-3, logging_steps=5,
                    report_to=[], save_strategy="no", use_cpu=True, seed=0, disable_tqdm=True)
    settings.update(overrides)
    return Trainer(model=model if model is not None else copy.deepcopy(toy.base),
                   args=TrainingArguments(str(tmp_path), **settings), train_dataset=train_data,
                   eval_dataset=train_data.select(range(32)),
                   data_collator=DataCollatorForLanguageModeling(toy.tokenizer, mlm=False),
                   processing_class=toy.tokenizer, callbacks=callbacks)


def test_history_steps_and_counts_equal_an_independent_recomputation(toy, train_data, tmp_path):
    seen = []
    cb = ForgetWatchCallback(toy.probes, eval_steps=10, on_forgetting=lambda r, s: seen.append((s, r.forgotten)))
    trainer = make_trainer(toy, train_data, tmp_path, [cb])
    trainer.train()
    assert [step for step, _ in cb.history] == [10, 20, 30]
    assert seen == [(step, r.forgotten) for step, r in cb.history]

    expected = compare(evaluate(toy.base, toy.tokenizer, toy.probes, show_progress=False),
                       evaluate(trainer.model, toy.tokenizer, toy.probes, show_progress=False))
    final = cb.history[-1][1]
    for name in ("forgotten", "gained", "kept", "never", "forgotten_ids", "gained_ids"):
        assert getattr(final, name) == getattr(expected, name), name
    assert final.forgotten > 0  # training on arithmetic made it forget some facts

    # history.jsonl: one line per evaluation, with ids and per-category figures
    lines = [json.loads(x) for x in (tmp_path / "forgetwatch" / "history.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [10, 20, 30]
    assert lines[-1]["report"]["forgotten_ids"] == final.forgotten_ids
    assert set(lines[-1]["report"]["by_category"]) == {"capitals", "colors", "rivers"}
    assert Answers.load(tmp_path / "forgetwatch" / "base_answers.npz").ids == toy.probes.ids


def test_metrics_reach_the_log_history_at_their_step_without_disturbing_the_trainer(toy, train_data, tmp_path):
    cb = ForgetWatchCallback(toy.probes, eval_steps=10)
    trainer = make_trainer(toy, train_data, tmp_path, [cb])
    trainer.train()
    ours = [e for e in trainer.state.log_history if "forgetwatch/forgetting" in e]
    assert [e["step"] for e in ours] == [10, 20, 30]
    for entry, (_, report) in zip(ours, cb.history):
        for name in CONTRACT:
            assert f"forgetwatch/{name}" in entry
        assert entry["forgetwatch/forgotten"] == report.forgotten
        assert entry["forgetwatch/colors/forgetting"] == report.by_category["colors"].forgetting
    losses = [e["step"] for e in trainer.state.log_history if "loss" in e]
    assert losses == [5, 10, 15, 20, 25, 30]  # the trainer's own lines, every logging step


def test_snapshot_is_cached_and_never_reused_for_other_probes(toy, train_data, tmp_path, caplog):
    first = ForgetWatchCallback(toy.probes, eval_steps=30)
    make_trainer(toy, train_data, tmp_path, [first]).train()
    snapshot = (tmp_path / "forgetwatch" / "base_answers.npz").stat().st_mtime_ns

    with caplog.at_level(logging.INFO, logger="forgetwatch"):
        again = ForgetWatchCallback(toy.probes, eval_steps=30)
        make_trainer(toy, train_data, tmp_path, [again]).train()
    assert "reusing the base snapshot" in caplog.text
    assert (tmp_path / "forgetwatch" / "base_answers.npz").stat().st_mtime_ns == snapshot
    assert again.base_answers.correct.tolist() == first.base_answers.correct.tolist()

    caplog.clear()
    fewer = toy.probes.sample(30, seed=1)
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        other = ForgetWatchCallback(fewer, eval_steps=30)
        make_trainer(toy, train_data, tmp_path, [other]).train()
    assert "another probe set" in caplog.text
    assert other.base_answers.ids == fewer.ids

    caplog.clear()
    moved = copy.deepcopy(toy.base)
    with torch.no_grad():
        moved.lm_head.weight.mul_(1.01)  # same name and config, other weights
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        make_trainer(toy, train_data, tmp_path, [ForgetWatchCallback(fewer, eval_steps=30)], model=moved).train()
    assert "other weights" in caplog.text
    # an earlier run's history is kept, renamed, not overwritten
    assert len(list((tmp_path / "forgetwatch").glob("history-*.jsonl"))) >= 1


def test_base_answers_can_be_given(toy, train_data, tmp_path):
    base = evaluate(toy.base, toy.tokenizer, toy.probes, show_progress=False)
    path = tmp_path / "base.json"
    base.save(path)
    cb = ForgetWatchCallback(toy.probes, eval_steps=30, base=str(path))
    make_trainer(toy, train_data, tmp_path, [cb], save_strategy="steps", save_steps=10).train()
    assert cb.history[-1][1].accuracy_before == base.accuracy
    # kept with the run and its checkpoints, so a resume finds it without base= again
    kept = Answers.load(tmp_path / "checkpoint-20" / "forgetwatch" / "base_answers.npz")
    assert kept.correct.tolist() == base.correct.tolist()
    resumed = ForgetWatchCallback(toy.probes, eval_steps=30)
    make_trainer(toy, train_data, tmp_path, [resumed]).train(resume_from_checkpoint=str(tmp_path / "checkpoint-20"))
    assert resumed.base_answers.correct.tolist() == base.correct.tolist()

    normalized = evaluate(toy.base, toy.tokenizer, toy.probes, normalize="chars", show_progress=False)
    with pytest.raises(ValueError, match="other scoring options"):
        make_trainer(toy, train_data, tmp_path, [ForgetWatchCallback(toy.probes, base=normalized)]).train()


@pytest.mark.parametrize("patience", [1, 2])
def test_early_stop_saves_a_checkpoint_and_says_why(toy, train_data, tmp_path, patience, caplog):
    cb = ForgetWatchCallback(toy.probes, eval_steps=5, max_forgetting=0.02, patience=patience)
    trainer = make_trainer(toy, train_data, tmp_path, [cb])
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        trainer.train()
    stop_step = 5 * patience
    assert trainer.state.global_step == stop_step
    assert (tmp_path / f"checkpoint-{stop_step}" / "forgetwatch" / "history.jsonl").is_file()
    record = json.loads((tmp_path / "forgetwatch" / "history.jsonl").read_text().splitlines()[-1])
    assert "forgetting" in record["stop"] and "> 0.0200" in record["stop"]
    assert f"stopping training at step {stop_step}" in caplog.text
    assert cb.stop_reason.startswith(f"step {stop_step}: forgetting")


def test_eval_metrics_drive_best_model_and_transformers_early_stopping(toy, train_data, tmp_path):
    # EarlyStoppingCallback first in the list: forgetwatch must still run before it reads metrics
    stopper = EarlyStoppingCallback(early_stopping_patience=1)
    cb = ForgetWatchCallback(toy.probes, eval_steps=1000)
    trainer = make_trainer(toy, train_data, tmp_path, [stopper, cb], eval_strategy="steps", eval_steps=10,
                           save_strategy="steps", save_steps=10, metric_for_best_model="forgetwatch_forgetting",
                           greater_is_better=False, load_best_model_at_end=True)
    trainer.train()
    evals = [e for e in trainer.state.log_history if "eval_forgetwatch_forgetting" in e]
    assert [e["step"] for e in evals] == [10, 20]  # forgetting grew at 20: patience 1 stopped it
    assert trainer.state.global_step == 20
    assert trainer.state.best_metric == evals[0]["eval_forgetwatch_forgetting"]
    assert trainer.state.best_model_checkpoint.endswith("checkpoint-10")
    assert [step for step, _ in cb.history] == [10, 20]


def test_train_end_is_evaluated_once(toy, train_data, tmp_path):
    cb = ForgetWatchCallback(toy.probes, eval_steps=7)
    make_trainer(toy, train_data, tmp_path, [cb], max_steps=30).train()
    assert [step for step, _ in cb.history] == [7, 14, 21, 28, 30]
    make_trainer(toy, train_data, tmp_path, [cb], max_steps=14).train()  # the same callback, a new run
    assert [step for step, _ in cb.history] == [7, 14]
    cb = ForgetWatchCallback(toy.probes, eval_steps=7, eval_on_train_end=False)
    make_trainer(toy, train_data, tmp_path, [cb], max_steps=30).train()
    assert [step for step, _ in cb.history] == [7, 14, 21, 28]


def test_default_budget_schedule_evaluates_within_its_share(toy, train_data, tmp_path):
    import time

    cb = ForgetWatchCallback(toy.probes, max_overhead=0.5)
    trainer = make_trainer(toy, train_data, tmp_path, [cb], max_steps=60)
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    steps = [step for step, _ in cb.history]
    assert steps[-1] == 60 and len(steps) >= 2  # some scheduled evaluations, then the end
    assert cb.monitoring_seconds / wall <= 0.5 + 0.1  # the share, up to timing noise


class StopAt(TrainerCallback):
    """Another callback ending training, after forgetwatch in the list."""

    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


def test_train_end_is_evaluated_whoever_stops_training(toy, train_data, tmp_path):
    cb = ForgetWatchCallback(toy.probes, eval_steps=5)
    trainer = make_trainer(toy, train_data, tmp_path, [cb, StopAt(12)])
    trainer.train()
    assert [step for step, _ in cb.history] == [5, 10, 12]
    ours = [e for e in trainer.state.log_history if "forgetwatch/forgetting" in e]
    assert [e["step"] for e in ours] == [5, 10, 12]
    # logged before the trainer's final summary, while integrations are still open
    summary = next(i for i, e in enumerate(trainer.state.log_history) if "train_runtime" in e)
    assert trainer.state.log_history.index(ours[-1]) < summary


def test_a_stop_is_saved_even_with_save_strategy_best(toy, train_data, tmp_path):
    cb = ForgetWatchCallback(toy.probes, eval_steps=1000, max_forgetting=0.02)
    trainer = make_trainer(toy, train_data, tmp_path, [cb], eval_strategy="steps", eval_steps=5,
                           save_strategy="best", metric_for_best_model="forgetwatch_forgetting",
                           greater_is_better=False)
    trainer.train()
    step = trainer.state.global_step
    assert cb.stop_reason and step < 30
    assert (tmp_path / f"checkpoint-{step}").is_dir()


def test_evaluation_after_training_scores_the_current_weights(toy, train_data, tmp_path):
    cb = ForgetWatchCallback(toy.probes, eval_steps=30)
    trainer = make_trainer(toy, train_data, tmp_path, [cb])
    trainer.train()
    assert cb.history[-1][1].forgotten > 0
    trainer.model.load_state_dict(toy.base.state_dict())  # as if the best (here: first) model were loaded
    metrics = trainer.evaluate()
    assert metrics["eval_forgetwatch_forgotten"] == 0 and metrics["eval_forgetwatch_gained"] == 0
    assert [step for step, _ in cb.history] == [30]  # not part of the run's history


class KillAt(TrainerCallback):
    """Simulates a crash: raises once training reaches ``step``."""

    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise RuntimeError("killed")


def test_resume_reuses_the_base_snapshot_and_matches_an_uninterrupted_run(toy, train_data, tmp_path):
    common = dict(max_steps=30, save_strategy="steps", save_steps=10)
    whole = ForgetWatchCallback(toy.probes, eval_steps=5)
    make_trainer(toy, train_data, tmp_path / "whole", [whole], **common).train()

    run = tmp_path / "killed"
    first = ForgetWatchCallback(toy.probes, eval_steps=5)
    with pytest.raises(RuntimeError, match="killed"):
        make_trainer(toy, train_data, run, [first, KillAt(27)], **common).train()
    assert [s for s, _ in first.history] == [5, 10, 15, 20, 25]  # 25 is past checkpoint-20

    # the trainer loads checkpoint-20's weights before training begins: not the base, so the
    # snapshot must come from disk
    resumed = ForgetWatchCallback(toy.probes, eval_steps=5)
    trainer = make_trainer(toy, train_data, run, [resumed], **common)
    trainer.train(resume_from_checkpoint=str(run / "checkpoint-20"))
    assert resumed.base_answers.correct.tolist() == whole.base_answers.correct.tolist()
    assert [s for s, _ in resumed.history] == [5, 10, 15, 20, 25, 30]
    for (s1, r1), (s2, r2) in zip(whole.history, resumed.history):
        assert (s1, r1.forgotten, r1.gained, r1.forgotten_ids) == (s2, r2.forgotten, r2.gained, r2.forgotten_ids)
    steps = [json.loads(x)["step"] for x in (run / "forgetwatch" / "history.jsonl").read_text().splitlines()]
    assert steps == [5, 10, 15, 20, 25, 30]  # the killed run's step 25 was dropped, then redone


@pytest.mark.parametrize("how", ["moved-checkpoint", "latest", "model-from-checkpoint"])
def test_resume_setups(toy, train_data, tmp_path, how):
    import shutil

    from transformers import AutoModelForCausalLM

    common = dict(max_steps=20, save_strategy="steps", save_steps=10)
    first = ForgetWatchCallback(toy.probes, eval_steps=5)
    with pytest.raises(RuntimeError, match="killed"):
        make_trainer(toy, train_data, tmp_path / "run", [first, KillAt(12)], **common).train()
    checkpoint, model, out = tmp_path / "run" / "checkpoint-10", None, tmp_path / "run"
    if how == "moved-checkpoint":  # resumed elsewhere, from a copy of the checkpoint
        checkpoint = shutil.copytree(checkpoint, tmp_path / "elsewhere" / "checkpoint-10")
        out = tmp_path / "new-output"
    elif how == "model-from-checkpoint":  # loaded from the checkpoint: another _name_or_path
        model = AutoModelForCausalLM.from_pretrained(checkpoint)
    resumed = ForgetWatchCallback(toy.probes, eval_steps=5)
    trainer = make_trainer(toy, train_data, out, [resumed], model=model, **common)
    trainer.train(resume_from_checkpoint=True if how == "latest" else str(checkpoint))
    assert [s for s, _ in resumed.history] == [5, 10, 15, 20]
    assert resumed.base_answers.correct.tolist() == first.base_answers.correct.tolist()
    assert resumed.history[1][1].by_category["capitals"].forgotten_ids == \
        first.history[1][1].by_category["capitals"].forgotten_ids  # restored per category too


def test_resume_without_a_snapshot_fails_before_training(toy, train_data, tmp_path):
    make_trainer(toy, train_data, tmp_path, [], max_steps=10, save_strategy="steps", save_steps=10).train()
    with pytest.raises(FileNotFoundError, match="no base snapshot"):
        make_trainer(toy, train_data, tmp_path / "other", [ForgetWatchCallback(toy.probes)],
                     max_steps=20).train(resume_from_checkpoint=str(tmp_path / "checkpoint-10"))


def test_construction_errors_come_before_any_training(toy, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "question": "q", "choices": ["x"], "answer": 0}\n')
    with pytest.raises(ValueError, match="line 1: field 'choices'"):
        ForgetWatchCallback(str(bad))
    with pytest.raises(ValueError, match="did you mean 'eval_steps'"):
        ForgetWatchCallback(toy.probes, eval_step=10)
    with pytest.raises(ValueError, match="needs probes"):
        ForgetWatchCallback()


def test_from_config_and_yaml(toy, train_data, tmp_path):
    path = tmp_path / "probes.jsonl"
    toy.probes.to_jsonl(path)
    (tmp_path / "fw.yaml").write_text(f"forgetwatch:\n  probes: {path.name}\n  eval_steps: 15\n  max_forgetting: 0.9\n")
    cb = ForgetWatchCallback.from_yaml(tmp_path / "fw.yaml")
    assert cb.probes.ids == toy.probes.ids and cb.config.eval_steps == 15
    make_trainer(toy, train_data, tmp_path, [cb]).train()
    assert [s for s, _ in cb.history] == [15, 30]
    cb = ForgetWatchCallback.from_config(ForgetWatchConfig(eval_steps=10), probes=toy.probes)
    assert cb.config.eval_steps == 10


@pytest.mark.parametrize("name", ["multiple_choice_every_50_steps", "early_stop_adjusted_5pct", "gsm8k_generative"])
def test_shipped_configs_build_working_callbacks(toy, train_data, tmp_path, name):
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "configs" / f"{name}.yaml"
    cb = ForgetWatchCallback.from_yaml(path, probes=toy.probes)  # probes given: the file's path is not read
    config = ForgetWatchConfig.from_yaml(path)
    assert cb.config.eval_steps == config.eval_steps and cb.config.stop == config.stop
    make_trainer(toy, train_data, tmp_path, [cb], max_steps=4).train()
    assert cb.history and cb.history[-1][0] == 4


def test_store_keys_and_history_survive_odd_parameters_and_crashes(toy, tmp_path):
    from forgetwatch.base import model_key, weights_key
    from forgetwatch.store import RunStore

    with torch.device("meta"):  # offloaded / not yet materialised weights
        ghost = toy.world.model(toy.tokenizer)
    assert weights_key(ghost) != weights_key(toy.base)
    assert model_key(ghost) == model_key(toy.base)
    half = copy.deepcopy(toy.base).to(torch.bfloat16)
    assert model_key(half) == model_key(toy.base)  # the dtype it was loaded in is not the model

    store = RunStore(tmp_path)
    store.append_history({"step": 1, "report": {}})
    store.append_history({"step": 2, "report": {}})
    with open(store.history_path, "a") as f:
        f.write('{"step": 3, "rep')  # a crash in the middle of a write
    assert [r["step"] for r in store.load_history()] == [1, 2]
