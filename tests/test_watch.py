"""Watch without a trainer: sinks of the user's (a failing, a mutating and a blocking one),
steps, state_dict / load_state_dict, one watch per directory and an earlier run's files set aside,
a model whose embeddings do not cover the tokenizer, the settings as groups and the keywords of
earlier releases."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import json
import logging
import os
import socket
import threading

import numpy as np
import pytest
import torch

from forgetwatch import Answers, Evaluation, Monitor, Output, ProbeSet, Scoring, Watch, compare, evaluate
from forgetwatch.config import ConfigError, from_flat_keys
from forgetwatch.integrations.callback import ForgetWatchCallback
from forgetwatch.results.noise import smallest_detectable
from forgetwatch.scoring import NonFiniteScoresError
from forgetwatch.sinks.logged import logged_categories, metric_values
from forgetwatch.store import LOCK
from forgetwatch.store.read import load_trajectory, read_history
from forgetwatch.store.write import NotWritableError

QUIET = Output(verbose=False)


class Recorder:
    """A sink written here: keeps what it is told."""

    def __init__(self):
        self.base, self.evaluations, self.ended = None, [], None

    def on_base(self, snapshot):
        self.base = snapshot

    def on_evaluation(self, evaluation):
        self.evaluations.append(evaluation)

    def on_end(self, trajectory):
        self.ended = trajectory


class Broken:
    def on_evaluation(self, evaluation):
        raise OSError("disk full")


def test_a_users_sink_hears_the_base_every_evaluation_and_the_end(toy, tmp_path):
    sink = Recorder()
    watch = Watch(toy.probes, output_dir=tmp_path, eval_steps=2, sinks=[sink], output=QUIET)
    watch.start(toy.base, toy.tokenizer)
    assert (
        sink.base.computed
        and sink.base.answers.correct.tolist() == evaluate(toy.base, toy.tokenizer, toy.probes).correct.tolist()
    )
    assert [watch.due(s) for s in (1, 2, 3)] == [False, True, False]
    watch.evaluate(toy.tuned, 2)
    watch.evaluate(toy.base, 4)
    assert watch.finish(toy.tuned, 5).step == 5  # the end's own evaluation
    assert [e.step for e in sink.evaluations] == [2, 4, 5] and sink.ended.steps.tolist() == [0, 2, 4, 5]
    base = evaluate(toy.base, toy.tokenizer, toy.probes)
    expected = compare(base, evaluate(toy.tuned, toy.tokenizer, toy.probes))
    first = sink.evaluations[0]
    assert isinstance(first, Evaluation) and first.stop is None and first.trigger == "schedule"
    assert (first.report.forgotten_ids, first.report.gained_ids) == (expected.forgotten_ids, expected.gained_ids)
    assert first.metrics["forgetwatch/forgotten"] == expected.forgotten > 0
    assert sink.evaluations[1].report.forgotten == 0  # the base against itself
    assert watch.finish(toy.tuned, 6) is None  # once per run


def test_a_failing_sink_warns_and_the_others_go_on(toy, tmp_path, warned):
    sink = Recorder()
    watch = Watch(toy.probes, output_dir=tmp_path, eval_steps=2, sinks=[Broken(), sink], output=QUIET)
    watch.start(toy.base, toy.tokenizer)
    watch.evaluate(toy.tuned, 2)
    watch.evaluate(toy.tuned, 4)
    assert len(warned("Broken", "on_evaluation", "OSError", "disk full")) == 2
    assert [e.step for e in sink.evaluations] == [2, 4]
    steps = [json.loads(line)["step"] for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert steps == [2, 4]


def test_nan_outputs_are_an_error_when_scoring_and_a_skipped_evaluation_while_training(toy, tmp_path, warned):
    broken = copy.deepcopy(toy.tuned)
    with torch.no_grad():
        broken.get_input_embeddings().weight.fill_(float("nan"))
    with pytest.raises(NonFiniteScoresError):
        evaluate(broken, toy.tokenizer, toy.probes)
    with pytest.raises(NonFiniteScoresError):  # a base that cannot be scored: before any training
        Watch(toy.probes, output_dir=tmp_path / "nan-base", eval_steps=2, output=QUIET).start(broken, toy.tokenizer)

    sink = Recorder()
    watch = Watch(toy.probes, output_dir=tmp_path, eval_steps=2, sinks=[sink], output=QUIET)
    watch.start(toy.base, toy.tokenizer)
    assert watch.evaluate(broken, 2) is None  # no exception into the training loop
    assert len(warned("step 2")) == 1
    assert watch.evaluate(toy.tuned, 4).step == 4  # the next one is made as usual
    assert [e.step for e in sink.evaluations] == [4] and watch.trajectory.steps.tolist() == [0, 4]
    steps = [json.loads(line)["step"] for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert steps == [4] and [step for step, _ in watch.history] == [4]


def test_a_loop_resumes_exactly_from_its_state_dict(toy, tmp_path):
    first = Watch(toy.probes, output_dir=tmp_path, eval_steps=2, max_forgetting=0.5, output=QUIET)
    first.start(toy.base, toy.tokenizer)
    first.due(2) and first.evaluate(toy.tuned, 2)
    first.due(3)
    kept = json.loads(json.dumps(first.state_dict()))  # JSON-ready
    assert kept["step"] == 3
    first.due(4) and first.evaluate(toy.base, 4)  # ran on past the checkpoint, then was killed

    again = Watch(toy.probes, output_dir=tmp_path, eval_steps=2, max_forgetting=0.5, output=QUIET)
    again.load_state_dict(kept)
    snapshot = again.start(toy.tuned, toy.tokenizer)  # the base is the kept snapshot, not this model
    assert not snapshot.computed and again.base_answers.correct.tolist() == first.base_answers.correct.tolist()
    assert [s for s, _ in again.history] == [2]  # what came after step 3 is not this run's
    again.due(4) and again.evaluate(toy.base, 4)
    assert [r.forgotten_ids for _, r in again.history] == [r.forgotten_ids for _, r in first.history]
    first.evaluate(toy.base, 6)  # the killed loop's watch: the resumed one took the folder over
    assert [r["step"] for r in read_history(tmp_path / "history.jsonl")] == [2, 4]


def test_patience_counts_the_evaluations_made_before_a_resume(toy, tmp_path):
    base = evaluate(toy.base, toy.tokenizer, toy.probes)
    reports = compare(base, evaluate(toy.tuned, toy.tokenizer, toy.probes)).by_category
    category = next(c for c, r in reports.items() if r.forgotten)
    stopping = dict(max_forgetting=0.0, monitor=Monitor(category_max_forgetting={category: 0.0}, patience=2))
    first = Watch(toy.probes, output_dir=tmp_path, eval_steps=2, **stopping, output=QUIET)
    first.start(toy.base, toy.tokenizer)
    assert first.evaluate(toy.tuned, 2).stop is None  # over once: patience waits
    first.due(3)
    again = Watch(toy.probes, output_dir=tmp_path, eval_steps=2, **stopping, output=QUIET)
    again.load_state_dict(first.state_dict())
    again.start(toy.tuned, toy.tokenizer)
    stop = again.evaluate(toy.tuned, 4).stop  # the second time over, counting the history read back
    assert stop.count("for 2 consecutive evaluations") == 2 and f"in category {category!r}" in stop
    assert again.stop_step == 4 and read_history(tmp_path / "history.jsonl")[-1]["stop"] == stop


class FailsOnce:
    """A kept plug-in whose figures cannot be read the first time."""

    name, files = "fails_once", ()

    def __init__(self):
        self.failed = False

    def metrics(self):
        if not self.failed:
            self.failed = True
            raise RuntimeError("injected")
        return {"fails_once/calls": 1.0}

    def state(self):
        return {"failed": self.failed}


def test_an_evaluation_that_fails_part_way_keeps_nothing_and_its_step_can_be_evaluated_again(toy, tmp_path):
    sink = Recorder()
    watch = Watch(toy.probes, output_dir=tmp_path, eval_steps=2, sinks=[sink], output=QUIET)
    watch.keep(FailsOnce())
    watch.start(toy.base, toy.tokenizer)
    with pytest.raises(RuntimeError, match="injected"):
        watch.evaluate(toy.tuned, 2)
    assert watch.history == [] and watch.trajectory.steps.tolist() == [0] and not sink.evaluations
    assert read_history(tmp_path / "history.jsonl") == []
    evaluation = watch.evaluate(toy.tuned, 2)
    assert watch.trajectory.steps.tolist() == [0, 2] and [s for s, _ in watch.history] == [2]
    # the repair's figures and state: logged, and kept in the history under its name
    assert evaluation.metrics["forgetwatch/fails_once/calls"] == 1.0
    assert read_history(tmp_path / "history.jsonl")[-1]["fails_once"] == {"fails_once/calls": 1.0, "failed": True}


@pytest.mark.parametrize(
    "state, field",
    [
        ({"format": "other", "version": 3, "step": 2, "plugins": {}}, "format"),
        ({"format": "forgetwatch.watch", "version": 3, "step": -1, "plugins": {}}, "step"),
        ({"format": "forgetwatch.watch", "version": 3, "step": 2, "plugins": {"replay": {"weight": 1.0}}}, "plugins"),
        ({"format": "forgetwatch.watch", "version": 3, "step": 2, "plugins": ["replay"]}, "plugins"),
        ({"format": "forgetwatch.watch", "version": 3, "step": float("nan"), "plugins": {}}, "step"),
        ({"format": "forgetwatch.watch", "version": 3, "step": 2, "streaks": {"all": True}}, "streaks.all"),
        ({"format": "forgetwatch.watch", "version": 3, "step": 2, "schedule": {"next": "4"}}, "schedule.next"),
        ({"format": "forgetwatch.watch", "version": 2, "step": 2, "repair": None}, "version"),
        ({"format": "forgetwatch.watch", "version": True, "step": 2, "plugins": {}}, "version"),
        ({"format": "forgetwatch.watch", "step": 2, "plugins": {}}, "version"),
    ],
)
def test_a_state_that_is_not_a_watchs_is_refused_naming_the_field(toy, state, field):
    with pytest.raises(ValueError, match=f"field '{field}'"):
        Watch(toy.probes, output_dir="unused").load_state_dict(state)


def test_what_a_watch_needs_is_said_before_any_work(toy, tmp_path):
    with pytest.raises(RuntimeError, match="Watch.start"):
        Watch(toy.probes, output_dir=tmp_path).evaluate(toy.base, 1)
    with pytest.raises(ValueError, match="output_dir="):
        Watch(toy.probes).start(toy.base, toy.tokenizer)


def test_settings_come_as_groups_and_a_flat_keyword_names_its_group(toy):
    grouped = Watch(toy.probes, eval_steps=7, output_dir="x", scoring=Scoring(batch_size=4))
    assert (grouped.config.eval_steps, grouped.config.scoring.batch_size) == (7, 4)
    # the group the keyword belongs in, and the did-you-mean, are the message's point
    with pytest.raises(TypeError, match=r"'patience'.*monitor=Monitor\(patience="):
        ForgetWatchCallback(toy.probes, patience=2)
    with pytest.raises(TypeError, match=r"'verbose'.*output="):
        Watch(toy.probes, verbose=False)
    with pytest.raises(TypeError, match=r"'eval_step'.*'eval_steps'"):
        ForgetWatchCallback(toy.probes, eval_step=2)


def test_a_watch_from_yaml_takes_the_files_settings_and_the_constructors_keywords(toy, tmp_path):
    path = tmp_path / "fw.yaml"
    path.write_text("eval_steps: 15\npatience: 2\noutput_dir: out\n")
    watch = Watch.from_yaml(path, probes=toy.probes, eval_steps=5)
    assert (watch.config.eval_steps, watch.config.monitor.patience) == (5, 2)
    assert watch.config.output_dir == str(tmp_path / "out")  # from the file's folder


def test_a_signature_is_short_typed_documented_and_the_callbacks_is_no_copy_of_the_watchs(toy):
    def named(cls):
        return [p for p in inspect.signature(cls.__init__).parameters.values() if p.name != "self"]

    watch, callback = named(Watch), named(ForgetWatchCallback)
    assert len(watch) <= 10 and not [p for p in watch if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    # the callback's own: the probes or a Watch, the plug-ins it calls, trainer=; the watch's settings as they are
    assert [p.name for p in callback] == ["probes", "replay", "merge_at_end", "trainer", "settings"]
    for cls, parameters in ((Watch, watch), (ForgetWatchCallback, callback)):
        assert all(p.annotation is not inspect.Parameter.empty for p in parameters)
        args = cls.__doc__.split("Args:")[-1]
        assert all(f"{p.name}:" in args for p in parameters), cls
    made = Watch(toy.probes, eval_steps=3, output_dir="x")
    assert ForgetWatchCallback(made).watch is made
    with pytest.raises(TypeError, match="eval_steps"):  # a Watch's settings are given to the Watch
        ForgetWatchCallback(made, eval_steps=4)
    start = [p.name for p in inspect.signature(Watch.start).parameters.values()]
    assert start == ["self", "model", "tokenizer", "step", "output_dir", "max_steps", "train_rows"]


def test_a_watch_shows_what_users_read_and_no_more(toy):
    watch = Watch(toy.probes, output_dir="x")
    public = {k for k in vars(watch) if not k.startswith("_")}
    public |= {k for k, v in vars(Watch).items() if not k.startswith("_") and not inspect.isfunction(v)}
    assert len(public - {"from_yaml"}) <= 12, sorted(public)


# -- which categories are logged -----------------------------------------------------------------

SUBJECTS, GROUPS = 46, ("stem", "humanities", "social_sciences", "other")


def mmlu_like(toy, grouped_by=None):
    """80 probes in 46 categories of 1 or 2 probes, as MMLU's subjects come at 80 documents;
    ``grouped_by="lm_eval"``: each probe carries its groups as ``ProbeSet.from_lm_eval`` keeps them."""
    rows = []
    for i, row in enumerate(toy.world.probe_records()[:80]):
        subject = f"mmlu_subject_{i % SUBJECTS:02d}"
        group = f"mmlu_{GROUPS[i % SUBJECTS % len(GROUPS)]}"
        lm_eval = {"lm_eval": {"task": subject, "groups": [group, "mmlu"]}} if grouped_by == "lm_eval" else {}
        rows.append({**row, "category": subject, **lm_eval})
    category_map = {f"mmlu_subject_{j:02d}": f"mmlu_{GROUPS[j % len(GROUPS)]}" for j in range(SUBJECTS)}
    return ProbeSet.from_records(rows), (category_map if grouped_by == "category_map" else {})


def logged_names(metrics):
    """The categories (or groups) with keys of their own: ``forgetwatch/<name>/<figure>``."""
    return {key.split("/")[1] for key in metrics if key.count("/") >= 2} - {"behaviour"}


def test_categories_too_small_to_tell_forgetting_from_zero_are_not_logged(toy, tmp_path, capsys):
    probes, _ = mmlu_like(toy)
    watch = Watch(probes, output_dir=tmp_path, eval_steps=1)
    watch.start(toy.base, toy.tokenizer)
    evaluation = watch.evaluate(toy.tuned, 1)
    # no subject has 6 probes right at the base: per-subject figures would be noise
    assert evaluation.report.forgotten > 0 and logged_names(evaluation.metrics) == set()
    assert evaluation.metrics == metric_values(dataclasses.replace(evaluation.report, by_category={}))
    said = [line for line in capsys.readouterr().out.splitlines() if "not logged" in line]
    assert said == [
        "[forgetwatch] per-category figures are logged for none of 46 categories; not logged: 46 with fewer "
        "than 6 probes right at the base, too few to tell forgetting from zero (min_logged_right=6); "
        "history.jsonl and the report keep all of them"
    ]
    record = json.loads((tmp_path / "history.jsonl").read_text().splitlines()[-1])
    assert len(record["report"]["by_category"]) == SUBJECTS


def test_an_mmlu_like_probe_set_logs_a_few_groups(toy, tmp_path):
    probes, category_map = mmlu_like(toy, "category_map")
    output = Output(category_map=category_map, verbose=False)
    watch = Watch(probes, output_dir=tmp_path, eval_steps=1, output=output)
    watch.start(toy.base, toy.tokenizer)
    evaluation = watch.evaluate(toy.tuned, 1)
    groups = {f"mmlu_{g}" for g in GROUPS}
    values = evaluation.metrics
    assert logged_names(values) == groups
    # what TensorBoard gets: the overall figures and each group's, not 46 subjects' (498 tags before)
    assert len(values) <= 5 * len(metric_values(dataclasses.replace(evaluation.report, by_category={})))
    # a group's figures are its probes', counted here by a plain loop
    group_of = {p.id: p.category_group for p in watch.probes}
    for group in groups:
        forgotten = sum(
            b and not a and group_of[i] == group
            for i, b, a in zip(evaluation.answers.ids, watch.base_answers.correct, evaluation.answers.correct)
        )
        assert values[f"forgetwatch/{group}/forgotten"] == forgotten
    # the history keeps every subject, and probes.jsonl each probe's group, for the report
    record = json.loads((tmp_path / "history.jsonl").read_text().splitlines()[-1])
    assert len(record["report"]["by_category"]) == SUBJECTS
    assert {p.category_group for p in ProbeSet.from_jsonl(tmp_path / "probes.jsonl")} == groups
    # a resume decides from the kept base snapshot: the same keys
    again = Watch(probes, output_dir=tmp_path, eval_steps=1, output=output)
    again.load_state_dict(watch.state_dict())
    again.start(toy.tuned, toy.tokenizer)
    assert logged_names(again.evaluate(toy.tuned, 2).metrics) == groups


def test_lm_eval_probes_are_grouped_by_their_innermost_group(toy):
    probes, _ = mmlu_like(toy, "lm_eval")
    _, category_map = mmlu_like(toy, "category_map")
    assert [p.category_group for p in probes] == [category_map[p.category] for p in probes]
    # a category map names the group of those it names; the others keep lm-eval's
    regrouped = probes.with_groups({"mmlu_subject_00": "algebra"})
    assert [p.category_group for p in regrouped][:2] == ["algebra", category_map["mmlu_subject_01"]]


def test_the_logging_rule_counts_probes_right_at_the_base():
    # a large category with 5 right cannot show forgetting; a small one with 6 right can
    categories = ["large"] * 50 + ["small"] * 6
    right = [i < 5 for i in range(50)] + [True] * 6
    chosen, note = logged_categories(categories, right, min_right=6, limit=100)
    assert chosen == {"small"} and "1 with fewer than 6 probes right at the base" in note
    assert logged_categories(categories, right, min_right=5, limit=100) == (True, None)
    # the default is the fewest forgotten probes an exact McNemar test tells from zero at 5 %
    assert Output().min_logged_right == smallest_detectable(80)[0] == smallest_detectable(10_000)[0]


def test_a_category_map_naming_no_category_is_refused_before_any_work(toy):
    with pytest.raises(ConfigError) as info:
        Watch(toy.probes, output_dir="unused", output=Output(category_map={"captials": "geography"}))
    assert [p.key for p in info.value.errors] == ["category_map"] and "'captials'" in info.value.errors[0].message
    with pytest.raises(ConfigError) as info:
        Output(category_map={"capitals": 3})
    assert [p.key for p in info.value.errors] == ["category_map"] and "'capitals'" in info.value.errors[0].message
    config = from_flat_keys({"category_map": {"capitals": "geography"}}, "fw.yaml")  # as YAML gives it
    assert config.output.category_map == {"capitals": "geography"}


def steps_written(folder) -> list[int]:
    return [r["step"] for r in read_history(folder / "history.jsonl")]


def test_steps_go_forward_as_whole_numbers_and_one_evaluation_per_step(toy, tmp_path):
    watch = Watch(toy.probes, output_dir=tmp_path, eval_steps=2, output=QUIET)
    watch.start(toy.base, toy.tokenizer)
    first = watch.evaluate(toy.tuned, 4)
    forwards = []
    hook = toy.base.get_input_embeddings().register_forward_hook(lambda *_: forwards.append(1))
    try:
        for step, error, says in [
            (3, ValueError, r"step=3\).*step 4"),  # the step given; the last one evaluated
            (-1, ValueError, r"step=-1\)"),
            (4.5, TypeError, r"step=4.5\).*float"),  # the step given; its type
            (6.0, TypeError, "float"),
            (True, TypeError, "bool"),
            ("6", TypeError, "str"),
            (None, TypeError, "NoneType"),
        ]:
            with pytest.raises(error, match=says):
                watch.evaluate(toy.base, step)
        # the step of the last evaluation: that evaluation again, nothing scored, nothing written
        assert watch.evaluate(toy.base, 4) is first
        assert forwards == [] and steps_written(tmp_path) == [4]
    finally:
        hook.remove()
    watch.evaluate(toy.base, np.int64(6))  # numpy's integers are whole numbers
    assert steps_written(tmp_path) == [4, 6] and [s for s, _ in watch.history] == [4, 6]
    watch.close()

    resumed = Watch(toy.probes, output_dir=tmp_path, eval_steps=2, output=QUIET)
    resumed.load_state_dict(watch.state_dict())
    resumed.start(toy.tuned, toy.tokenizer)
    assert [s for s, _ in resumed.history] == [4, 6]  # read back whole
    assert not list(tmp_path.glob("history.jsonl.damaged*"))
    with pytest.raises(ValueError, match="step 6 was evaluated before this run resumed"):
        resumed.evaluate(toy.tuned, 6)
    with pytest.raises(ValueError, match="the last evaluation was at step 6"):
        resumed.evaluate(toy.tuned, 5)


class Vandal:
    """A sink that changes everything it is handed."""

    def on_base(self, snapshot):
        snapshot.answers.correct[:] = ~snapshot.answers.correct
        snapshot.answers.ids.reverse()
        snapshot.answers.meta.clear()

    def on_evaluation(self, evaluation):
        evaluation.report.forgotten_ids.clear()
        evaluation.report.by_category.clear()
        evaluation.metrics.clear()
        evaluation.drift["train_kl"] = -1.0
        evaluation.trajectory.correct[:] = False
        evaluation.trajectory.steps[:] = 0
        evaluation.base.correct[:] = False
        evaluation.answers.correct[:] = True
        evaluation.probes[0].meta["changed"] = True

    def on_end(self, trajectory):
        trajectory.correct[:] = True
        trajectory.ids.clear()


def test_a_sink_that_changes_what_it_is_handed_changes_nothing_of_the_run(toy, tmp_path):
    def vandal_hook(report, step):
        report.forgotten_ids.append("not a probe")

    watch = Watch(toy.probes, output_dir=tmp_path, eval_steps=2, sinks=[Vandal(), vandal_hook], output=QUIET)
    watch.start(toy.base, toy.tokenizer)
    watch.evaluate(toy.tuned, 2)
    watch.evaluate(toy.base, 4)
    watch.finish(toy.tuned, 4)
    base = evaluate(toy.base, toy.tokenizer, toy.probes)
    tuned = evaluate(toy.tuned, toy.tokenizer, toy.probes)
    expected = compare(base, tuned)
    assert watch.base_answers.ids == base.ids and watch.base_answers.correct.tolist() == base.correct.tolist()
    assert Answers.load(tmp_path / "base_answers.npz").correct.tolist() == base.correct.tolist()
    assert watch.history[0][1].forgotten_ids == expected.forgotten_ids and watch.history[0][1].by_category
    records = read_history(tmp_path / "history.jsonl")
    assert [r["step"] for r in records] == [2, 4] and "drift" not in records[0]
    assert records[0]["report"]["forgotten"] == expected.forgotten
    columns = [base.correct.tolist(), tuned.correct.tolist(), base.correct.tolist()]
    for trajectory in (watch.trajectory, load_trajectory(tmp_path)):
        assert trajectory.ids == base.ids and trajectory.steps.tolist() == [0, 2, 4]
        assert trajectory.correct.T.tolist() == columns
    assert "changed" not in watch.probes[0].meta and "changed" not in toy.probes[0].meta
    assert ProbeSet.from_jsonl(tmp_path / "probes.jsonl").fingerprint() == toy.probes.fingerprint()


class Stuck:
    """A sink whose ``event`` call does not return until the test lets it (or, with ``most``, that many seconds pass:
    a test of the bound then fails, not hangs, where the bound does not hold)."""

    def __init__(self, event="on_evaluation", most=None):
        self.calls, self.entered, self.release, self.most = 0, threading.Event(), threading.Event(), most
        setattr(self, event, self.block)

    def on_base(self, snapshot): ...

    def on_evaluation(self, evaluation): ...

    def on_end(self, trajectory): ...

    def block(self, payload):
        self.calls += 1
        self.entered.set()
        self.release.wait(self.most)


def test_a_sink_that_blocks_is_dropped_for_the_run_and_training_goes_on(toy, tmp_path, warned):
    stuck = Stuck()
    watch = Watch(toy.probes, output_dir=tmp_path, eval_steps=2, sinks=[stuck], output=QUIET)
    watch.sink_seconds = 0  # it never returns before the test lets it: dropped, whatever the clock says
    watch.start(toy.base, toy.tokenizer)
    try:
        watch.evaluate(toy.tuned, 2)
        watch.evaluate(toy.base, 4)
        watch.finish(toy.base, 4)
        assert stuck.entered.wait() and stuck.calls == 1  # not called again once dropped
    finally:
        stuck.release.set()
    assert len(warned("Stuck", "on_evaluation")) == 1
    assert steps_written(tmp_path) == [2, 4]


@pytest.mark.parametrize("event, where", [("on_base", "Watch"), ("on_evaluation", "watch"), ("on_end", "watch")])
def test_every_sink_call_is_bounded_by_sink_seconds_as_it_is_when_the_call_runs(
    toy, tmp_path, warned, monkeypatch, event, where
):
    stuck = Stuck(event, most=30)
    if where == "Watch":  # every watch's bound, set on the class
        monkeypatch.setattr(Watch, "sink_seconds", 0)
    watch = Watch(toy.probes[:4], output_dir=tmp_path, eval_steps=2, sinks=[stuck], output=QUIET)
    try:
        watch.start(toy.base, toy.tokenizer)
        if where == "watch":  # this watch's bound, set once it has started
            watch.sink_seconds = 0
        watch.evaluate(toy.tuned, 2)
        watch.evaluate(toy.base, 4)
        watch.finish(toy.base, 4)
        assert stuck.entered.wait(30) and stuck.calls == 1
        assert len(warned("Stuck", event)) == 1
    finally:
        stuck.release.set()


def test_an_unbounded_wait_for_a_sink_is_as_long_as_a_wait_can_be():
    from forgetwatch.sinks import Sinks

    sink = Recorder()
    Sinks([sink], seconds=lambda: float("inf")).on_evaluation("evaluation")  # Thread.join(inf) would raise
    assert sink.evaluations == ["evaluation"]


def test_a_model_without_embeddings_for_the_tokenizers_ids_is_refused_before_scoring(toy, tmp_path):
    small = copy.deepcopy(toy.base)
    small.resize_token_embeddings(40)
    says = r"probe '.+'.*40 tokens.*resize_token_embeddings\(len\(tokenizer\)\)"  # which probe; the size; the fix
    with pytest.raises(ValueError, match=says):
        evaluate(small, toy.tokenizer, toy.probes)
    with pytest.raises(ValueError, match=says):
        Watch(toy.probes, output_dir=tmp_path / "run").start(small, toy.tokenizer)
    assert not (tmp_path / "run").exists()  # refused before anything was written


def files(folder) -> dict[str, bytes]:
    """What forgetwatch wrote in a run directory, by name (its lock is not the run's)."""
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and p.name != LOCK}


def test_a_fresh_run_sets_the_earlier_runs_files_aside_whole(toy, tmp_path, caplog):
    first = Watch(toy.probes, output_dir=tmp_path, eval_steps=2, output=QUIET)
    first.start(toy.base, toy.tokenizer)
    first.evaluate(toy.tuned, 2)
    first.finish(toy.tuned, 2)
    earlier = files(tmp_path)
    assert {"base_answers.npz", "history.jsonl", "probes.jsonl", "answers_latest.npz"} <= set(earlier)

    # a second start() of the same watch, same model and weights: the snapshot is reused
    with caplog.at_level(logging.INFO, logger="forgetwatch"):
        snapshot = first.start(toy.base, toy.tokenizer)
    assert not snapshot.computed and "reusing the base snapshot" in caplog.text
    assert files(tmp_path / "previous-1") == earlier  # kept whole, byte for byte
    assert (tmp_path / "base_answers.npz").read_bytes() == earlier["base_answers.npz"]
    assert steps_written(tmp_path) == []
    first.evaluate(toy.base, 3)
    first.finish(toy.base, 3)
    second = files(tmp_path)

    # another probe set, then another base
    fewer = toy.probes.sample(30, seed=1)
    other = Watch(fewer, output_dir=tmp_path, eval_steps=2, output=QUIET)
    assert other.start(toy.base, toy.tokenizer).computed
    other.evaluate(toy.tuned, 2)
    other.finish(toy.tuned, 2)
    third = files(tmp_path)
    assert files(tmp_path / "previous-2") == second
    another_base = Watch(fewer, output_dir=tmp_path, output=QUIET)
    assert another_base.start(toy.tuned, toy.tokenizer).computed  # other weights: scored, not reused
    assert files(tmp_path / "previous-3") == third
    assert [files(tmp_path / f"previous-{n}") for n in (1, 2)] == [earlier, second]
    assert another_base.base_answers.correct.tolist() == evaluate(toy.tuned, toy.tokenizer, fewer).correct.tolist()
    assert load_trajectory(tmp_path / "previous-2").steps.tolist() == [0, 3]  # each reads back as it was
    another_base.close()


def test_two_watches_never_write_in_one_directory(toy, tmp_path, caplog):
    first = Watch(toy.probes, output_dir=tmp_path, eval_steps=2, output=QUIET)
    first.start(toy.base, toy.tokenizer)
    first.evaluate(toy.tuned, 2)
    before = files(tmp_path)

    # in this process the later watch takes the folder over: the first goes on among its own files
    fewer = toy.probes.sample(30, seed=1)
    second = Watch(fewer, output_dir=tmp_path, eval_steps=2, output=QUIET)
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        second.start(toy.base, toy.tokenizer)
    assert "another watch of this process wrote in" in caplog.text
    assert files(tmp_path / "previous-1") == before  # byte for byte
    first.evaluate(toy.base, 4)
    second.evaluate(toy.tuned, 2)
    assert steps_written(tmp_path / "previous-1") == [2, 4] and steps_written(tmp_path) == [2]
    assert first.output_dir / "history.jsonl" == tmp_path / "previous-1" / "history.jsonl"
    assert load_trajectory(tmp_path / "previous-1").ids == toy.probes.ids and load_trajectory(tmp_path).ids == fewer.ids
    first.finish(toy.base, 4)
    second.finish(toy.tuned, 2)

    # a live watch of another process: refused before any work
    after = files(tmp_path)
    (tmp_path / LOCK).write_text(json.dumps({"pid": os.getppid(), "host": socket.gethostname()}))
    with pytest.raises(NotWritableError, match=f"a watch of process {os.getppid()} on .* writes in {tmp_path}"):
        Watch(toy.probes, output_dir=tmp_path, output=QUIET).start(toy.base, toy.tokenizer)
    assert files(tmp_path) == after and not (tmp_path / "previous-2").exists()


@pytest.mark.slow
def test_a_fresh_run_sets_aside_the_merge_an_earlier_one_wrote_and_its_page_shows_none(toy, tmp_path):
    from forgetwatch import MergeAtEnd
    from forgetwatch.page.html import write_report

    texts = toy.world.distraction_texts(n=4, seed=7)
    first, merge = (
        Watch(toy.probes, output_dir=tmp_path, eval_steps=1, output=QUIET),
        MergeAtEnd(texts, alphas=[0.5], save=True),
    )
    first.start(toy.base, toy.tokenizer)
    merge.begin(toy.base, first.view)
    final = copy.deepcopy(toy.tuned)
    first.finish(final, 1)  # the final evaluation, then the sweep on the final weights
    merge.end(final, 1)
    written = {"sweep.json", "sweep.csv", "merged"}
    assert written <= {p.name for p in tmp_path.iterdir()}
    page = write_report([tmp_path], tmp_path / "first.html").read_text(encoding="utf-8")
    assert "merging base (alpha 0) and tuned (alpha 1) weights" in page

    second = Watch(toy.probes, output_dir=tmp_path, eval_steps=1, output=QUIET)  # no merging
    second.start(toy.base, toy.tokenizer)
    second.finish(toy.tuned, 1)
    assert written <= {p.name for p in (tmp_path / "previous-1").iterdir()}
    assert not written & {p.name for p in tmp_path.iterdir()}
    page = write_report([tmp_path], tmp_path / "second.html").read_text(encoding="utf-8")
    assert "merging base (alpha 0) and tuned (alpha 1) weights" not in page


def test_a_resume_with_other_scoring_options_is_one_error_naming_them(toy, tmp_path):
    from forgetwatch import AnswersMismatchError

    probes = ProbeSet.from_records(toy.world.probe_records()[:6])
    sampled = Scoring(samples=3, temperature=0.7, max_new_tokens=4)
    first = Watch(probes, output_dir=tmp_path, eval_steps=2, scoring=sampled, output=QUIET)
    first.start(toy.base, toy.tokenizer)
    first.due(2)
    kept = first.state_dict()
    first.close()
    again = Watch(probes, output_dir=tmp_path, eval_steps=2, scoring=Scoring(**{**dict(sampled), "temperature": 0.9}))
    again.load_state_dict(kept)
    with pytest.raises(AnswersMismatchError) as caught:
        again.start(toy.tuned, toy.tokenizer)
    message = str(caught.value)
    assert "resuming at step 2" in message and "sampling.temperature: 0.7, not 0.9" in message
    assert "samples" not in message.replace("sampling.", "")  # only what differs is named


class Spy:
    """A kept plug-in that records what the watch touches of it: what changes training is never among it."""

    name, files = "spy", ()

    def __init__(self):
        self.touched = set()

    def __getattribute__(self, attr):
        if not attr.startswith("__") and attr != "touched":
            object.__getattribute__(self, "touched").add(attr)
        return object.__getattribute__(self, attr)

    def metrics(self):
        return {"spy/calls": 1.0}

    def state(self):
        return {"calls": 1}

    def begin(self, model, run):
        raise AssertionError("the watch began a plug-in")

    def before_optimizer_step(self, model, **kw):
        raise AssertionError("the watch changed a gradient")

    def on_evaluation(self, report, model=None):
        raise AssertionError("the watch adjusted a plug-in")

    def end(self, model, step):
        raise AssertionError("the watch ran a plug-in at the end")


def test_a_watch_only_reads_a_kept_plug_ins_figures_and_state(toy, tmp_path):
    spy = Spy()
    watch = Watch(toy.probes[:6], output_dir=tmp_path / "run", eval_steps=1, output=QUIET)
    watch.keep(spy)
    watch.start(toy.base, toy.tokenizer)
    evaluation = watch.evaluate(toy.tuned, 1)
    state = watch.state_dict()
    watch.finish(toy.tuned, 2)
    assert spy.touched <= {"name", "files", "metrics", "state"}
    assert evaluation.metrics["forgetwatch/spy/calls"] == 1.0 and state["plugins"] == {"spy": {"calls": 1}}
    assert read_history(tmp_path / "run" / "history.jsonl")[0]["spy"] == {"spy/calls": 1.0, "calls": 1}
    with pytest.raises(ValueError, match="'spy'"):
        watch.keep(Spy())
