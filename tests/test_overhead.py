"""What monitoring costs a run: all of the start-up counts against ``max_overhead`` (a reused
snapshot's first evaluation paced too), train KL's base takes about as long as scoring the
probes, and a fixed ``eval_steps`` says what an evaluation costs in training steps, with one
warning when it spends more than the budget would. On a clock that ticks once per forward pass
of the watched model, and by a set time per training step: exact figures on any machine."""

from __future__ import annotations

import copy
import logging
import math

import pytest
from test_callback import ForwardClock  # one second per forward; training steps move ``now`` by hand
from trainers import run_view

from forgetwatch import Output, ProbeKind, Watch
from forgetwatch.common.distributed import Ranks
from forgetwatch.run.schedule import duration
from forgetwatch.run.train_kl import MIN_ROWS, MIN_SECONDS, SHARE, TrainKL, as_train_rows
from forgetwatch.store.write import RunStore

QUIET = Output(verbose=False)


def forwards(clock, work):
    """How many forward passes ``work()`` made."""
    before = clock.now
    work()
    return clock.now - before


@pytest.fixture(scope="module")
def rows(toy):
    return toy.tokenizer(toy.world.distraction_texts(n=128))["input_ids"]


@pytest.fixture(scope="module")
def few(toy):
    """Four multiple-choice probes: a scoring of them is a forward or two, less than train KL's rows."""
    return toy.probes.subset(lambda p: p.kind == ProbeKind.MULTIPLE_CHOICE)[:4]


def context(folder, tokenizer):
    return run_view(tokenizer, store=RunStore(folder))


def test_train_kl_is_measured_on_as_many_rows_as_fit_its_time(toy, tmp_path, caplog):
    model = copy.deepcopy(toy.base)
    clock = ForwardClock(model)
    given = [(ids, 1) for ids in toy.tokenizer(toy.world.distraction_texts(n=12))["input_ids"]]
    signal = TrainKL(128, max_seconds=3.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="forgetwatch"):
        spent = forwards(clock, lambda: signal.begin(model, context(tmp_path, toy.tokenizer), given))
    # timed on 2 rows (an eighth of 12) in one forward: 0.5 s a row, 2 s left of 3 for 4 rows, but 8 at least
    kept = as_train_rows(given, MIN_ROWS).rows
    assert signal.tokens == [ids for ids, _ in kept] and signal.starts == [s for _, s in kept]
    assert spent == 2  # the timing, then the 8 rows in one batch of 8 (the scorer's before it planned any)
    assert f"measured on {MIN_ROWS} of 12 training rows (a seeded sample)" in caplog.text
    assert signal.measure(model, Ranks())["train_kl"] == 0.0  # still exactly 0 at the base
    roomy = TrainKL(128, max_seconds=100.0, clock=clock)
    roomy.begin(model, context(tmp_path / "roomy", toy.tokenizer), given)
    assert roomy.tokens == [ids for ids, _ in given]  # all fit: all measured


def test_a_watch_gives_train_kl_a_share_of_the_time_scoring_the_probes_took(toy, few, rows, tmp_path, caplog):
    model = copy.deepcopy(toy.base)
    clock = ForwardClock(model)
    plain = Watch(few, output_dir=tmp_path / "plain", output=QUIET, clock=clock)
    without = forwards(clock, lambda: plain.start(model, toy.tokenizer))
    watch = Watch(few, output_dir=tmp_path / "kl", output=QUIET, clock=clock)
    with caplog.at_level(logging.INFO, logger="forgetwatch"):
        with_kl = forwards(clock, lambda: watch.start(model, toy.tokenizer, train_rows=rows))
    scoring = watch.base_answers.meta["scoring_seconds"]
    assert watch._train_kl.max_seconds == max(SHARE * scoring, MIN_SECONDS)
    measured = len(watch._train_kl.tokens)
    assert measured < len(rows) and f"measured on {measured} of {len(rows)} training rows" in caplog.text
    # its start-up (the timing, then the rows kept) within its time, up to a batch
    assert with_kl - without <= watch._train_kl.max_seconds + 1
    assert watch.monitoring_seconds == with_kl  # all of the start-up is monitoring time


def run_steps(watch, model, clock, steps, step_time):
    """Training on the clock: each step takes ``step_time``; evaluations when the watch says."""
    for step in range(1, steps + 1):
        clock.now += step_time
        if watch.due(step):
            watch.evaluate(model, step)
    watch.finish(model, steps)
    return [step for step, _ in watch.history]


def test_the_whole_start_up_counts_against_the_budget(toy, few, rows, tmp_path):
    model = copy.deepcopy(toy.base)
    clock = ForwardClock(model)
    watch = Watch(few, output_dir=tmp_path, output=QUIET, clock=clock)  # max_overhead=0.05
    watch.start(model, toy.tokenizer, train_rows=rows)
    start_up, scoring = watch.monitoring_seconds, watch.base_answers.meta["scoring_seconds"]
    assert start_up >= scoring + watch._train_kl.max_seconds / 2  # train KL's base is a large part of it
    steps = run_steps(watch, model, clock, steps=800, step_time=5.0)
    assert len(steps) >= 3 and steps[-1] == 800
    # the first came once training had paid for all of the start-up, this evaluation and the final one
    assert steps[0] * 5.0 >= (start_up + 2 * scoring) * 19
    assert watch.monitoring_seconds / clock() <= 0.05  # the whole run, the final evaluation included

    # the snapshot reused: it says what scoring took, so the first evaluation is paced too
    again = Watch(few, output_dir=tmp_path, output=QUIET, clock=clock)
    began = clock()
    assert not again.start(model, toy.tokenizer, train_rows=rows).computed
    step = 0
    while not again.history:
        step += 1
        clock.now += 5.0
        if again.due(step):
            again.evaluate(model, step)
    assert step > 1 and again.monitoring_seconds / (clock() - began) <= 0.05


def test_a_fixed_interval_says_what_an_evaluation_costs_and_warns_once(toy, few, tmp_path, capsys, caplog):
    model = copy.deepcopy(toy.base)
    clock = ForwardClock(model)
    watch = Watch(few, output_dir=tmp_path, eval_steps=8, clock=clock)
    watch.start(model, toy.tokenizer)
    capsys.readouterr()
    costs = []
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        for step in range(1, 17):
            clock.now += 0.25  # a training step
            if watch.due(step):
                costs.append(forwards(clock, lambda step=step: watch.evaluate(model, step)))
    cost = costs[0]
    assert costs == [cost, cost]
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[forgetwatch] step")]
    note = f"evaluation {duration(cost)} = {cost / 0.25:.1f} training steps"
    assert len(lines) == 2 and all(line.endswith(f"; {note}") for line in lines)
    share = cost / (cost + 8 * 0.25)
    assert share > 0.05
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"forgetwatch: eval_steps=8 spends {100 * share:.1f}% of wall time on monitoring (an evaluation "
        f"{duration(cost)}, 8 training steps 2.0 s); the budget (max_overhead=0.05, without eval_steps) would "
        f"evaluate about every {math.ceil(cost * 19 / 0.25)} steps"
    ]
