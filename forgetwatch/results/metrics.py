"""Forgetting metrics, pure functions over per-sample transitions between a base model and the current one
(after Harmon et al., ICLR 2026: F = n(1→0)/N, BT = n(0→1)/N; see docs/measures.md)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike

from forgetwatch.behaviour.drift import behaviour_figures, measure
from forgetwatch.results.answers import Answers
from forgetwatch.results.report import TransitionReport

#: Two-sided 95 % standard-normal quantile.
Z95 = 1.959963984540054


class ChanceAdjusted(NamedTuple):
    forgetting_adjusted: float
    backward_transfer_adjusted: float
    forgetting_max: float
    backward_transfer_max: float


def _pair(before: ArrayLike, after: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    b, a = np.asarray(before, dtype=bool), np.asarray(after, dtype=bool)
    if b.ndim != 1 or b.shape != a.shape:
        raise ValueError(f"before and after must be 1-D and of equal length; got shapes {b.shape} and {a.shape}")
    return b, a


def _ratio(x: float, n: float) -> float:
    return float(x) / float(n) if n else math.nan


def transition_counts(before: ArrayLike, after: ArrayLike) -> tuple[int, int, int, int]:
    """Count the transitions between per-sample correctness before and after: ``(n00, n01, n10, n11)``."""
    b, a = _pair(before, after)
    n00, n01, n10, n11 = (int(np.count_nonzero(x)) for x in (~b & ~a, ~b & a, b & ~a, b & a))
    return n00, n01, n10, n11


def chance_adjusted(before: ArrayLike, after: ArrayLike, k: ArrayLike) -> ChanceAdjusted:
    """Forgetting and backward transfer corrected for lucky guesses, with their ceilings, per group of equal ``k``
    (each sample's number of choices, 0 for generative: no chance term), averaged weighted by size."""
    b, a = _pair(before, after)
    ks = np.broadcast_to(np.asarray(k, dtype=np.int64), b.shape)
    if not len(b):
        return ChanceAdjusted(math.nan, math.nan, math.nan, math.nan)
    bad = sorted({int(x) for x in ks if x == 1 or x < 0})
    if bad:
        raise ValueError(f"number of choices must be 0 (generative) or at least 2; got {bad}")
    total = np.zeros(4)
    for k in np.unique(ks).tolist():
        mask = ks == k
        a_pre, a_post = b[mask].mean(), a[mask].mean()
        f, bt = (b & ~a)[mask].mean(), (~b & a)[mask].mean()
        if k == 0:  # generative: nobody guesses right by luck (the k → ∞ limit)
            group = (f, bt, a_pre, a_post)
        else:
            # "knows, or guesses uniformly; before and after independent": a lucky guess before then a miss after
            # looks like forgetting (and the reverse like backward transfer)
            chance = (1 - a_pre) * (1 - a_post) / (k - 1)
            ceilings = [max((k * x - 1) / (k - 1), 0.0) for x in (a_pre, a_post)]
            group = (max(f - chance, 0.0), max(bt - chance, 0.0), *ceilings)
        total += mask.mean() * np.array(group)
    return ChanceAdjusted(*total.tolist())


def wilson_interval(x: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for the proportion ``x / n``; ``(nan, nan)`` when ``n == 0``."""
    if n < 0 or not 0 <= x <= max(n, 0):
        raise ValueError(f"need 0 <= x <= n; got x={x}, n={n}")
    if n == 0:
        return (math.nan, math.nan)
    p, z2 = x / n, z * z
    denom = 1 + z2 / n
    center = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    # at x = 0 (x = n) the bound is exactly 0 (1), but center − half only gets there up to rounding
    low = 0.0 if x == 0 else max(center - half, 0.0)
    high = 1.0 if x == n else min(center + half, 1.0)
    return (low, high)


def mcnemar_exact(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value for discordant counts ``b`` (0→1) and ``c`` (1→0), in log space."""
    if b < 0 or c < 0:
        raise ValueError(f"counts must be non-negative; got b={b}, c={c}")
    m, k = int(b) + int(c), min(int(b), int(c))
    if m == 0:
        return 1.0

    def log_pmf(i: int) -> float:
        return math.lgamma(m + 1) - math.lgamma(i + 1) - math.lgamma(m - i + 1) - m * math.log(2.0)

    # k <= m/2: the pmf falls as i goes down from k; summed relative to the largest term, stopped below e^-60 of it
    top, scaled_sum = log_pmf(k), 0.0
    for i in range(k, -1, -1):
        if (rel := log_pmf(i) - top) < -60.0:
            break
        scaled_sum += math.exp(rel)
    return math.exp(min(math.log(2.0) + top + math.log(scaled_sum), 0.0))


def logprob_drop(gold_before: ArrayLike, gold_after: ArrayLike, correct_before: ArrayLike) -> float:
    """Mean fall of the gold answer's log-probability over base-correct samples where it was scored (NaN: none)."""
    gb, ga = np.asarray(gold_before, dtype=np.float64), np.asarray(gold_after, dtype=np.float64)
    mask = np.asarray(correct_before, dtype=bool) & np.isfinite(gb) & np.isfinite(ga)
    if not mask.any():
        return math.nan
    return float(np.mean(gb[mask] - ga[mask]))


def margins(gold_logprob: ArrayLike, choice_logprobs: Sequence[ArrayLike], normalized: bool = False) -> np.ndarray:
    """Each sample's drift signal: the gold choice's log-probability minus the best other's (NaN when
    ``normalized``: raw scores do not order those), or a generative probe's reference's log-probability."""
    gold = np.asarray(gold_logprob, dtype=np.float64)
    out = gold.copy()
    for i, lps in enumerate(choice_logprobs):
        lps = np.asarray(lps, dtype=np.float64)
        if len(lps) > 1 and normalized:
            out[i] = np.nan
        elif len(lps) > 1:
            others = lps[lps != gold[i]] if np.count_nonzero(lps == gold[i]) == 1 else lps
            out[i] = gold[i] - others.max()
    return out


def drift_signal(answers: Answers) -> np.ndarray:
    """:func:`margins` of ``answers``, under their own scoring."""
    return margins(answers.gold_logprob, answers.choice_logprobs, answers.scoring.get("normalize") == "chars")


def at_risk(
    correct_before: ArrayLike,
    correct_after: ArrayLike,
    signal_before: ArrayLike,
    signal_after: ArrayLike,
    n_choices: ArrayLike,
    share: float = 0.5,
    floor: float = 0.1,
) -> np.ndarray:
    """Which samples are still right but slipping: a margin (:func:`margins`) below ``share`` of the base's or
    below ``floor`` nats; for a generative probe, its reference's probability below ``share`` of the base's."""
    before, after = np.asarray(correct_before, dtype=bool), np.asarray(correct_after, dtype=bool)
    sb, sa = np.asarray(signal_before, dtype=np.float64), np.asarray(signal_after, dtype=np.float64)
    choice = np.asarray(n_choices) > 0
    with np.errstate(invalid="ignore"):
        below_share = np.isfinite(sb) & np.where(choice, sa < share * sb, sa < sb + math.log(share))
        slipping = below_share | (choice & (sa < floor))
    return before & after & np.isfinite(sa) & slipping


def seed_agreement(before: ArrayLike, after: ArrayLike) -> list[dict[str, float]]:
    """Transitions several seeds agree on (Harmon et al.): ``before``, ``after`` probes x seeds, seed i paired with
    seed i. Per size m, over every combination of m seeds: the mean and (population) variance of how many probes
    went 1->0 (and 0->1) under each of its seeds."""
    b, a = np.asarray(before, dtype=bool), np.asarray(after, dtype=bool)
    lost, won = b & ~a, ~b & a
    out = []
    for m in range(1, b.shape[1] + 1):
        combos = [list(c) for c in itertools.combinations(range(b.shape[1]), m)]
        figures: dict[str, float] = {"seeds": m, "combinations": len(combos)}
        for name, flips in (("forgotten", lost), ("gained", won)):
            counts = np.array([flips[:, c].all(axis=1).sum() for c in combos], dtype=np.float64)
            figures |= {f"{name}_mean": float(counts.mean()), f"{name}_var": float(counts.var())}
        out.append(figures)
    return out


def robust_figures(groups: Sequence[str | None], before: ArrayLike, after: ArrayLike) -> dict[str, Any]:
    """Rephrasing (CapTrack's C5a): the share of groups right under every wording before and after, and the groups
    right under every wording before and not after ("robustness forgetting"); empty without groups."""
    b, a = np.asarray(before, dtype=bool), np.asarray(after, dtype=bool)
    members: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        if g is not None:
            members.setdefault(g, []).append(i)
    if not members:
        return {}
    names = sorted(members)
    right_before = np.array([b[members[g]].all() for g in names])
    right_after = np.array([a[members[g]].all() for g in names])
    broke = [g for g, x, y in zip(names, right_before, right_after) if x and not y]
    return {
        "robust_accuracy_before": float(right_before.mean()),
        "robust_accuracy_after": float(right_after.mean()),
        "robust_forgotten": len(broke),
        "robust_forgotten_groups": broke,
    }


def _log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def choice_kl(logprobs_before: Sequence[ArrayLike], logprobs_after: Sequence[ArrayLike]) -> float:
    """Mean KL(p_base ‖ p_current) over samples with choices (p: softmax of their log-probabilities); NaN: none."""
    if len(logprobs_before) != len(logprobs_after):
        raise ValueError(
            f"need one entry per sample on both sides; got {len(logprobs_before)} and {len(logprobs_after)}"
        )
    groups: dict[int, list[int]] = {}  # by number of choices: one 2-D computation each
    before = [np.asarray(x, dtype=np.float64) for x in logprobs_before]
    after = [np.asarray(x, dtype=np.float64) for x in logprobs_after]
    for i, (x, y) in enumerate(zip(before, after)):
        if len(x) != len(y):
            raise ValueError(f"sample {i}: {len(x)} choices before but {len(y)} after")
        if len(x):
            groups.setdefault(len(x), []).append(i)
    if not groups:
        return math.nan
    total, count = 0.0, 0
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        for rows in groups.values():
            lp = _log_softmax(np.stack([before[i] for i in rows]))
            lq = _log_softmax(np.stack([after[i] for i in rows]))
            p = np.exp(lp)
            terms = np.where(p > 0, p * (lp - lq), 0.0)  # 0·log 0 = 0, even where q = 0 too
            # KL >= 0: rounding noise below zero clipped
            total += float(np.maximum(terms.sum(axis=1), 0.0).sum())
            count += len(rows)
    return total / count


def _report(
    base: Answers,
    current: Answers,
    idx: np.ndarray,
    risky: np.ndarray,
    measured: Sequence[Any],
    by_category: dict[str, TransitionReport] | None = None,
) -> TransitionReport:
    before, after = base.correct[idx], current.correct[idx]
    n00, n01, n10, n11 = transition_counts(before, after)
    n = len(idx)
    agreed: dict[str, Any] = {}
    if base.samples_correct is not None and current.samples_correct is not None:  # sampled: the seeds' agreement
        agreement = seed_agreement(base.samples_correct[idx], current.samples_correct[idx])
        every = agreement[-1]  # the one combination of all seeds: its mean is a count
        agreed = {"forgotten_agreed": round(every["forgotten_mean"]), "gained_agreed": round(every["gained_mean"])}
        agreed["agreement"] = agreement
    if base.groups is not None:  # rephrasings: right under every wording of a question
        agreed.update(robust_figures([base.groups[i] for i in idx], before, after))
    return TransitionReport(
        n=n,
        forgotten=n10,
        gained=n01,
        kept=n11,
        never=n00,
        accuracy_before=_ratio(n10 + n11, n),
        accuracy_after=_ratio(n01 + n11, n),
        forgetting=_ratio(n10, n),
        backward_transfer=_ratio(n01, n),
        **chance_adjusted(before, after, base.n_choices[idx])._asdict(),
        forgetting_relative=_ratio(n10, n10 + n11),
        backward_transfer_relative=_ratio(n01, n00 + n01),
        forgetting_ci=wilson_interval(n10, n),
        backward_transfer_ci=wilson_interval(n01, n),
        mcnemar_p=mcnemar_exact(n01, n10),
        logprob_drop=logprob_drop(base.gold_logprob[idx], current.gold_logprob[idx], before),
        choice_kl=choice_kl([base.choice_logprobs[i] for i in idx], [current.choice_logprobs[i] for i in idx]),
        forgotten_ids=[base.ids[i] for i in idx[before & ~after]],
        gained_ids=[base.ids[i] for i in idx[~before & after]],
        at_risk=_ratio(int(risky[idx].sum()), n),
        at_risk_ids=[base.ids[i] for i in idx[risky[idx]]],
        behaviour=behaviour_figures(*measured, idx),
        by_category=by_category or {},
        **agreed,
    )


def compare(
    base: Answers,
    current: Answers,
    *,
    at_risk_share: float = 0.5,
    at_risk_floor: float = 0.1,
    refusal_detector: Callable[[str], bool] | None = None,
    count_tokens: Callable[[list[str]], list[int]] | None = None,
    categories: Sequence[str] | None = None,
) -> TransitionReport:
    """Compare the current model's answers with the base model's on the same probes: a report over all samples,
    with one per category in ``by_category``. Raises :class:`~forgetwatch.AnswersMismatchError` for other probes.

    Args:
        at_risk_share: a still-right sample is at risk below this share of its base margin (:func:`at_risk`).
        at_risk_floor: ... or below this margin in nats.
        refusal_detector: ``response -> bool``, for the behaviour figures' refusals.
        count_tokens: texts' token lengths, for the behaviour figures.
        categories: each probe's category in place of the answers' (such as its group).

    Example:
        >>> report = compare(base_answers, current_answers)  # doctest: +SKIP
        >>> print(report.summary())  # doctest: +SKIP
    """
    base.check_compatible(current)
    positions: dict[str, list[int]] = {}
    for i, cat in enumerate(base.categories if categories is None else categories):
        positions.setdefault(cat, []).append(i)
    before, after = drift_signal(base), drift_signal(current)
    risky = at_risk(base.correct, current.correct, before, after, base.n_choices, at_risk_share, at_risk_floor)
    measured = [measure(a.outputs, refusal_detector, count_tokens) for a in (base, current)]
    by_category = {
        cat: _report(base, current, np.array(positions[cat], dtype=np.int64), risky, measured)
        for cat in sorted(positions)
    }
    return _report(base, current, np.arange(len(base), dtype=np.int64), risky, measured, by_category)
