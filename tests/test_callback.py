"""ForgetWatchCallback inside a transformers Trainer: schedule, numbers, logs, stopping, resume."""

from __future__ import annotations

import copy
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from trainers import KillAt, make_trainer
from transformers import (
    DataCollatorForLanguageModeling,
    EarlyStoppingCallback,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from forgetwatch import Answers, AnswersMismatchError, Monitor, Output, ProbeError, ProbeSet, Scoring, compare, evaluate
from forgetwatch.config import ConfigError, ForgetWatchConfig
from forgetwatch.integrations.callback import ForgetWatchCallback

# trains models (or runs several processes, or a browser): pytest -m "not slow" leaves them out
pytestmark = pytest.mark.slow

CONTRACT = (
    "forgetting",
    "backward_transfer",
    "forgetting_adjusted",
    "backward_transfer_adjusted",
    "forgotten",
    "gained",
    "accuracy",
    "accuracy_base",
)


def test_history_steps_and_counts_equal_an_independent_recomputation(toy, train_data, tmp_path):
    seen = []
    cb = ForgetWatchCallback(toy.probes, eval_steps=10, sinks=[lambda r, s: seen.append((s, r.forgotten))])
    trainer = make_trainer(toy, train_data, tmp_path, [cb])
    trainer.train()
    assert [step for step, _ in cb.history] == [10, 20, 30]
    assert seen == [(step, r.forgotten) for step, r in cb.history]

    expected = compare(
        evaluate(toy.base, toy.tokenizer, toy.probes, show_progress=False),
        evaluate(trainer.model, toy.tokenizer, toy.probes, show_progress=False),
    )
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
    # every earlier run is kept whole, set aside, never overwritten
    assert len(list((tmp_path / "forgetwatch").glob("previous-*/history.jsonl"))) == 3


def test_base_answers_can_be_given(toy, train_data, tmp_path):
    base = evaluate(toy.base, toy.tokenizer, toy.probes, show_progress=False)
    path = tmp_path / "base.json"
    base.save(path)
    cb = ForgetWatchCallback(toy.probes, eval_steps=30, base=str(path))
    make_trainer(toy, train_data, tmp_path, [cb], save_strategy="steps", save_steps=10).train()
    assert cb.history[-1][1].accuracy_before == base.accuracy
    # kept with the run, so a resume finds it without base= again
    kept = Answers.load(tmp_path / "forgetwatch" / "base_answers.npz")
    assert kept.correct.tolist() == base.correct.tolist()
    resumed = ForgetWatchCallback(toy.probes, eval_steps=30)
    make_trainer(toy, train_data, tmp_path, [resumed]).train(resume_from_checkpoint=str(tmp_path / "checkpoint-20"))
    assert resumed.base_answers.correct.tolist() == base.correct.tolist()

    normalized = evaluate(toy.base, toy.tokenizer, toy.probes, scoring=Scoring(normalize="chars"), show_progress=False)
    with pytest.raises(AnswersMismatchError, match="normalize"):  # the option that differs
        make_trainer(toy, train_data, tmp_path, [ForgetWatchCallback(toy.probes, base=normalized)]).train()


@pytest.mark.parametrize("patience", [1, 2])
def test_early_stop_saves_a_checkpoint_and_says_why(toy, train_data, tmp_path, patience, capsys):
    cb = ForgetWatchCallback(toy.probes, eval_steps=5, max_forgetting=0.02, monitor=Monitor(patience=patience))
    trainer = make_trainer(toy, train_data, tmp_path, [cb], disable_tqdm=False)
    trainer.train()
    stop_step = 5 * patience
    assert trainer.state.global_step == stop_step
    assert (tmp_path / f"checkpoint-{stop_step}" / "trainer_state.json").is_file()
    record = json.loads((tmp_path / "forgetwatch" / "history.jsonl").read_text().splitlines()[-1])
    assert "forgetting" in record["stop"] and "> 2.00%" in record["stop"]
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "stopping training" in x)
    assert line.startswith(f"[forgetwatch] stopping training at step {stop_step}: forgetting ")  # a line of its own
    assert re.search(r"\d+\.\d\d% > 2\.00%", line)  # in percent
    assert f"saving checkpoint {tmp_path / f'checkpoint-{stop_step}'}" in line
    assert f"history {tmp_path / 'forgetwatch' / 'history.jsonl'}" in line
    assert f"'forgetwatch_stopped_at_step': {stop_step}" in out.split(line)[1]  # the trainer's summary says so
    assert cb.stop_reason.startswith(f"step {stop_step}: forgetting")


def test_eval_metrics_drive_best_model_and_transformers_early_stopping(toy, train_data, tmp_path):
    # forgetwatch listed first, as documented: EarlyStoppingCallback reads the metrics in list order
    stopper = EarlyStoppingCallback(early_stopping_patience=1)
    cb = ForgetWatchCallback(toy.probes, eval_steps=1000)
    trainer = make_trainer(
        toy,
        train_data,
        tmp_path,
        [cb, stopper],
        eval_strategy="steps",
        eval_steps=10,
        save_strategy="steps",
        save_steps=10,
        metric_for_best_model="forgetwatch_forgetting",
        greater_is_better=False,
        load_best_model_at_end=True,
    )
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
    cb = ForgetWatchCallback(toy.probes, eval_steps=7, monitor=Monitor(eval_on_train_end=False))
    make_trainer(toy, train_data, tmp_path, [cb], max_steps=30).train()
    assert [step for step, _ in cb.history] == [7, 14, 21, 28]


class ForwardClock:
    """A clock that ticks once per forward pass of the model it watches: training steps and
    scoring both cost time, counted the same way on any machine, however loaded."""

    def __init__(self, model):
        self.now = 0.0
        model.register_forward_hook(self._tick)

    def _tick(self, *_):
        self.now += 1.0

    def __call__(self):
        return self.now


def test_default_budget_schedule_evaluates_within_its_share(toy, train_data, tmp_path):
    model = copy.deepcopy(toy.base)
    clock = ForwardClock(model)
    cb = ForgetWatchCallback(toy.probes, clock=clock, monitor=Monitor(max_overhead=0.5))
    make_trainer(toy, train_data, tmp_path, [cb], model=model, max_steps=400).train()
    steps = [step for step, _ in cb.history]
    assert steps[-1] == 400 and len(steps) >= 3  # scheduled evaluations, then the end
    assert steps[:-1] == sorted(set(steps[:-1])) and steps[0] > 1
    # the whole run's monitoring, snapshot and final evaluation included, within its share
    # (up to the evaluations' own variation in cost: generation lengths change as weights do)
    assert cb.monitoring_seconds / clock() <= 0.5 * 1.1


def test_a_run_too_short_for_the_budget_says_so_at_once(toy, train_data, tmp_path, warned, caplog):
    model = copy.deepcopy(toy.base)
    cb = ForgetWatchCallback(toy.probes, clock=ForwardClock(model))  # max_overhead=0.05
    make_trainer(toy, train_data, tmp_path, [cb], model=model, max_steps=10).train()
    assert [step for step, _ in cb.history] == [10]  # the final evaluation only
    assert len(warned("(10 steps)", "max_overhead", "eval_steps")) == 1  # the run's length, the budget, the way out
    cb = ForgetWatchCallback(toy.probes, eval_steps=5)
    caplog.clear()
    make_trainer(toy, train_data, tmp_path, [cb], max_steps=10).train()
    assert warned("(10 steps)") == []


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
    trainer = make_trainer(
        toy,
        train_data,
        tmp_path,
        [cb],
        eval_strategy="steps",
        eval_steps=5,
        save_strategy="best",
        metric_for_best_model="forgetwatch_forgetting",
        greater_is_better=False,
    )
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


def test_a_failed_evaluation_after_training_is_a_warning_and_the_trainer_s_metrics_stay(
    toy, train_data, tmp_path, warned
):
    cb = ForgetWatchCallback(toy.probes, eval_steps=30)
    trainer = make_trainer(toy, train_data, tmp_path, [cb])
    trainer.train()
    with torch.no_grad():
        trainer.model.get_input_embeddings().weight.fill_(float("nan"))  # scoring these weights fails
    metrics = trainer.evaluate()
    assert "eval_loss" in metrics and not any("forgetwatch" in key for key in metrics)
    assert len(warned("no forgetwatch metrics for this evaluation")) == 1
    assert [step for step, _ in cb.history] == [30]


class NanAt(TrainerCallback):
    """The weights turn NaN once training reaches ``step`` (a diverged run), before forgetwatch looks."""

    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step == self.step:
            with torch.no_grad():
                model.get_input_embeddings().weight.fill_(float("nan"))


def test_a_model_gone_nan_is_a_warning_and_training_goes_on(toy, train_data, tmp_path, warned):
    cb = ForgetWatchCallback(toy.probes, eval_steps=2, output=Output(verbose=False))
    trainer = make_trainer(toy, train_data, tmp_path, [NanAt(3), cb], max_steps=6, eval_strategy="steps", eval_steps=5)
    trainer.train()  # no exception into the trainer
    assert trainer.state.global_step == 6 and [step for step, _ in cb.history] == [2]
    # each step's evaluation after, the trainer's at 5 and the end's: one warning each, naming its step
    assert [len(warned(f"step {step}:")) for step in range(1, 7)] == [0, 0, 0, 1, 1, 1]
    steps = [json.loads(line)["step"] for line in (tmp_path / "forgetwatch" / "history.jsonl").read_text().splitlines()]
    assert steps == [2]


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


def test_the_state_is_kept_in_trainer_state_json_and_a_checkpoint_without_it_resumes_from_the_files(
    toy, train_data, tmp_path, caplog
):
    common = dict(max_steps=20, save_strategy="steps", save_steps=10)
    stopping = dict(eval_steps=5, max_forgetting=0.05, monitor=Monitor(patience=4))  # over it from step 5 on
    whole = ForgetWatchCallback(toy.probes, **stopping)
    make_trainer(toy, train_data, tmp_path / "whole", [whole], **common).train()
    saved = json.loads((tmp_path / "whole" / "checkpoint-10" / "trainer_state.json").read_text())
    kept = saved["stateful_callbacks"]["ForgetWatch"]
    assert kept["step"] == 10 and kept["evaluations"] == 2 and kept["version"] == 3
    assert kept["streaks"] == {"overall": 2} and whole.watch.stop_step == 20  # the stop rule's, at step 10
    assert kept["base"]["weights_key"] == whole.base_answers.meta["weights_key"]

    run = tmp_path / "run"
    first = ForgetWatchCallback(toy.probes, **stopping)
    with pytest.raises(RuntimeError, match="killed"):
        make_trainer(toy, train_data, run, [first, KillAt(17)], **common).train()
    state = run / "checkpoint-10" / "trainer_state.json"
    saved = json.loads(state.read_text())
    del saved["stateful_callbacks"]["ForgetWatch"]  # as a checkpoint saved without forgetwatch
    state.write_text(json.dumps(saved))
    resumed = ForgetWatchCallback(toy.probes, **stopping)
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        make_trainer(toy, train_data, run, [resumed], **common).train(resume_from_checkpoint=str(run / "checkpoint-10"))
    assert caplog.text.count("resuming at step 10 without a forgetwatch state") == 1
    assert resumed.watch.stop_step == 20  # the streak counted again over the history cut at step 10
    assert [(s, r.forgotten_ids) for s, r in resumed.history] == [(s, r.forgotten_ids) for s, r in whole.history]
    again = json.loads((run / "checkpoint-20" / "trainer_state.json").read_text())["stateful_callbacks"]
    assert again["ForgetWatch"]["step"] == 20  # kept again from there on


@pytest.mark.parametrize("how", ["moved-checkpoint", "latest", "model-from-checkpoint", "new-output-folder"])
def test_resume_setups(toy, train_data, tmp_path, how):
    from transformers import AutoModelForCausalLM

    common = dict(max_steps=20, save_strategy="steps", save_steps=10)
    first = ForgetWatchCallback(toy.probes, eval_steps=5)
    with pytest.raises(RuntimeError, match="killed"):
        make_trainer(toy, train_data, tmp_path / "run", [first, KillAt(12)], **common).train()
    checkpoint, model, out = tmp_path / "run" / "checkpoint-10", None, tmp_path / "run"
    files = None
    if how == "moved-checkpoint":  # resumed elsewhere, from a copy of the checkpoint, the run's files named
        checkpoint = shutil.copytree(checkpoint, tmp_path / "elsewhere" / "checkpoint-10")
        out, files = tmp_path / "new-output", tmp_path / "run" / "forgetwatch"
    elif how == "model-from-checkpoint":  # loaded from the checkpoint: another _name_or_path
        model = AutoModelForCausalLM.from_pretrained(checkpoint)
    elif how == "new-output-folder":  # as ms-swift resumes: a new folder, the arguments naming the checkpoint
        out = tmp_path / "v1"
        common["resume_from_checkpoint"] = str(checkpoint)
    resumed = ForgetWatchCallback(toy.probes, eval_steps=5, output_dir=files)
    trainer = make_trainer(toy, train_data, out, [resumed], model=model, **common)
    trainer.train(resume_from_checkpoint=True if how == "latest" else str(checkpoint))
    assert [s for s, _ in resumed.history] == [5, 10, 15, 20]
    assert resumed.base_answers.correct.tolist() == first.base_answers.correct.tolist()
    assert (
        resumed.history[1][1].by_category["capitals"].forgotten_ids
        == first.history[1][1].by_category["capitals"].forgotten_ids
    )  # restored per category too


def test_resume_without_a_snapshot_fails_before_training(toy, train_data, tmp_path):
    make_trainer(toy, train_data, tmp_path, [], max_steps=10, save_strategy="steps", save_steps=10).train()
    with pytest.raises(FileNotFoundError, match="no base snapshot"):
        make_trainer(toy, train_data, tmp_path / "other", [ForgetWatchCallback(toy.probes)], max_steps=20).train(
            resume_from_checkpoint=str(tmp_path / "checkpoint-10")
        )


def test_construction_errors_come_before_any_training(toy, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "question": "q", "choices": ["x"], "answer": 0}\n')
    with pytest.raises(ProbeError) as info:
        ForgetWatchCallback(str(bad))
    assert [p[:3] for p in info.value.errors] == [(str(bad), 1, "choices")]
    with pytest.raises(TypeError, match="'eval_steps'"):  # the did-you-mean
        ForgetWatchCallback(toy.probes, eval_step=10)
    with pytest.raises(ValueError, match="probes"):
        ForgetWatchCallback()
    with pytest.raises(ConfigError) as info:  # the unknown category and the ones there are
        ForgetWatchCallback(toy.probes, monitor=Monitor(category_max_forgetting={"colours": 0.1}))
    assert [p.key for p in info.value.errors] == ["category_max_forgetting"]
    assert all(f"'{c}'" in info.value.errors[0].message for c in ("colours", "capitals", "colors", "rivers"))
    with pytest.raises(ConfigError) as info:
        ForgetWatchCallback(toy.probes, base="")
    assert [p.key for p in info.value.errors] == ["base"]
    with pytest.raises(TypeError, match="ProbeSet.from_records"):  # the way to make probes of it
        ForgetWatchCallback(42)


def test_probe_rows_and_the_constructors_keywords_over_a_yaml_file(toy, tmp_path):
    cb = ForgetWatchCallback(toy.probes.to_records(), eval_steps=10)
    assert cb.watch.probes.ids == toy.probes.ids
    path = tmp_path / "probes.jsonl"
    toy.probes.to_jsonl(path)
    (tmp_path / "fw.yaml").write_text(f"probes: {path.name}\neval_steps: 15\nmax_forgetting: 0.5\n")
    cb = ForgetWatchCallback.from_yaml(tmp_path / "fw.yaml", eval_steps=10, sinks=[print])
    assert (cb.config.eval_steps, cb.config.max_forgetting) == (10, 0.5)
    assert [hook.hook for hook in cb.watch._their_sinks] == [print]  # a function is a sink of its own


def test_a_callback_from_yaml_trains(toy, train_data, tmp_path):
    path = tmp_path / "probes.jsonl"
    toy.probes.to_jsonl(path)
    (tmp_path / "fw.yaml").write_text(f"probes: {path.name}\neval_steps: 15\nmax_forgetting: 0.9\n")
    cb = ForgetWatchCallback.from_yaml(tmp_path / "fw.yaml")
    assert cb.watch.probes.ids == toy.probes.ids and cb.config.eval_steps == 15
    make_trainer(toy, train_data, tmp_path, [cb]).train()
    assert [s for s, _ in cb.history] == [15, 30]


@pytest.mark.parametrize("name", ["multiple_choice_every_50_steps", "early_stop_adjusted_5pct", "gsm8k_generative"])
def test_shipped_configs_build_working_callbacks(toy, train_data, tmp_path, name):
    path = Path(__file__).resolve().parents[1] / "configs" / f"{name}.yaml"
    cb = ForgetWatchCallback.from_yaml(path, probes=toy.probes)  # probes given: the file's path is not read
    config = ForgetWatchConfig.from_yaml(path)
    assert cb.config.eval_steps == config.eval_steps and cb.config.scoring.stop == config.scoring.stop
    make_trainer(toy, train_data, tmp_path, [cb], max_steps=4).train()
    assert cb.history and cb.history[-1][0] == 4


def test_store_keys_and_history_survive_odd_parameters_and_crashes(toy, tmp_path):
    from forgetwatch.run.base import model_key, weights_key
    from forgetwatch.store.read import read_history
    from forgetwatch.store.write import RunStore

    with torch.device("meta"):  # offloaded / not yet materialised weights
        ghost = toy.world.model(toy.tokenizer)
    assert weights_key(ghost) != weights_key(toy.base)
    assert model_key(ghost) == model_key(toy.base)
    half = copy.deepcopy(toy.base).to(torch.bfloat16)
    assert model_key(half) == model_key(toy.base)  # the dtype it was loaded in is not the model

    store = RunStore(tmp_path)
    empty = {"n": 0, "forgotten": 0, "gained": 0, "kept": 0, "never": 0}
    store.append_history({"step": 1, "report": empty})
    store.append_history({"step": 2, "report": empty})
    with open(store.history_path, "a") as f:
        f.write('{"step": 3, "rep')  # a crash in the middle of a write
    assert [r["step"] for r in read_history(store.history_path)] == [1, 2]


def strict_json(text: str):
    def refuse(constant):
        raise AssertionError(f"{constant} in a JSON file")

    return json.loads(text, parse_constant=refuse)


def test_figures_that_do_not_apply_are_left_out_never_nan(toy, train_data, tmp_path):
    import math

    cb = ForgetWatchCallback(toy.probes, eval_steps=10)
    trainer = make_trainer(toy, train_data, tmp_path, [cb], save_strategy="steps", save_steps=10, max_steps=20)
    trainer.train()
    ours = [e for e in trainer.state.log_history if "forgetwatch/forgetting" in e]
    assert len(ours) == 2
    for entry in ours:
        assert all(math.isfinite(v) for v in entry.values() if isinstance(v, float))
        assert "forgetwatch/capitals/choice_kl" in entry  # multiple choice: drift applies
        assert "forgetwatch/rivers/choice_kl" not in entry  # generative only: it does not
        assert "forgetwatch/rivers/forgetting" in entry
    strict_json((tmp_path / "checkpoint-20" / "trainer_state.json").read_text())
    for line in (tmp_path / "forgetwatch" / "history.jsonl").read_text().splitlines():
        strict_json(line)


class Listener(TrainerCallback):
    def __init__(self):
        self.logged = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logged.append(dict(logs or {}))


def test_the_trainer_can_be_given_and_what_its_absence_misses_is_said_once(toy, train_data, tmp_path, caplog):
    listener = Listener()
    trainer = make_trainer(toy, train_data, tmp_path, [listener], max_steps=10)
    cb = ForgetWatchCallback(toy.probes, eval_steps=5, trainer=trainer)
    trainer.add_callback(cb)
    trainer.train()
    assert [e["forgetwatch/forgotten"] for e in listener.logged if "forgetwatch/forgotten" in e] == [
        r.forgotten for _, r in cb.history
    ]

    # driven by hand, no trainer given: the figures reach the log history, and what they miss is said
    from transformers import TrainerControl, TrainerState

    bare = ForgetWatchCallback(toy.probes, eval_steps=1)
    args, state, control = (
        TrainingArguments(str(tmp_path / "bare"), use_cpu=True, report_to=["mlflow"]),
        TrainerState(),
        TrainerControl(),
    )
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        bare.on_train_begin(args, state, control, model=toy.base, processing_class=toy.tokenizer)
        state.global_step = 1
        bare.on_step_end(args, state, control, model=toy.base)
    assert caplog.text.count("but not mlflow: for every reporting integration give the trainer") == 1
    assert [step for step, _ in bare.history] == [1] and state.log_history[-1]["step"] == 1


def test_hyperparameter_search_trials_keep_their_own_files_and_states(toy, train_data, tmp_path):
    pytest.importorskip("optuna")

    def model_init(trial=None):
        return copy.deepcopy(toy.base)

    def hp_space(trial):
        return {"learning_rate": trial.suggest_float("learning_rate", 1e-3, 3e-3)}

    trainer = Trainer(
        model_init=model_init,
        args=TrainingArguments(
            str(tmp_path),
            max_steps=10,
            per_device_train_batch_size=16,
            save_strategy="steps",
            save_steps=10,
            report_to=[],
            use_cpu=True,
            seed=0,
            disable_tqdm=True,
        ),
        train_dataset=train_data,
        eval_dataset=train_data.select(range(16)),
        data_collator=DataCollatorForLanguageModeling(toy.tokenizer, mlm=False),
        processing_class=toy.tokenizer,
    )
    cb = ForgetWatchCallback(toy.probes, eval_steps=5)
    trainer.add_callback(cb)
    trainer.hyperparameter_search(  # hp_name: transformers tells a callback the trial's folder by it
        backend="optuna",
        n_trials=2,
        hp_space=hp_space,
        hp_name=lambda trial: f"run-{trial.number}",
        compute_objective=lambda metrics: 0.0,
        direction="minimize",
    )
    runs = sorted(p.name for p in tmp_path.glob("run-*"))
    assert len(runs) == 2
    for run in runs:
        history = tmp_path / run / "forgetwatch" / "history.jsonl"
        assert [json.loads(x)["step"] for x in history.read_text().splitlines()] == [5, 10]
        kept = json.loads((tmp_path / run / "checkpoint-10" / "trainer_state.json").read_text())
        assert kept["stateful_callbacks"]["ForgetWatch"]["step"] == 10  # each trial's own state


class Outage(TrainerCallback):
    """An integration whose connection is gone for a while (it raises in on_log meanwhile)."""

    def __init__(self, steps):
        self.steps, self.failed = steps, 0

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.global_step in self.steps:
            self.failed += 1
            raise ConnectionError("the logging service is unreachable")


def test_a_failing_logger_is_a_warning_not_the_end_of_training(toy, train_data, tmp_path, caplog):
    outage = Outage(range(3, 9))
    trainer = make_trainer(toy, train_data, tmp_path, [outage], max_steps=10, logging_steps=1000)
    cb = ForgetWatchCallback(toy.probes, eval_steps=5, trainer=trainer)  # every integration: the outage too
    trainer.add_callback(cb)
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        trainer.train()
    assert trainer.state.global_step == 10 and [s for s, _ in cb.history] == [5, 10]
    assert outage.failed == 1 and "step 5 to the trainer's integrations failed" in caplog.text
    steps = [json.loads(x)["step"] for x in (tmp_path / "forgetwatch" / "history.jsonl").read_text().splitlines()]
    assert steps == [5, 10]


def test_a_base_file_with_probes_deleted_or_reordered_is_refused_before_training(toy, train_data, tmp_path):
    base = evaluate(toy.base, toy.tokenizer, toy.probes, show_progress=False)
    doc = base.to_dict()
    for name, samples in (("deleted", base.samples()[10:]), ("reordered", base.samples()[::-1])):
        # a whole, checksummed file of the same probe set: only its ids tell it apart
        path = tmp_path / f"{name}.json"
        Answers.from_samples(base.probe_fingerprint, base.scoring, samples, model=base.model).save(path)
        trainer = make_trainer(toy, train_data, tmp_path, [ForgetWatchCallback(toy.probes, base=str(path))])
        with pytest.raises(ValueError, match=rf"{name}\.json.*other probe ids"):
            trainer.train()
        assert trainer.state.global_step == 0
        # edited by hand (the checksum no longer fits): refused too, as edited
        path.write_text(json.dumps({**doc, "samples": doc["samples"][10:]}))
        with pytest.raises(ValueError, match=f"{name}.json"):
            make_trainer(toy, train_data, tmp_path, [ForgetWatchCallback(toy.probes, base=str(path))]).train()


class BlockHistory(TrainerCallback):
    """Puts a directory where the history file is (as a full disk would fail a write) for a
    while, then takes it away."""

    def __init__(self, path, block_at, free_at):
        self.path, self.block_at, self.free_at = path, block_at, free_at

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.block_at:
            self.path.unlink()
            self.path.mkdir()
        elif state.global_step == self.free_at:
            self.path.rmdir()


def test_a_history_write_that_fails_mid_run_is_a_warning_and_is_retried(toy, train_data, tmp_path, caplog):
    history = tmp_path / "forgetwatch" / "history.jsonl"
    cb = ForgetWatchCallback(toy.probes, eval_steps=5)
    trainer = make_trainer(
        toy,
        train_data,
        tmp_path,
        [BlockHistory(history, 7, 12), cb],
        max_steps=20,
        save_strategy="steps",
        save_steps=10,
    )
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        trainer.train()
    assert trainer.state.global_step == 20 and [s for s, _ in cb.history] == [5, 10, 15, 20]
    assert str(history) in caplog.text  # said loudly, naming the file
    # written again in full once the directory was gone
    assert [json.loads(x)["step"] for x in history.read_text().splitlines()] == [5, 10, 15, 20]


def test_many_categories_log_a_bounded_set_and_keep_all_in_the_history(toy, train_data, tmp_path, capsys):
    # one category per probe: 144 categories, each a dozen values per evaluation if all were logged
    probes = ProbeSet.from_records([{**r, "category": f"c{i:03d}"} for i, r in enumerate(toy.world.probe_records())])
    output = Output(min_logged_right=1, max_logged_categories=20)
    cb = ForgetWatchCallback(probes, eval_steps=10, output=output)
    trainer = make_trainer(toy, train_data, tmp_path, [cb], max_steps=20)
    trainer.train()
    notes = [line for line in capsys.readouterr().out.splitlines() if "not logged" in line]
    wrong = sum(not right for right in cb.watch.base_answers.correct)  # a probe wrong at the base: none right
    assert notes == [
        f"[forgetwatch] per-category figures are logged for 20 of 144 categories; not logged: {wrong} with "
        "fewer than 1 probes right at the base, too few to tell forgetting from zero (min_logged_right=1), "
        f"{124 - wrong} beyond the 20 largest (max_logged_categories=20); history.jsonl and the report keep all of them"
    ]
    logged = [e for e in trainer.state.log_history if "forgetwatch/forgetting" in e]
    assert len(logged) == 2
    for entry in logged:
        categories = {
            k.split("/")[1]
            for k in entry
            if k.count("/") >= 2 and not k.startswith(("forgetwatch/behaviour", "forgetwatch/drift"))
        }
        # equal sizes: the first 20 by name of those right at the base, every time
        right = [p.category for p, r in zip(probes, cb.watch.base_answers.correct) if r]
        assert categories == set(sorted(right)[:20])
    records = [json.loads(x) for x in (tmp_path / "forgetwatch" / "history.jsonl").read_text().splitlines()]
    assert all(len(r["report"]["by_category"]) == 144 for r in records)


# -- resuming from damaged, partial or lost files ------------------------------------------------


@pytest.fixture(scope="module")
def saved_run(toy, train_data, tmp_path_factory):
    """A run of 10 steps, evaluated at 5 and 10, saved at 10 (each test damages a copy of it)."""
    out = tmp_path_factory.mktemp("saved")
    make_trainer(
        toy,
        train_data,
        out,
        [ForgetWatchCallback(toy.probes, eval_steps=5, output=Output(verbose=False))],
        max_steps=10,
        save_strategy="steps",
        save_steps=10,
    ).train()
    return out


def resume_at_10(toy, train_data, run):
    """Resumed from checkpoint-10 for a step, not evaluated again: what the resume restored."""
    resumed = ForgetWatchCallback(
        toy.probes, eval_steps=5, output=Output(verbose=False), monitor=Monitor(eval_on_train_end=False)
    )
    make_trainer(toy, train_data, run, [resumed], max_steps=10).train(resume_from_checkpoint=str(run / "checkpoint-10"))
    return resumed


def cut_last_line(path):
    path.write_bytes(path.read_bytes()[:-20])


def damage_second_line(path):
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + "{garbage\n" + "".join(lines[1:]))


@pytest.mark.parametrize(
    "damage, steps, said",
    [
        # a cut last line: dropped, the rest serves
        ("cut", [5, 10], "dropping an incomplete last line"),
        # an unreadable line: the records before it serve, the file is kept aside
        ("line", [5], "line 2: not valid JSON"),
        # no history: said loudly
        ("gone", [], "holds 0 of the run's 2 evaluations"),
    ],
)
def test_a_resume_keeps_every_readable_record_and_overwrites_none(
    toy, train_data, saved_run, tmp_path, caplog, damage, steps, said
):
    run = shutil.copytree(saved_run, tmp_path / "run")
    ours = run / "forgetwatch" / "history.jsonl"
    if damage == "cut":
        ours.write_bytes(ours.read_bytes() + b'{"step": 15, "rep')
    elif damage == "line":
        damage_second_line(ours)
    else:
        ours.unlink()
    before = ours.read_bytes() if ours.exists() else None
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        resumed = resume_at_10(toy, train_data, run)
    assert said in caplog.text
    assert [s for s, _ in resumed.history] == steps
    assert [json.loads(x)["step"] for x in ours.read_text().splitlines()] == steps
    aside = run / "forgetwatch" / "history.jsonl.damaged-1"
    assert aside.exists() == (damage == "line")
    if damage == "line":  # never overwritten: kept, byte for byte, and named
        assert aside.read_bytes() == before and f"the file is kept as {aside}" in caplog.text


def test_a_run_directory_deleted_during_training_is_said_and_written_again(toy, train_data, tmp_path, caplog):
    class DeleteRunDir(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 12:
                shutil.rmtree(tmp_path / "forgetwatch")

    cb = ForgetWatchCallback(toy.probes, eval_steps=5, output=Output(verbose=False))
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        make_trainer(
            toy, train_data, tmp_path, [DeleteRunDir(), cb], max_steps=20, save_strategy="steps", save_steps=20
        ).train()
    assert caplog.text.count("disappeared from") == 1 and str(tmp_path / "forgetwatch") in caplog.text
    folder = tmp_path / "forgetwatch"
    assert [json.loads(x)["step"] for x in (folder / "history.jsonl").read_text().splitlines()] == [5, 10, 15, 20]
    assert Answers.load(folder / "base_answers.npz").correct.tolist() == cb.base_answers.correct.tolist()
    assert (folder / "probes.jsonl").is_file()
    resumed = ForgetWatchCallback(
        toy.probes, eval_steps=5, output=Output(verbose=False), monitor=Monitor(eval_on_train_end=False)
    )
    make_trainer(toy, train_data, tmp_path, [resumed], max_steps=20).train(
        resume_from_checkpoint=str(tmp_path / "checkpoint-20")
    )
    assert [s for s, _ in resumed.history] == [5, 10, 15, 20]


def test_a_run_killed_mid_write_resumes_as_the_uninterrupted_one(toy, train_data, tmp_path, caplog):
    """A real kill -9 of a training process in the middle of a forgetwatch write, after checkpoint-10."""
    tests = Path(__file__).resolve().parent
    run, data, probes = tmp_path / "run", tmp_path / "data", tmp_path / "probes.jsonl"
    train_data.save_to_disk(str(data))
    toy.probes.to_jsonl(probes)
    import forgetwatch  # the child runs the same forgetwatch as this test

    package = Path(forgetwatch.__file__).resolve().parents[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(package), str(tests)])}
    with open(tmp_path / "child.log", "w") as log:
        child = subprocess.Popen(
            [sys.executable, str(tests / "killed_mid_write.py"), toy.base_dir, str(data), str(probes), str(run)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        while not (run / "paused").exists():
            try:
                child.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                continue
            pytest.fail("the run ended before its write paused:\n" + (tmp_path / "child.log").read_text()[-3000:])
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    folder = run / "forgetwatch"
    left = list(folder.glob(".answers_latest.npz.*.tmp"))
    assert len(left) == 1  # the half-written file, as the kill left it
    assert [json.loads(x)["step"] for x in (folder / "history.jsonl").read_text().splitlines()] == [5, 10, 15]

    resumed = ForgetWatchCallback(toy.probes, eval_steps=5, output=Output(verbose=False))
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        make_trainer(toy, train_data, run, [resumed], max_steps=20, save_strategy="steps", save_steps=10).train(
            resume_from_checkpoint=str(run / "checkpoint-10")
        )
    lock = folder / "watch.lock"  # the killed process's, taken over
    assert f"taking over {lock}, left by process {child.pid}, which has ended" in caplog.text
    assert not left[0].exists()  # cleaned when training began
    whole = ForgetWatchCallback(toy.probes, eval_steps=5, output=Output(verbose=False))
    make_trainer(toy, train_data, tmp_path / "whole", [whole], max_steps=20).train()
    assert [(s, r.forgotten_ids, r.gained_ids) for s, r in resumed.history] == [
        (s, r.forgotten_ids, r.gained_ids) for s, r in whole.history
    ]  # step 15 of the killed run was cut from the history, then measured again
    assert [json.loads(x)["step"] for x in (folder / "history.jsonl").read_text().splitlines()] == [5, 10, 15, 20]
