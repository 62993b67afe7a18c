"""What a replay pool cannot repair: forgetting in probe categories that none of its rows names."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from forgetwatch.common.text import listing, pct, shorten
from forgetwatch.results.report import TransitionReport


def uncovered(
    report: TransitionReport,
    pool_categories: Iterable[str],
    probe_categories: Iterable[str],
    floor: Mapping[str, float],
) -> dict[str, str]:
    """A warning for each probe category no pool row names that forgot 2 probes or more, at a rate above its ``floor``
    (missing: 0); none unless some categories are covered and others not (general rows alone cover none)."""
    pool, probes = set(pool_categories), set(probe_categories)
    covered = sorted(pool & probes)
    out = {}
    for c in sorted(probes - pool) if covered else ():
        r, name = report.by_category.get(c), shorten(c)
        if r is not None and r.n > 0 and r.forgotten >= 2 and (rate := r.forgotten / r.n) > floor.get(c, 0.0):
            out[c] = (
                f"{r.forgotten} of the {r.n} {name} probes are forgotten ({pct(rate, digits=0)}), and the replay pool "
                f"has no {name} rows (it covers {listing(covered)}): replay cannot repair them; add rows of category "
                f"{name} to the pool"
            )
    return out
