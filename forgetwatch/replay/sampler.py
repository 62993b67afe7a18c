"""Which replay rows come next: categories weighted by the forgetting at the last evaluation, rows
in a seeded shuffled order within each; the draws depend only on the seed and the batches drawn before."""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from forgetwatch.common.text import shorten
from forgetwatch.replay.rows import ReplayRow
from forgetwatch.results.report import TransitionReport

#: Share of the draws spread evenly over the categories, so that none starves.
FLOOR = 0.1
#: How much a category's at-risk share counts next to its (chance-adjusted) forgetting.
AT_RISK_WEIGHT = 0.5


def category_weights(report: TransitionReport | None, categories: Sequence[str]) -> dict[str, float]:
    """Shares of the next draws: even before any evaluation, then by each category's chance-adjusted forgetting plus
    :data:`AT_RISK_WEIGHT` × its at-risk share (one the probes lack: the overall figures), mixed by :data:`FLOOR`."""
    figures = {c: report.by_category.get(c, report) for c in categories} if report is not None else {}
    raw = {c: _figure(f.forgetting_adjusted) + AT_RISK_WEIGHT * _figure(f.at_risk) for c, f in figures.items()}
    k, total = len(categories), sum(raw.values())
    if total <= 0:
        return {c: 1 / k for c in categories}
    return {c: (1 - FLOOR) * w / total + FLOOR / k for c, w in raw.items()}


def _figure(x: float) -> float:
    return 0.0 if x is None or not math.isfinite(x) else max(float(x), 0.0)


class ReplaySampler:
    """Draws batches of rows: a category per row by the weights, then its next row in a seeded shuffled
    order (every row once before any twice). ``uniform``: every row in one category, ``"all"``."""

    def __init__(self, pool: Sequence[ReplayRow], seed: int = 0, uniform: bool = False):
        self.pool = pool
        self.seed = seed
        self.categories = ["all"] if uniform else sorted({r.category for r in pool})
        self._rows: dict[str, list[int]] = {c: [] for c in self.categories}
        for i, row in enumerate(pool):
            self._rows["all" if uniform else row.category].append(i)
        self.drawn = 0  # batches drawn so far
        self._taken = {c: 0 for c in self.categories}  # rows taken per category so far
        self._orders: dict[str, tuple[int, np.ndarray]] = {}  # each category's shuffle of its epoch

    def next_batch(self, size: int, weights: Mapping[str, float]) -> list[ReplayRow]:
        """``size`` rows; ``weights`` by category (see :func:`category_weights`)."""
        p = np.array([max(weights.get(c, 0.0), 0.0) for c in self.categories], dtype=np.float64)
        p = p / p.sum() if p.sum() > 0 else np.full(len(p), 1 / len(p))
        rng = np.random.default_rng([self.seed, self.drawn])
        picks = rng.choice(len(self.categories), size=size, p=p)
        self.drawn += 1
        return [self.pool[self._next_row(self.categories[c])] for c in picks]

    def _next_row(self, category: str) -> int:
        rows, taken = self._rows[category], self._taken[category]
        epoch, position = divmod(taken, len(rows))
        if self._orders.get(category, (None,))[0] != epoch:  # a new shuffle once per pass over the rows
            seeds = [self.seed, zlib.crc32(category.encode("utf-8")), epoch]
            self._orders[category] = (epoch, np.random.default_rng(seeds).permutation(len(rows)))
        self._taken[category] = taken + 1
        return rows[int(self._orders[category][1][position])]

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to draw the same rows next (JSON-ready)."""
        return {"seed": self.seed, "drawn": self.drawn, "taken": dict(self._taken)}

    def state_problem(self, state: Any, max_drawn: int) -> str | None:
        """Why ``state`` cannot be this sampler's: other categories or seed, counts not whole, over ``max_drawn`` drawn."""
        if not isinstance(state, Mapping) or set(state) != {"seed", "drawn", "taken"}:
            return f"its draws are not {{seed, drawn, taken}}: {shorten(state)}"
        if type(state["seed"]) is not int or state["seed"] != self.seed:
            return f"made with seed={shorten(state['seed'])}, not {self.seed}"
        if type(drawn := state["drawn"]) is not int or not 0 <= drawn <= max_drawn:
            return f"its count of batches drawn is {shorten(drawn)}, not a whole number from 0 to {max_drawn}"
        taken = state["taken"]
        if not isinstance(taken, Mapping) or set(taken) != set(self.categories):
            have = sorted(taken) if isinstance(taken, Mapping) else shorten(taken)
            return f"made for the categories {shorten(have)}, not this pool's {shorten(self.categories)}"
        if (bad := next((c for c, n in taken.items() if type(n) is not int or n < 0), None)) is not None:
            return f"its count of rows taken from {shorten(bad)} is {shorten(taken[bad])}, not a whole number from 0"
        return None

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Go on from :meth:`state_dict` (a state :meth:`state_problem` found nothing wrong with)."""
        self.drawn = state["drawn"]
        self._taken = dict(state["taken"])
        self._orders = {}
