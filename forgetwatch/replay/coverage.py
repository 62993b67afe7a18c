"""What a replay pool can repair: the probe categories its rows cover, the forgetting
``replay_weight="auto"`` steers on, the forgetting it cannot reach, and behaviour it spills
onto other categories. Pure functions of the categories and a
:class:`~forgetwatch.results.report.TransitionReport`.

A probe category is *covered* when some pool row has that category; the others are
*uncovered*. Pool categories that name no probe category (``"all"``, say) are *general*: when
the pool has only those, nothing can be told apart and the whole of the forgetting counts
(:func:`covered_forgetting` gives the overall figure, :func:`uncovered_losses` finds nothing).

Example:
    >>> cov = coverage(["facts", "all"], ["facts", "refusal"])
    >>> cov.covered, cov.uncovered, cov.general
    (('facts',), ('refusal',), ('all',))
    >>> report = TransitionReport(n=60, forgotten=10, forgetting=10 / 60, by_category={
    ...     "facts": TransitionReport(n=20, forgotten=1, forgetting=0.05),
    ...     "refusal": TransitionReport(n=40, forgotten=9, forgetting=0.225)})
    >>> covered_forgetting(report, cov, "forgetting")       # 1 of the 20 covered probes
    0.05
    >>> uncovered_losses(report, cov, floor=0.05)
    {'refusal': Loss(forgotten=9, n=40, rate=0.225)}
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from forgetwatch.behaviour.drift import SHARES
from forgetwatch.common.text import listing, pct, shorten
from forgetwatch.results.report import TransitionReport

__all__ = [
    "Coverage",
    "Loss",
    "Spill",
    "coverage",
    "covered_forgetting",
    "spill_over",
    "steering_note",
    "uncovered_losses",
    "uncovered_message",
]

#: A share of responses marks a category when it is at least this inside it at the base...
MARKS_INSIDE = 0.5
#: ...and at most this over the other categories' responses at the base.
MARKS_OUTSIDE = 0.2


@dataclass(frozen=True)
class Coverage:
    """Which probe categories a pool covers (sorted tuples).

    Attributes:
        covered: probe categories some pool row has.
        uncovered: probe categories no pool row has.
        general: pool categories that name no probe category.
    """

    covered: tuple[str, ...]
    uncovered: tuple[str, ...]
    general: tuple[str, ...]

    @property
    def tells_apart(self) -> bool:
        """Whether some probe categories are covered and others not: only then does the
        covered forgetting differ from the whole.

        Example:
            >>> coverage(["all"], ["a", "b"]).tells_apart, coverage(["a"], ["a", "b"]).tells_apart
            (False, True)
        """
        return bool(self.covered) and bool(self.uncovered)


class Loss(NamedTuple):
    """Forgetting in an uncovered category: ``forgotten`` of ``n`` probes, ``rate`` their share."""

    forgotten: int
    n: int
    rate: float


@dataclass(frozen=True)
class Spill:
    """Behaviour a replayed category carries, rising on the other categories' responses:
    ``share`` (one of :data:`~forgetwatch.behaviour.drift.SHARES`) is ``now`` over their
    responses, against ``base`` at the base.

    Example:
        >>> Spill("refusal", "refusals", now=0.14, base=0.06).note()
        "refusals outside 'refusal' 14% (base 6%) while replaying it"
    """

    category: str
    share: str
    now: float
    base: float

    @property
    def rise(self) -> float:
        """How far the share rose: ``now - base``."""
        return self.now - self.base

    def note(self) -> str:
        """The console note: what spilled, where from, and by how much."""
        return (
            f"{self.share} outside {shorten(self.category)} {pct(self.now, digits=0)} "
            f"(base {pct(self.base, digits=0)}) while replaying it"
        )


def coverage(pool_categories: Iterable[str], probe_categories: Iterable[str]) -> Coverage:
    """Which of ``probe_categories`` the pool's rows (of ``pool_categories``) cover.

    Example:
        >>> coverage(["arithmetic", "facts"], ["facts", "refusal", "arithmetic"])
        Coverage(covered=('arithmetic', 'facts'), uncovered=('refusal',), general=())
    """
    pool, probes = set(pool_categories), set(probe_categories)
    return Coverage(tuple(sorted(pool & probes)), tuple(sorted(probes - pool)), tuple(sorted(pool - probes)))


def covered_forgetting(report: TransitionReport, coverage: Coverage, metric: str) -> float:
    """The stop ``metric`` over the covered categories: ``Σ forgotten / Σ n`` for
    ``"forgetting"``, the ``n``-weighted mean of the categories' figures (those that apply) for
    ``"forgetting_adjusted"``; NaN when none applies. The overall figure when the pool does not
    tell categories apart (it covers none, or all of them).

    Example:
        >>> r = TransitionReport(forgetting_adjusted=0.3, by_category={
        ...     "a": TransitionReport(n=10, forgetting_adjusted=0.1),
        ...     "b": TransitionReport(n=30, forgetting_adjusted=0.3),
        ...     "c": TransitionReport(n=50, forgetting_adjusted=0.9)})
        >>> round(covered_forgetting(r, coverage(["a", "b"], ["a", "b", "c"]), "forgetting_adjusted"), 3)
        0.25
        >>> covered_forgetting(r, coverage(["all"], ["a", "b", "c"]), "forgetting_adjusted")
        0.3
    """
    if metric not in ("forgetting", "forgetting_adjusted"):
        raise ValueError(f"metric must be 'forgetting' or 'forgetting_adjusted', not {shorten(metric)}")
    if not coverage.tells_apart:
        return getattr(report, metric)
    parts = [report.by_category[c] for c in coverage.covered if c in report.by_category]
    parts = [r for r in parts if r.n > 0]
    if metric == "forgetting":
        n = sum(r.n for r in parts)
        return sum(r.forgotten for r in parts) / n if n else math.nan
    parts = [r for r in parts if math.isfinite(r.forgetting_adjusted)]
    n = sum(r.n for r in parts)
    return sum(r.n * r.forgetting_adjusted for r in parts) / n if n else math.nan


def uncovered_losses(
    report: TransitionReport, coverage: Coverage, least: int = 2, floor: float | Mapping[str, float] = 0.0
) -> dict[str, Loss]:
    """The uncovered categories that forgot at least ``least`` probes at a rate (forgotten over
    ``n``) above ``floor``: one number, or one per category (missing: 0). The caller chooses it,
    e.g. ``max(target or 0, 2 * the category's noise floor)``. Empty when the pool does not tell
    categories apart.

    Example:
        >>> r = TransitionReport(by_category={"a": TransitionReport(n=10, forgotten=3),
        ...                                   "b": TransitionReport(n=10, forgotten=1),
        ...                                   "c": TransitionReport(n=100, forgotten=4)})
        >>> uncovered_losses(r, coverage(["x", "a"], ["a", "b", "c"]), floor={"c": 0.05})
        {}
        >>> uncovered_losses(r, coverage(["a"], ["a", "b", "c"]), floor={"c": 0.03})
        {'c': Loss(forgotten=4, n=100, rate=0.04)}
    """
    if not coverage.tells_apart:
        return {}
    out = {}
    for c in coverage.uncovered:
        r = report.by_category.get(c)
        if r is None or r.n <= 0 or r.forgotten < least:
            continue
        rate = r.forgotten / r.n
        if rate > (floor.get(c, 0.0) if isinstance(floor, Mapping) else floor):
            out[c] = Loss(r.forgotten, r.n, rate)
    return out


def uncovered_message(category: str, loss: Loss, coverage: Coverage, steering: bool = True) -> str:
    """The warning, once per category per run, that replay cannot repair ``category``'s losses
    (``steering``: the weight is ``"auto"``, and does not steer on them either).

    Example:
        >>> print(uncovered_message("refusal", Loss(9, 40, 0.225), coverage(["arithmetic", "facts"],
        ...                                                               ["arithmetic", "facts", "refusal"])))
        9 of the 40 'refusal' probes are forgotten (22%), and the replay pool has no 'refusal' rows (it covers arithmetic, facts): replay cannot repair them and replay_weight='auto' does not steer on them; add rows of category 'refusal' to the pool
    """
    name = shorten(category)
    steers = " and replay_weight='auto' does not steer on them" if steering else ""
    return (
        f"{loss.forgotten} of the {loss.n} {name} probes are forgotten ({pct(loss.rate, digits=0)}), "
        f"and the replay pool has no {name} rows (it covers {listing(coverage.covered)}): replay cannot "
        f"repair them{steers}; add rows of category {name} to the pool"
    )


def steering_note(coverage: Coverage) -> str | None:
    """What ``replay_weight="auto"`` steers on, said once at the start when it is all of the
    forgetting for want of categories; ``None`` otherwise.

    Example:
        >>> steering_note(coverage(["all"], ["a", "b"]))
        "the pool's categories name no probe category; replay_weight='auto' steers on all of the forgetting"
        >>> steering_note(coverage(["a"], ["a", "b"])) is None
        True
    """
    if coverage.covered:
        return None
    return "the pool's categories name no probe category; replay_weight='auto' steers on all of the forgetting"


def spill_over(report: TransitionReport, coverage: Coverage, min_rise: float = 0.05) -> list[Spill]:
    """The behaviour shares that covered categories carry and that rose on the other
    categories' responses.

    A share (of :data:`~forgetwatch.behaviour.drift.SHARES`) marks a covered category ``c`` when,
    at the base, it is at least :data:`MARKS_INSIDE` over ``c``'s responses and at most
    :data:`MARKS_OUTSIDE` over the other categories' responses. It spills when, over those
    other responses, it now is at least ``min_rise`` above the base and at least twice the base.
    Over several categories a share is the mean of theirs weighted by each category's ``n``
    (the report keeps no count of responses: a category that mixes generated and
    multiple-choice probes weighs a little more than its responses). Categories without
    generated responses (no ``behaviour`` figures) take no part.

    Example:
        >>> def cat(n, now, base):
        ...     return TransitionReport(n=n, behaviour={"refusals": now, "refusals_base": base})
        >>> r = TransitionReport(by_category={"refusal": cat(10, 0.9, 0.9), "facts": cat(20, 0.3, 0.1),
        ...                                   "math": cat(20, 0.0, 0.0)})
        >>> [s.note() for s in spill_over(r, coverage(["refusal"], ["refusal", "facts", "math"]))]
        ["refusals outside 'refusal' 15% (base 5%) while replaying it"]
    """
    behaving = {c: r for c, r in report.by_category.items() if r.behaviour and r.n > 0}
    spills = []
    for c in coverage.covered:
        if c not in behaving:
            continue
        others = [r for o, r in behaving.items() if o != c]
        for share in SHARES:
            inside = behaving[c].behaviour.get(f"{share}_base")
            base, now = _mean(others, f"{share}_base"), _mean(others, share)
            if inside is None or not (inside >= MARKS_INSIDE and base <= MARKS_OUTSIDE):
                continue
            if now - base >= min_rise and now >= 2 * base:
                spills.append(Spill(c, share, now, base))
    return spills


def _mean(reports: list[TransitionReport], key: str) -> float:
    """``key``'s figure over ``reports``, weighted by ``n`` (NaN when none has it)."""
    have = [(r.n, r.behaviour[key]) for r in reports if math.isfinite(r.behaviour.get(key, math.nan))]
    n = sum(k for k, _ in have)
    return sum(k * v for k, v in have) / n if n else math.nan
