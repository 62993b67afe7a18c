"""Which replay rows come next: weights from measured forgetting, seeded and resumable draws."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from forgetwatch import ReplayPool, TransitionReport
from forgetwatch.replay.sampler import ReplaySampler, category_weights


def pool(sizes):
    return ReplayPool.from_records(
        [{"id": f"{c}{i}", "text": "t", "category": c} for c, n in sizes.items() for i in range(n)]
    )


def test_weights_follow_adjusted_forgetting_and_at_risk_with_a_floor():
    report = TransitionReport(
        forgetting_adjusted=0.05,
        at_risk=0.1,
        by_category={
            "math": TransitionReport(forgetting_adjusted=0.2, at_risk=0.1),
            "geo": TransitionReport(forgetting_adjusted=float("nan"), at_risk=0.0),
            "bio": TransitionReport(forgetting_adjusted=-0.01, at_risk=0.3),
        },
    )
    cats = ["all", "bio", "geo", "math"]
    raw = {"all": 0.05 + 0.5 * 0.1, "bio": 0 + 0.5 * 0.3, "geo": 0.0, "math": 0.2 + 0.5 * 0.1}
    total = sum(raw.values())
    expected = {c: 0.9 * raw[c] / total + 0.1 / 4 for c in cats}  # "all" weighs the overall figures
    got = category_weights(report, cats)
    assert got == pytest.approx(expected) and math.isclose(sum(got.values()), 1.0)
    assert got["geo"] == pytest.approx(0.025)  # no forgetting measured: the floor alone, never zero
    assert category_weights(None, cats) == {c: 0.25 for c in cats}  # before the first evaluation
    assert category_weights(TransitionReport(), cats) == {c: 0.25 for c in cats}


def test_draws_follow_the_weights_and_cover_every_row_before_repeating_one():
    sampler = ReplaySampler(pool({"a": 5, "b": 50, "c": 20}), seed=3)
    weights = {"a": 0.6, "b": 0.3, "c": 0.1}
    drawn = [r for _ in range(200) for r in sampler.next_batch(10, weights)]
    counts = Counter(r.category for r in drawn)
    for c, w in weights.items():
        assert abs(counts[c] / len(drawn) - w) < 0.04, (c, counts)
    first_a = [r.id for r in drawn if r.category == "a"][:5]
    assert sorted(first_a) == [f"a{i}" for i in range(5)]  # a whole round before any repeat


def test_the_same_seed_draws_the_same_rows_and_a_resume_goes_on_where_it_stopped():
    p = pool({"a": 7, "b": 3})
    weights = {"a": 0.5, "b": 0.5}
    whole = ReplaySampler(p, seed=11)
    expected = [[r.id for r in whole.next_batch(4, weights)] for _ in range(6)]
    first = ReplaySampler(p, seed=11)
    got = [[r.id for r in first.next_batch(4, weights)] for _ in range(3)]
    resumed = ReplaySampler(p, seed=11)
    resumed.load_state_dict(first.state_dict())
    got += [[r.id for r in resumed.next_batch(4, weights)] for _ in range(3)]
    assert got == expected
    assert [[r.id for r in ReplaySampler(p, seed=12).next_batch(4, weights)] for _ in range(6)] != expected
    assert ReplaySampler(p, seed=12).state_problem(first.state_dict(), 3) == "made with seed=11, not 12"
