"""The evaluation schedule and the early-stop rule, on simulated clocks and reports."""

from __future__ import annotations

import json
import math

import pytest

from forgetwatch.results.report import TransitionReport
from forgetwatch.run.schedule import Budget, EverySteps
from forgetwatch.run.stopping import StopRule


class Clock:
    def __init__(self):
        self.now, self.reads = 0.0, 0

    def __call__(self):
        self.reads += 1
        return self.now


def simulate(budget: Budget, clock: Clock, steps: int, step_time, eval_time: float, snapshot: float, start_up=None):
    """A training run: returns evaluation steps and the share of time spent monitoring. The
    start-up (default: the snapshot alone) counts; an evaluation is expected to cost the snapshot."""
    start_up = snapshot if start_up is None else start_up
    clock.now = start_up
    budget.start(0, spent=start_up, cost=snapshot)
    evaluated, monitoring = [], start_up
    for step in range(1, steps + 1):
        clock.now += step_time(step)
        if budget.due(step):
            clock.now += eval_time
            monitoring += eval_time
            budget.evaluated(step, eval_time)
            evaluated.append(step)
    return evaluated, monitoring / clock.now


def test_every_steps():
    s = EverySteps(25)
    assert [n for n in range(1, 101) if s.due(n)] == [25, 50, 75, 100]


@pytest.mark.parametrize("overhead", [0.05, 0.2])
def test_budget_keeps_monitoring_within_its_share(overhead):
    clock = Clock()
    evaluated, share = simulate(
        Budget(overhead, clock=clock), clock, steps=5000, step_time=lambda s: 0.1, eval_time=2.0, snapshot=2.0
    )
    assert share <= overhead + 1e-9
    # and it uses the budget: after the last evaluation, one more would have overspent
    assert share > overhead * 0.8
    gaps = {b - a for a, b in zip(evaluated, evaluated[1:])}
    expected_gap = 2.0 * (1 - overhead) / overhead / 0.1  # training time one evaluation pays for
    assert max(gaps) <= expected_gap + 2 and min(gaps) >= expected_gap - 1  # rounded up to whole steps


def test_budget_reserves_room_for_the_final_evaluation():
    clock = Clock()
    budget = Budget(0.05, clock=clock, reserve=1)
    evaluated, share = simulate(budget, clock, steps=3000, step_time=lambda s: 0.1, eval_time=2.0, snapshot=2.0)
    # one more evaluation at the end (as at train end) still fits the budget
    final = (share * clock.now + 2.0) / (clock.now + 2.0)
    assert final <= 0.05 + 1e-9
    clock2 = Clock()
    without, share2 = simulate(
        Budget(0.05, clock=clock2), clock2, steps=3000, step_time=lambda s: 0.1, eval_time=2.0, snapshot=2.0
    )
    assert (share2 * clock2.now + 2.0) / (clock2.now + 2.0) > 0.05  # without the reserve it would not


def test_budget_counts_the_whole_start_up():
    # 60 s before training (a 2 s snapshot, its noise check, train KL's base, files), 2 s evaluations
    clock = Clock()
    budget = Budget(0.05, clock=clock, reserve=1)
    evaluated, share = simulate(
        budget, clock, steps=20000, step_time=lambda s: 0.1, eval_time=2.0, snapshot=2.0, start_up=60.0
    )
    # the first comes once training has paid for all of it, this evaluation and the final one
    assert abs(evaluated[0] - (60 + 2 * 2) * 19 / 0.1) <= 1
    assert (share * clock.now + 2.0) / (clock.now + 2.0) <= 0.05 + 1e-9  # the final evaluation too
    # resumed from its state in another process (another clock): the same decisions as the run that went on
    clock, later = Clock(), Clock()
    budget = Budget(0.5, clock=clock)
    budget.start(0, spent=0.0, cost=1.0)
    clock.now = 0.5
    assert not budget.due(1)  # half a second of training pays for less than the evaluation
    kept = json.loads(json.dumps(budget.state_dict()))
    later.now = 1000.0
    resumed = Budget(0.5, clock=later)
    resumed.start(1, spent=0.0, cost=None)  # its start-up cost nothing here
    resumed.load_state_dict(kept)
    decisions = []
    for step, now in ((2, 0.8), (3, 1.2)):  # 1 s of training pays for a 1 s evaluation at max_overhead 0.5
        clock.now, later.now = now, 999.5 + now
        decisions.append((budget.due(step), resumed.due(step)))
    assert decisions == [(False, False), (True, True)]


def test_every_steps_says_what_an_evaluation_costs_and_warns_once_when_over_the_budget():
    clock = Clock()
    every = EverySteps(8, max_overhead=0.05, clock=clock)
    every.start(0)
    clock.now = 16.0  # 8 steps of 2 s
    note, warning = every.pace(8, began=16.0, cost=12.0)
    assert note == "evaluation 12.0 s = 6.0 training steps"
    assert warning == (
        "eval_steps=8 spends 42.9% of wall time on monitoring (an evaluation 12.0 s, 8 training steps 16.0 s); "
        "the budget (max_overhead=0.05, without eval_steps) would evaluate about every 114 steps"
    )  # 12 s paid for by 19 x 12 s of training: 114 steps of 2 s
    clock.now = 28.5
    every.evaluated(8, 12.5)
    assert every.pace(8, began=28.5, cost=1.0) == (None, None)  # no training step since: nothing to say
    clock.now = 28.5 + 8 * 0.5
    assert every.pace(16, began=clock.now, cost=0.25) == ("evaluation 250 ms = 0.5 training steps", None)  # once
    cheap = EverySteps(100, max_overhead=0.05, clock=clock)
    cheap.start(0)
    clock.now += 200.0
    assert cheap.pace(100, began=clock.now, cost=1.0) == ("evaluation 1.0 s = 0.5 training steps", None)


def test_budget_adapts_when_steps_get_slower():
    clock = Clock()
    evaluated, share = simulate(
        Budget(0.1, clock=clock),
        clock,
        steps=3000,
        step_time=lambda s: 0.05 if s < 1000 else 0.5,
        eval_time=1.0,
        snapshot=1.0,
    )
    assert share <= 0.1 + 1e-9
    early = [s for s in evaluated if s < 1000]
    late = [s for s in evaluated if s >= 1100]
    # fixed evaluation cost, slower steps: evaluations come after fewer steps
    assert (early[-1] - early[-2]) > 5 * (late[-1] - late[-2])


def test_budget_spaces_evaluations_after_a_long_pause():
    clock = Clock()
    # a 120 s pause (a checkpoint, a trainer evaluation) at step 1500
    evaluated, share = simulate(
        Budget(0.05, clock=clock),
        clock,
        steps=3000,
        step_time=lambda s: 120.0 if s == 1500 else 0.1,
        eval_time=2.0,
        snapshot=2.0,
    )
    gaps = [b - a for a, b in zip(evaluated, evaluated[1:])]
    assert min(gaps) >= 370  # one evaluation after the pause, then the usual spacing
    assert share <= 0.05 + 1e-9


def test_budget_decisions_come_from_the_agree_hook():
    clock = Clock()
    seen = []

    def rank_zero_says(values):  # stands in for the broadcast from rank 0
        seen.append(list(values))
        return [1, values[1]]

    budget = Budget(0.05, clock=clock, agree=rank_zero_says)
    budget.start(0, spent=100.0, cost=100.0)
    clock.now = 1.0
    assert budget.due(1)  # this rank's clock says no; rank 0 says yes
    assert seen == [[0, 2]]


def test_budget_reads_the_clock_only_at_planned_checks():
    clock = Clock()
    budget = Budget(0.05, clock=clock)
    simulate(budget, clock, steps=2000, step_time=lambda s: 0.1, eval_time=1.0, snapshot=1.0)
    # 2000 steps, but only a few dozen checks
    assert clock.reads < 100


def test_budget_evaluates_early_when_the_cost_is_unknown():
    clock = Clock()
    budget = Budget(0.05, clock=clock)
    budget.start(0, spent=0.0, cost=None)  # answers loaded that do not say what scoring took
    assert budget.due(1)
    budget.evaluated(1, 3.0)
    clock.now = 1.0
    assert not budget.due(2)  # now 3 s per evaluation must be paid for by ~57 s of training


def report(f, f_adj=None, ci=(math.nan, math.nan), categories=None):
    f = math.nan if f is None else f
    return TransitionReport(
        forgetting=f, forgetting_adjusted=f if f_adj is None else f_adj, forgetting_ci=ci, by_category=categories or {}
    )


def test_stop_rule_threshold_and_patience():
    rule = StopRule(max_forgetting=0.05, patience=2)
    assert rule.update(report(0.06)) is None  # once over: patience 2 waits
    assert rule.update(report(0.04)) is None  # back under: streak resets
    assert rule.update(report(0.07)) is None
    reason = rule.update(report(0.08))
    assert reason and "forgetting 8.00% > 5.00%" in reason and "2 consecutive" in reason


def test_stop_rule_on_the_adjusted_rate():
    rule = StopRule(max_forgetting=0.05, metric="forgetting_adjusted")
    assert rule.update(report(0.08, f_adj=0.04)) is None
    assert "forgetting_adjusted" in rule.update(report(0.08, f_adj=0.06))


def test_stop_rule_significance_uses_the_lower_bound():
    rule = StopRule(max_forgetting=0.05, significance=True)
    assert rule.update(report(0.08, ci=(0.03, 0.15))) is None  # estimate over, bound under
    assert "lower bound" in rule.update(report(0.09, ci=(0.06, 0.12)))
    adjusted = StopRule(max_forgetting=0.05, metric="forgetting_adjusted", significance=True)
    # bound 0.06 shifted by the chance correction (0.09 - 0.07 = 0.02): 0.04, under
    assert adjusted.update(report(0.09, f_adj=0.07, ci=(0.06, 0.12))) is None
    assert adjusted.value(report(0.09, f_adj=0.07, ci=(0.06, 0.12))) == pytest.approx(0.04)


def test_stop_rule_per_category():
    rule = StopRule(category_max_forgetting={"math": 0.1})
    assert rule.update(report(0.5, categories={"math": report(0.05)})) is None  # overall not watched
    reason = rule.update(report(0.0, categories={"math": report(0.2)}))
    assert "category 'math'" in reason
    assert rule.update(report(0.0)) is None  # category absent: not over


def test_stop_rule_ignores_nan():
    rule = StopRule(max_forgetting=0.0)
    assert rule.update(report(None)) is None
    assert rule.update(report(math.nan)) is None
    assert not StopRule().active
