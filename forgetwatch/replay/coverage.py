"""What a replay pool can repair: the probe categories some row has (*covered*), those none has
(*uncovered*), and pool categories that name no probe category (*general*, such as ``"all"``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from forgetwatch.common.text import listing, pct, shorten
from forgetwatch.results.report import TransitionReport


@dataclass(frozen=True)
class Coverage:
    """Which probe categories a pool covers (sorted tuples)."""

    covered: tuple[str, ...]
    uncovered: tuple[str, ...]
    general: tuple[str, ...]

    @property
    def tells_apart(self) -> bool:
        """Whether some probe categories are covered and others not: only then is any forgetting out of reach."""
        return bool(self.covered) and bool(self.uncovered)


class Loss(NamedTuple):
    """Forgetting in an uncovered category: ``forgotten`` of ``n`` probes, ``rate`` their share."""

    forgotten: int
    n: int
    rate: float


def coverage(pool_categories: Iterable[str], probe_categories: Iterable[str]) -> Coverage:
    """Which of ``probe_categories`` the pool's rows (of ``pool_categories``) cover."""
    pool, probes = set(pool_categories), set(probe_categories)
    return Coverage(tuple(sorted(pool & probes)), tuple(sorted(probes - pool)), tuple(sorted(pool - probes)))


def uncovered_losses(
    report: TransitionReport, coverage: Coverage, least: int = 2, floor: float | Mapping[str, float] = 0.0
) -> dict[str, Loss]:
    """The uncovered categories that forgot at least ``least`` probes at a rate above ``floor`` (one
    number, or one per category, missing: 0); empty when the pool does not tell categories apart."""
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
    """The warning, once per category per run, that replay cannot repair ``category``'s losses."""
    name = shorten(category)
    return (
        f"{loss.forgotten} of the {loss.n} {name} probes are forgotten ({pct(loss.rate, digits=0)}), "
        f"and the replay pool has no {name} rows (it covers {listing(coverage.covered)}): replay cannot "
        f"repair them; add rows of category {name} to the pool"
    )
