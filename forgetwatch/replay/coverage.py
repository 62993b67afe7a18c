"""What a replay pool can repair: the probe categories its rows cover, and the forgetting it
cannot reach for want of rows. A probe category is *covered* when some pool row has it; pool
categories that name no probe category (``"all"``, say) are *general*.

Example:
    >>> cov = coverage(["facts", "all"], ["facts", "refusal"])
    >>> cov.covered, cov.uncovered, cov.general
    (('facts',), ('refusal',), ('all',))
    >>> report = TransitionReport(by_category={"facts": TransitionReport(n=20, forgotten=1),
    ...                                        "refusal": TransitionReport(n=40, forgotten=9)})
    >>> uncovered_losses(report, cov, floor=0.05)
    {'refusal': Loss(forgotten=9, n=40, rate=0.225)}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from forgetwatch.common.text import listing, pct, shorten
from forgetwatch.results.report import TransitionReport

__all__ = ["Coverage", "Loss", "coverage", "uncovered_losses", "uncovered_message"]


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


def coverage(pool_categories: Iterable[str], probe_categories: Iterable[str]) -> Coverage:
    """Which of ``probe_categories`` the pool's rows (of ``pool_categories``) cover.

    Example:
        >>> coverage(["arithmetic", "facts"], ["facts", "refusal", "arithmetic"])
        Coverage(covered=('arithmetic', 'facts'), uncovered=('refusal',), general=())
    """
    pool, probes = set(pool_categories), set(probe_categories)
    return Coverage(tuple(sorted(pool & probes)), tuple(sorted(probes - pool)), tuple(sorted(pool - probes)))


def uncovered_losses(
    report: TransitionReport, coverage: Coverage, least: int = 2, floor: float | Mapping[str, float] = 0.0
) -> dict[str, Loss]:
    """The uncovered categories that forgot at least ``least`` probes at a rate (forgotten over
    ``n``) above ``floor``: one number, or one per category (missing: 0). The caller chooses it,
    e.g. twice the category's noise floor. Empty when the pool does not tell
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


def uncovered_message(category: str, loss: Loss, coverage: Coverage) -> str:
    """The warning, once per category per run, that replay cannot repair ``category``'s losses.

    Example:
        >>> print(uncovered_message("refusal", Loss(9, 40, 0.225), coverage(["arithmetic", "facts"],
        ...                                                               ["arithmetic", "facts", "refusal"])))
        9 of the 40 'refusal' probes are forgotten (22%), and the replay pool has no 'refusal' rows (it covers arithmetic, facts): replay cannot repair them; add rows of category 'refusal' to the pool
    """
    name = shorten(category)
    return (
        f"{loss.forgotten} of the {loss.n} {name} probes are forgotten ({pct(loss.rate, digits=0)}), "
        f"and the replay pool has no {name} rows (it covers {listing(coverage.covered)}): replay cannot "
        f"repair them; add rows of category {name} to the pool"
    )
