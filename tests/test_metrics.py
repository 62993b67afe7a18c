"""Tests for forgetwatch.results.metrics and forgetwatch.results.report against hand-computed cases."""

from __future__ import annotations

import csv
import json
import math
import random
import warnings
from fractions import Fraction as Fr

import numpy as np
import pytest

from forgetwatch.results.answers import Answers, AnswersMismatchError
from forgetwatch.results.metrics import (
    Z95,
    chance_adjusted,
    choice_kl,
    compare,
    logprob_drop,
    mcnemar_exact,
    transition_counts,
    wilson_interval,
)
from forgetwatch.results.report import FORMULA_START, ROW_COLUMNS, SAMPLE_COLUMNS, TransitionReport, write_samples_csv

FP = "fp-test"


def make(
    correct, k=4, categories=None, logprobs=None, gold=None, ids=None, fingerprint=FP, scoring=None, predicted=None
):
    """Answers from per-sample lists; ``k`` may be an int or a list (0 = generative)."""
    n = len(correct)
    ks = k if isinstance(k, list) else [k] * n
    samples = []
    for i in range(n):
        if ks[i]:
            lp = logprobs[i] if logprobs else [0.0 if j == 0 else -1.0 for j in range(ks[i])]
            g = gold[i] if gold else lp[0]
            pred = predicted[i] if predicted else (0 if correct[i] else 1)
        else:
            lp, g = [], gold[i] if gold else None
            pred = predicted[i] if predicted else ("yes" if correct[i] else None)
        samples.append(
            dict(
                id=ids[i] if ids else f"q{i}",
                correct=bool(correct[i]),
                predicted=pred,
                choice_logprobs=lp,
                gold_logprob=g,
                n_choices=ks[i],
                category=categories[i] if categories else "all",
            )
        )
    return Answers.from_samples(fingerprint, scoring or {}, samples)


def approx(x):
    return pytest.approx(float(x), rel=1e-12, abs=1e-15)


def is_nan(x):
    return isinstance(x, float) and math.isnan(x)


# -- counts and hand-computed reports ------------------------------------------------------------


def test_transition_counts_and_length_mismatch():
    assert transition_counts([1, 1, 0, 0, 1], [1, 0, 1, 0, 1]) == (1, 1, 1, 2)
    with pytest.raises(ValueError):
        transition_counts([1, 0], [1])


def test_empty_probe_set_gives_nan_rates_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = compare(make([]), make([]))
        text = r.summary()
        d = r.to_dict()
    assert (r.n, r.forgotten, r.gained, r.kept, r.never) == (0, 0, 0, 0, 0)
    for name in (
        "accuracy_before",
        "accuracy_after",
        "forgetting",
        "backward_transfer",
        "forgetting_adjusted",
        "backward_transfer_adjusted",
        "forgetting_max",
        "backward_transfer_max",
        "forgetting_relative",
        "backward_transfer_relative",
        "logprob_drop",
        "choice_kl",
    ):
        assert is_nan(getattr(r, name)), name
    assert r.mcnemar_p == 1.0
    assert all(map(math.isnan, r.forgetting_ci + r.backward_transfer_ci))
    assert r.forgotten_ids == [] and r.gained_ids == [] and r.by_category == {}
    assert "overall" in text
    json.dumps(d, allow_nan=False)


def test_all_correct_before_and_after():
    r = compare(make([1] * 5, k=4), make([1] * 5, k=4))
    assert (r.kept, r.forgotten, r.gained, r.never) == (5, 0, 0, 0)
    assert r.accuracy_before == 1.0 and r.accuracy_after == 1.0
    assert r.forgetting == 0.0 and r.backward_transfer == 0.0
    # a_pre = a_post = 1: no chance term, ceilings (4·1 − 1)/3 = 1
    assert r.forgetting_adjusted == 0.0 and r.backward_transfer_adjusted == 0.0
    assert r.forgetting_max == approx(1) and r.backward_transfer_max == approx(1)
    assert r.forgetting_relative == 0.0
    assert is_nan(r.backward_transfer_relative)  # nothing was wrong before
    assert r.mcnemar_p == 1.0


def test_two_choices_hand_computed():
    before = [1, 1, 1, 1, 1, 1, 0, 0]
    after = [1, 1, 1, 1, 0, 0, 1, 0]
    r = compare(make(before, k=2), make(after, k=2))
    assert (r.never, r.gained, r.forgotten, r.kept) == (1, 1, 2, 4)
    a_pre, a_post = Fr(6, 8), Fr(5, 8)
    f, bt = Fr(2, 8), Fr(1, 8)
    chance = (1 - a_pre) / (2 - 1) * (1 - a_post)  # = 3/32, same for F and BT
    assert chance == Fr(3, 32)
    assert r.accuracy_before == approx(a_pre) and r.accuracy_after == approx(a_post)
    assert r.forgetting == approx(f) and r.backward_transfer == approx(bt)
    assert r.forgetting_adjusted == approx(Fr(5, 32))
    assert r.backward_transfer_adjusted == approx(Fr(1, 32))
    assert r.forgetting_max == approx(Fr(1, 2))  # (2·3/4 − 1)/1
    assert r.backward_transfer_max == approx(Fr(1, 4))  # (2·5/8 − 1)/1
    assert r.forgetting_relative == approx(Fr(2, 6))
    assert r.backward_transfer_relative == approx(Fr(1, 2))
    # McNemar b = 1, c = 2: 2·P(X ≤ 1 | n=3) = 2·(1 + 3)/8 = 1
    assert r.mcnemar_p == 1.0
    assert r.forgetting_ci == wilson_interval(2, 8)
    assert r.backward_transfer_ci == wilson_interval(1, 8)


def test_mixed_choice_counts_group_and_clamp():
    # group k=2 (4 samples): before 1,1,0,0  after 1,0,0,0
    #   a_pre 1/2, a_post 1/4, F = 1/4 < F_chance = (1/2)/1·(3/4) = 3/8  -> clamps to 0
    #   BT = 0 < 3/8 -> 0;  F_max = (2·1/2 − 1)/1 = 0;  BT_max = max(2·1/4 − 1, 0) = 0
    # group k=4 (6 samples): before 1,1,1,1,1,0  after 1,1,1,0,0,1
    #   a_pre 5/6, a_post 2/3, F = 2/6, F_chance = (1/6)/3·(1/3) = 1/54 -> 17/54
    #   BT = 1/6, BT_chance = (1/6)·(1/3)/3 = 1/54 -> 8/54
    #   F_max = (4·5/6 − 1)/3 = 7/9;  BT_max = (4·2/3 − 1)/3 = 5/9
    # combined, weights 4/10 and 6/10
    k2 = [(1, 1), (1, 0), (0, 0), (0, 0)]
    k4 = [(1, 1), (1, 1), (1, 1), (1, 0), (1, 0), (0, 1)]
    # interleave so grouping cannot rely on position
    order = [("a", 0), ("b", 0), ("b", 1), ("a", 1), ("b", 2), ("b", 3), ("a", 2), ("b", 4), ("a", 3), ("b", 5)]
    before, after, ks = [], [], []
    for g, j in order:
        pair = (k2 if g == "a" else k4)[j]
        before.append(pair[0]), after.append(pair[1]), ks.append(2 if g == "a" else 4)
    w2, w4 = Fr(4, 10), Fr(6, 10)
    expected = (
        w2 * 0 + w4 * Fr(17, 54),
        w2 * 0 + w4 * Fr(8, 54),
        w2 * 0 + w4 * Fr(7, 9),
        w2 * 0 + w4 * Fr(5, 9),
    )
    assert expected == (Fr(17, 90), Fr(4, 45), Fr(7, 15), Fr(1, 3))
    got = chance_adjusted(before, after, ks)
    assert tuple(got) == tuple(approx(e) for e in expected)
    r = compare(make(before, k=ks), make(after, k=ks))
    assert (r.forgetting_adjusted, r.backward_transfer_adjusted, r.forgetting_max, r.backward_transfer_max) == tuple(
        approx(e) for e in expected
    )
    # without per-group clamping the k=2 group would subtract 4/10·1/8
    assert r.forgetting_adjusted != approx(Fr(17, 90) - Fr(4, 10) * Fr(1, 8))


def test_generative_only_has_no_chance_term():
    before, after = [1, 1, 0, 0, 1], [0, 1, 1, 0, 1]
    r = compare(make(before, k=0), make(after, k=0))
    assert r.forgetting == approx(Fr(1, 5)) and r.backward_transfer == approx(Fr(1, 5))
    assert r.forgetting_adjusted == r.forgetting
    assert r.backward_transfer_adjusted == r.backward_transfer
    assert r.forgetting_max == approx(Fr(3, 5))  # = a_pre
    assert r.backward_transfer_max == approx(Fr(3, 5))  # = a_post
    assert is_nan(r.logprob_drop) and is_nan(r.choice_kl)


def test_generative_and_multiple_choice_mixed():
    # generative (2): before 1,0 after 0,0 -> F 1/2, BT 0, F_max a_pre 1/2, BT_max a_post 0
    # k=3 (3): before 1,1,0 after 1,0,1 -> a 2/3, 2/3; F = BT = 1/3; chance (1/3)/2·(1/3) = 1/18
    #   F_adj = BT_adj = 5/18; F_max = BT_max = (3·2/3 − 1)/2 = 1/2
    before, after, ks = [1, 1, 0, 1, 0], [0, 1, 0, 0, 1], [0, 3, 0, 3, 3]
    got = chance_adjusted(before, after, ks)
    assert got.forgetting_adjusted == approx(Fr(2, 5) * Fr(1, 2) + Fr(3, 5) * Fr(5, 18))  # 11/30
    assert got.backward_transfer_adjusted == approx(Fr(3, 5) * Fr(5, 18))  # 1/6
    assert got.forgetting_max == approx(Fr(2, 5) * Fr(1, 2) + Fr(3, 5) * Fr(1, 2))  # 1/2
    assert got.backward_transfer_max == approx(Fr(3, 5) * Fr(1, 2))  # 3/10
    r = compare(make(before, k=ks), make(after, k=ks))
    assert r.forgetting_adjusted == approx(Fr(11, 30))
    assert r.forgetting == approx(Fr(2, 5))


def test_chance_adjusted_rejects_single_choice_and_handles_empty():
    with pytest.raises(ValueError, match="at least 2"):
        chance_adjusted([1, 0], [1, 1], [2, 1])
    assert all(map(math.isnan, chance_adjusted([], [], 4)))


def test_accuracy_identity_and_bounds_random():
    rng = np.random.default_rng(1234)
    for _ in range(300):
        n = int(rng.integers(1, 60))
        before = rng.random(n) < rng.random()
        after = rng.random(n) < rng.random()
        ks = [int(x) for x in rng.choice([0, 2, 3, 4, 5], size=n)]
        r = compare(make(before.tolist(), k=ks), make(after.tolist(), k=ks))
        assert r.never + r.gained + r.forgotten + r.kept == n
        assert r.accuracy_after - r.accuracy_before == pytest.approx((r.gained - r.forgotten) / n)
        assert r.backward_transfer - r.forgetting == pytest.approx(r.accuracy_after - r.accuracy_before)
        assert r.accuracy_before == pytest.approx(before.mean())
        assert 0 <= r.forgetting_adjusted <= r.forgetting + 1e-12
        assert 0 <= r.backward_transfer_adjusted <= r.backward_transfer + 1e-12
        assert 0 <= r.forgetting_max <= r.accuracy_before + 1e-12


# -- categories and ids --------------------------------------------------------------------------


def test_by_category_partitions_the_parent():
    rng = random.Random(7)
    cats = [rng.choice(["math", "law", "bio"]) for _ in range(40)]
    before = [rng.random() < 0.6 for _ in range(40)]
    after = [rng.random() < 0.5 for _ in range(40)]
    r = compare(make(before, categories=cats), make(after, categories=cats))
    assert list(r.by_category) == ["bio", "law", "math"]
    children = r.by_category.values()
    for name in ("n", "forgotten", "gained", "kept", "never"):
        assert sum(getattr(c, name) for c in children) == getattr(r, name), name
    assert sorted(i for c in children for i in c.forgotten_ids) == sorted(r.forgotten_ids)
    for cat, child in r.by_category.items():
        assert child.by_category == {}
        assert child.n == cats.count(cat)
        assert all(cats[int(i[1:])] == cat for i in child.forgotten_ids + child.gained_ids)


def test_forgotten_and_gained_ids_in_probe_order():
    ids = ["z", "b", "y", "a", "x", "c"]
    before = [1, 0, 1, 0, 1, 1]
    after = [0, 1, 1, 1, 0, 1]
    cats = ["m", "m", "n", "n", "m", "n"]
    r = compare(make(before, ids=ids, categories=cats), make(after, ids=ids, categories=cats))
    assert r.forgotten_ids == ["z", "x"]
    assert r.gained_ids == ["b", "a"]
    assert r.by_category["m"].forgotten_ids == ["z", "x"]
    assert r.by_category["n"].gained_ids == ["a"]


def test_relative_rates_and_zero_denominators():
    r = compare(make([1, 1, 1, 0], k=4), make([0, 1, 1, 1], k=4))
    assert r.forgetting_relative == approx(Fr(1, 3)) and r.backward_transfer_relative == 1.0
    r = compare(make([0, 0], k=4), make([1, 0], k=4))  # nothing correct before
    assert is_nan(r.forgetting_relative) and r.backward_transfer_relative == 0.5


# -- statistics ----------------------------------------------------------------------------------


def test_wilson_interval():
    low, high = wilson_interval(3, 10)
    # textbook 95 % Wilson interval for 3/10
    assert low == pytest.approx(0.10779, abs=1e-5) and high == pytest.approx(0.60322, abs=1e-5)
    assert all(map(math.isnan, wilson_interval(0, 0)))
    assert wilson_interval(0, 7)[0] == 0.0 and wilson_interval(7, 7)[1] == 1.0
    # a wider z gives a wider interval
    assert wilson_interval(3, 10, z=2.576)[0] < low
    assert Z95 == pytest.approx(1.959963984540054)
    with pytest.raises(ValueError):
        wilson_interval(4, 3)


def exact_mcnemar(b: int, c: int) -> Fr:
    m = b + c
    if m == 0:
        return Fr(1)
    tail = Fr(sum(math.comb(m, i) for i in range(min(b, c) + 1)), 2**m)
    return min(Fr(1), 2 * tail)


@pytest.mark.parametrize(
    "b,c", [(0, 1), (0, 5), (1, 2), (2, 9), (3, 3), (7, 20), (0, 40), (15, 45), (100, 140), (250, 400)]
)
def test_mcnemar_matches_exact_fraction(b, c):
    expected = float(exact_mcnemar(b, c))
    assert mcnemar_exact(b, c) == pytest.approx(expected, rel=1e-10, abs=1e-300)
    assert mcnemar_exact(c, b) == mcnemar_exact(b, c)


def test_mcnemar_edges_and_large_counts():
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(12, 12) == 1.0
    assert mcnemar_exact(0, 5) == pytest.approx(1 / 16)
    p = mcnemar_exact(20000, 20500)
    z = 500 / math.sqrt(40500)
    normal = math.erfc(z / math.sqrt(2))  # two-sided normal approximation, ~0.0130
    assert 0 < p < 1
    assert p == pytest.approx(normal, rel=0.05)
    assert mcnemar_exact(20500, 20000) == p
    # extreme imbalance still gives a tiny positive number, not 0 or NaN
    tiny = mcnemar_exact(0, 1000)
    assert tiny == pytest.approx(2.0**-999, rel=1e-9)


# -- continuous drift ----------------------------------------------------------------------------


def _plain_kl(x, y):
    mx, my = max(x), max(y)
    zx = sum(math.exp(v - mx) for v in x)
    zy = sum(math.exp(v - my) for v in y)
    total = 0.0
    for a, b in zip(x, y):
        lp = a - mx - math.log(zx)
        lq = b - my - math.log(zy)
        total += math.exp(lp) * (lp - lq)
    return total


def test_logprob_drop_and_choice_kl_match_plain_loop():
    rng = random.Random(3)
    n = 60
    ks = [rng.choice([0, 2, 4, 5]) for _ in range(n)]
    # far-from-zero log-probs: a naive exp would underflow to 0 and give NaN
    lp_b = [[rng.uniform(-900, -880) for _ in range(k)] for k in ks]
    lp_a = [[rng.uniform(-900, -880) for _ in range(k)] for k in ks]
    before = [rng.random() < 0.6 for _ in range(n)]
    after = [rng.random() < 0.6 for _ in range(n)]
    base = make(before, k=ks, logprobs=lp_b)
    cur = make(after, k=ks, logprobs=lp_a)

    drops = [lp_b[i][0] - lp_a[i][0] for i in range(n) if ks[i] and before[i]]
    kls = [_plain_kl(lp_b[i], lp_a[i]) for i in range(n) if ks[i]]
    expected_drop = sum(drops) / len(drops)
    expected_kl = sum(kls) / len(kls)

    r = compare(base, cur)
    assert r.logprob_drop == pytest.approx(expected_drop, rel=1e-12)
    assert r.choice_kl == pytest.approx(expected_kl, rel=1e-9)
    assert math.isfinite(r.choice_kl) and r.choice_kl > 0
    assert logprob_drop(base.gold_logprob, cur.gold_logprob, base.correct) == r.logprob_drop
    assert choice_kl(base.choice_logprobs, cur.choice_logprobs) == pytest.approx(expected_kl, rel=1e-9)


def test_at_risk_matches_a_plain_loop():
    rng = random.Random(5)
    n, share, floor = 400, 0.6, 0.2
    ks = [rng.choice([0, 0, 2, 4]) for _ in range(n)]
    lp_b = [[rng.uniform(-4, 0) for _ in range(k)] for k in ks]
    lp_a = [[x + rng.uniform(-1, 0.5) for x in row] for row in lp_b]
    gen_b = [rng.uniform(-6, 0) if not k else None for k in ks]
    gen_a = [g + rng.uniform(-2, 0.5) if g is not None else None for g in gen_b]
    gen_b[1:n:37] = [None] * len(gen_b[1:n:37])  # some references were never scored
    before = [rng.random() < 0.7 for _ in range(n)]
    after = [b and rng.random() < 0.8 for b in before]
    base = make(
        before,
        k=ks,
        logprobs=lp_b,
        gold=[row[0] if row else g for row, g in zip(lp_b, gen_b)],
        categories=[rng.choice("ab") for _ in range(n)],
    )
    cur = make(
        after,
        k=ks,
        logprobs=lp_a,
        gold=[row[0] if row else g for row, g in zip(lp_a, gen_a)],
        categories=list(base.categories),
    )

    expected = []
    for i in range(n):
        if not (before[i] and after[i]):
            continue
        if ks[i]:
            mb, ma = lp_b[i][0] - max(lp_b[i][1:]), lp_a[i][0] - max(lp_a[i][1:])
            risky = ma < share * mb or ma < floor
        else:
            risky = gen_b[i] is not None and math.exp(gen_a[i]) < share * math.exp(gen_b[i])
        if risky:
            expected.append(f"q{i}")

    r = compare(base, cur, at_risk_share=share, at_risk_floor=floor)
    assert r.at_risk_ids == expected and 20 < len(expected) < n / 2
    assert r.at_risk == len(expected) / n
    for cat, child in r.by_category.items():
        assert child.at_risk_ids == [i for i in expected if base.categories[base.ids.index(i)] == cat]


def test_at_risk_edges():
    from forgetwatch.results.metrics import at_risk, margins

    inf = float("inf")
    # every other choice impossible at the base: the floor still applies to the margin now
    assert at_risk([1], [1], [inf], [0.01], [2]).tolist() == [True]
    # a generative reference never scored at the base: nothing to compare with
    assert at_risk([1], [1], [float("nan")], [-9.0], [0]).tolist() == [False]
    # answers decided on per-character scores: raw log-prob margins do not order them, left out
    assert np.isnan(margins([-5.0], [[-5.0, -2.0]], normalized=True)).all()
    base = make([True], k=[2], logprobs=[[-5.0, -2.0]], scoring={"normalize": "chars"})
    assert compare(base, base).at_risk_ids == []


def test_choice_kl_hand_value_and_edges():
    # p = (1/2, 1/2), q = (3/4, 1/4): KL = 1/2·ln(2/3) + 1/2·ln(2) = 1/2·ln(4/3)
    assert choice_kl([[0.0, 0.0]], [[0.0, -math.log(3)]]) == pytest.approx(0.5 * math.log(4 / 3))
    assert choice_kl([[-1.0, -2.0, -3.0]], [[5.0, 4.0, 3.0]]) == pytest.approx(0.0, abs=1e-12)
    assert is_nan(choice_kl([[], []], [[], []]))
    with pytest.raises(ValueError):
        choice_kl([[0.0, 0.0]], [[0.0, 0.0, 0.0]])
    assert is_nan(logprob_drop([-1.0], [-2.0], [False]))  # no base-correct sample


# -- compatibility -------------------------------------------------------------------------------


def test_compare_rejects_incompatible_answers():
    base = make([1, 0, 1])
    with pytest.raises(AnswersMismatchError):
        compare(base, make([1, 0, 1], fingerprint="other"))
    with pytest.raises(AnswersMismatchError):
        compare(base, make([1, 0, 1], ids=["q0", "q1", "qX"]))
    with pytest.raises(AnswersMismatchError):
        compare(base, make([1, 0, 1], scoring={"max_new_tokens": 5}))
    with pytest.raises(AnswersMismatchError):
        write_samples_csv(base, make([1, 0, 1], fingerprint="other"), "/nonexistent/never.csv")


# -- output --------------------------------------------------------------------------------------


@pytest.fixture
def report_pair():
    cats = ["math", "law", "math", "bio", "law", "math"]
    ks = [4, 4, 0, 2, 4, 0]
    before = [1, 1, 0, 1, 0, 1]
    after = [0, 1, 1, 1, 0, 1]
    return (make(before, k=ks, categories=cats), make(after, k=ks, categories=cats))


def test_summary_lists_every_category(report_pair):
    r = compare(*report_pair)
    text = r.summary()
    lines = text.splitlines()
    assert lines[0].split()[:2] == ["category", "n"]
    assert "McNemar p" in lines[0]
    body = [line.split()[0] for line in lines[2 : 2 + 4]]
    assert body == ["overall", "bio", "law", "math"]
    assert str(r) == text
    assert isinstance(r, TransitionReport)


def test_to_dict_is_strict_json(report_pair):
    r = compare(*report_pair)
    d = r.to_dict()
    back = json.loads(json.dumps(d, allow_nan=False))
    assert back["n"] == 6 and back["forgotten"] == 1 and back["gained"] == 1
    assert back["forgetting_ci"] == list(r.forgetting_ci)
    assert set(back["by_category"]) == {"bio", "law", "math"}
    # bio has one sample, correct before: nothing was wrong, so BT_rel is NaN -> null
    assert back["by_category"]["bio"]["backward_transfer_relative"] is None
    assert back["by_category"]["bio"]["by_category"] == {}
    assert back["forgotten_ids"] == r.forgotten_ids


def test_to_csv_round_trip(report_pair, tmp_path):
    r = compare(*report_pair)
    path = r.to_csv(tmp_path / "out" / "transitions.csv")
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert reader.fieldnames == list(ROW_COLUMNS)
    assert ROW_COLUMNS[:8] == ("category", "n", "acc_before", "acc_after", "0->0", "0->1", "1->0", "1->1")
    assert [row["category"] for row in rows] == ["overall", "bio", "law", "math"]
    assert rows == [
        {k: ("" if is_nan(v) else str(float(f"{v:.6g}") if isinstance(v, float) else v)) for k, v in row.items()}
        for row in r.rows()
    ]
    math_row = rows[3]
    child = r.by_category["math"]
    assert int(math_row["n"]) == child.n == 3
    assert int(math_row["1->0"]) == child.forgotten and int(math_row["0->1"]) == child.gained
    assert float(math_row["forgetting"]) == pytest.approx(child.forgetting, rel=1e-5)
    assert float(math_row["mcnemar_p"]) == pytest.approx(child.mcnemar_p, rel=1e-5)


def test_write_samples_csv_round_trip(report_pair, tmp_path):
    base, cur = report_pair
    path = write_samples_csv(base, cur, tmp_path / "samples.csv")
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert reader.fieldnames == list(SAMPLE_COLUMNS)
    assert [row["id"] for row in rows] == base.ids
    assert [row["transition"] for row in rows] == ["1->0", "1->1", "0->1", "1->1", "0->0", "1->1"]
    assert rows[0]["correct_before"] == "1" and rows[0]["correct_after"] == "0"
    assert rows[0]["category"] == "math"
    # multiple choice: the index in its own column; the choice's text needs the probes (none here)
    assert rows[0]["choice_index_before"] == "0" and rows[0]["choice_index_after"] == "1"
    assert rows[0]["predicted_before"] == rows[0]["predicted_after"] == ""
    assert float(rows[0]["gold_logprob_before"]) == 0.0
    # generative sample: failed extraction is empty, NaN gold log-prob is empty
    assert rows[2]["predicted_before"] == "" and rows[2]["predicted_after"] == "yes"
    assert rows[2]["gold_logprob_before"] == "" and rows[2]["gold_logprob_after"] == ""


# -- CSV safety ----------------------------------------------------------------------------------

FORMULAS = ["=cmd|' /C calc'!A0", "+1+1", "-2+3", "@SUM(1)", "\tq", "\rq", "'=already quoted"]


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def undo_prefix(cell: str) -> str:
    """What a reader does to get the original text back (see report.spreadsheet_safe)."""
    return cell[1:] if cell.startswith("'") and cell.lstrip("'").startswith(FORMULA_START) else cell


def assert_no_formula_cells(rows):
    for row in rows:
        for cell in row.values():
            assert not cell.startswith(FORMULA_START) or _is_number(cell), repr(cell)


def _is_number(cell):
    try:
        float(cell)
    except ValueError:
        return False
    return True


def test_spreadsheet_safe():
    from forgetwatch.results.report import spreadsheet_safe

    assert [spreadsheet_safe(t) for t in FORMULAS] == [
        "'=cmd|' /C calc'!A0",
        "'+1+1",
        "'-2+3",
        "'@SUM(1)",
        "'\tq",
        "'\rq",
        "''=already quoted",
    ]
    for number in ["-3", "+4", "-0.5", "-1e-3", ".5"]:  # extracted answers stay numbers
        assert spreadsheet_safe(number) == number
    for text in ["q1", "'plain", "", "a=b", "-", "--", "-inf"]:
        assert undo_prefix(spreadsheet_safe(text)) == text
    for text in FORMULAS:
        assert undo_prefix(spreadsheet_safe(text)) == text


def test_csv_outputs_are_safe_and_exact(tmp_path):
    # ids and categories from users' data: formulas, a "\r" inside an id (was an unquoted row
    # break: 145 rows read back for 144 probes), and an extracted answer "-3"
    ids = [*FORMULAS, "line\rbreak", "plain", "q,comma", 'q"quote']
    cats = ['=HYPERLINK("http://x")', "+cat", "-cat", "@cat", "ok", "ok", "ok", "ok", "ok", "ok", "ok"]
    n = len(ids)
    before = make([1] * n, k=0, ids=ids, categories=cats, predicted=["-3"] * n)
    after = make([i % 2 for i in range(n)], k=0, ids=ids, categories=cats, predicted=["=2+5"] * n)

    rows = read_csv(write_samples_csv(before, after, tmp_path / "samples.csv"))
    assert len(rows) == n
    assert [undo_prefix(r["id"]) for r in rows] == ids
    assert [undo_prefix(r["category"]) for r in rows] == cats
    assert {r["predicted_before"] for r in rows} == {"-3"}
    assert {undo_prefix(r["predicted_after"]) for r in rows} == {"=2+5"}
    assert_no_formula_cells(rows)

    report = compare(before, after)
    rows = read_csv(report.to_csv(tmp_path / "transitions.csv"))
    assert len(rows) == 1 + len(set(cats))
    assert [undo_prefix(r["category"]) for r in rows[1:]] == list(report.by_category)
    assert_no_formula_cells(rows)
    # every text cell is quoted in the file itself
    first_data_line = (tmp_path / "transitions.csv").read_text(encoding="utf-8").splitlines()[1]
    assert first_data_line.startswith('"overall",')
