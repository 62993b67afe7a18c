"""The noise floor: probes that flip when the same weights are scored again in other batches."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from injected import BatchShapeNoise
from trainers import make_trainer

from forgetwatch import Answers, Monitor, Scorer, Scoring, evaluate
from forgetwatch.integrations.callback import ForgetWatchCallback
from forgetwatch.results.noise import (
    measure_noise,
    noise_figures,
    other_batch_size,
    smallest_detectable,
    wants_noise_check,
)
from forgetwatch.results.report import TransitionReport
from forgetwatch.run.stopping import OVERALL, StopRule
from forgetwatch.scoring.borrow import compute_precision, is_reduced


def test_smallest_detectable_is_the_first_count_an_exact_two_sided_test_rejects():
    for n in (50, 144, 10_000):
        k = next(k for k in range(1, 50) if min(1.0, 2 * 0.5**k) < 0.05)  # P(all k one way), two-sided
        assert smallest_detectable(n) == (k, k / n)


def test_noise_figures_count_the_flips_per_category():
    rows = [("a", "x", True, True), ("b", "x", True, False), ("c", "y", False, True), ("d", "y", False, False)]
    first = Answers.from_samples("fp", {}, [dict(id=i, category=c, correct=x) for i, c, x, _ in rows])
    again = Answers.from_samples("fp", {}, [dict(id=i, category=c, correct=y) for i, c, _, y in rows])
    # two flips, one of them right -> wrong: the forgetting that noise alone makes
    assert noise_figures(first, again) == {
        "noise_flips": 2,
        "noise_floor": 0.25,
        "noise_floor_by_category": {"x": 0.5, "y": 0.0},
    }


def test_other_batch_size_differs_from_the_first():
    for first in (1, 2, 3, 8, 32, 64):
        assert other_batch_size(first, 0) != first


def test_the_wilson_guard_takes_the_noise_floor_off_the_lower_bound():
    report = TransitionReport(forgetting=0.09, forgetting_adjusted=0.09, forgetting_ci=(0.06, 0.12))
    assert StopRule(0.05, significance=True).update(report)  # lower bound 6 % > 5 %
    quiet = StopRule(0.05, significance=True, noise_floor={OVERALL: 0.02})
    assert quiet.update(report) is None  # 6 % less 2 % of noise is not over 5 %
    loud = StopRule(0.03, significance=True, noise_floor={OVERALL: 0.02})
    assert "less the noise floor 4.00% > 3.00%" in loud.update(report)


def test_measured_noise_equals_an_independent_count_of_flips(toy):
    # the same weights give other log-probabilities in other batches (injected, as on a GPU)
    model = BatchShapeNoise(toy.base, scale=0.5)
    scorer = Scorer(toy.tokenizer, toy.probes)
    first = scorer(model, batch_size=16, show_progress=False)
    figures = measure_noise(scorer, model, first, 16)
    again = Scorer(toy.tokenizer, toy.probes)(model, batch_size=other_batch_size(16, 0), show_progress=False)
    flips = [a != b for a, b in zip(first.correct, again.correct)]
    lost = [a and not b for a, b in zip(first.correct, again.correct)]
    assert figures["noise_flips"] == sum(flips) > 0 and figures["noise_floor"] == sum(lost) / len(lost)
    for category, share in figures["noise_floor_by_category"].items():
        mine = [f for f, c in zip(lost, first.categories) if c == category]
        assert share == sum(mine) / len(mine)


def test_noise_check_is_on_by_default_for_reduced_precision_only(toy):
    cpu = torch.device("cpu")
    half = copy.deepcopy(toy.base).to(torch.bfloat16)
    assert not wants_noise_check(toy.base, is_reduced(compute_precision(toy.base, cpu, "weights")))
    assert wants_noise_check(half, is_reduced(compute_precision(half, cpu, "weights")))


@pytest.mark.slow
def test_the_base_is_scored_twice_and_its_flips_are_kept_logged_and_told(toy, train_data, tmp_path, capsys):
    model = copy.deepcopy(toy.base).to(torch.bfloat16)  # half precision: other batches round otherwise
    cb = ForgetWatchCallback(toy.probes, eval_steps=10, scoring=Scoring(batch_size=16))
    trainer = make_trainer(toy, train_data, tmp_path, [cb], model=model, max_steps=10)
    trainer.train()
    meta = cb.base_answers.meta

    # independently: the same weights scored with both batch sizes
    bf16 = copy.deepcopy(toy.base).to(torch.bfloat16)
    a = evaluate(bf16, toy.tokenizer, toy.probes, batch_size=16, show_progress=False)
    b = evaluate(bf16, toy.tokenizer, toy.probes, batch_size=other_batch_size(16, 0), show_progress=False)
    flips = sum(x != y for x, y in zip(a.correct, b.correct))
    lost = sum(x and not y for x, y in zip(a.correct, b.correct))
    assert meta["noise_flips"] == flips and meta["noise_floor"] == lost / len(a)
    assert Answers.load(tmp_path / "forgetwatch" / "base_answers.npz").meta["noise_floor"] == meta["noise_floor"]
    assert {"forgetwatch/noise_floor": meta["noise_floor"], "step": 0} in [
        {k: v for k, v in log.items() if k in ("forgetwatch/noise_floor", "step")} for log in trainer.state.log_history
    ]
    out = capsys.readouterr().out
    k, rate = smallest_detectable(len(toy.probes))
    assert "cannot be told from zero" in out and f"({k} probes)" in out and "noise floor" in out
    assert "noise floor" in cb.summary()


@pytest.mark.slow
def test_no_noise_check_in_full_precision_unless_asked(toy, train_data, tmp_path):
    cb = ForgetWatchCallback(toy.probes, eval_steps=10)
    make_trainer(toy, train_data, tmp_path, [cb], max_steps=10).train()
    assert "noise_floor" not in cb.base_answers.meta and "noise floor" not in cb.summary()
    forced = ForgetWatchCallback(toy.probes, eval_steps=10, monitor=Monitor(noise_check=True))
    make_trainer(toy, train_data, tmp_path / "forced", [forced], max_steps=10).train()
    assert forced.base_answers.meta["noise_flips"] == 0  # fp32 on a CPU: the same answers in any batch
    assert not math.isnan(forced.base_answers.meta["noise_floor"])
