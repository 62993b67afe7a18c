"""When to stop a run that forgets too much: thresholds, patience, an optional significance guard."""

from __future__ import annotations

import math
from collections.abc import Mapping

from forgetwatch.common.text import pct
from forgetwatch.results.noise import OVERALL
from forgetwatch.results.report import TransitionReport


class StopRule:
    """Stop once a forgetting rate (``metric``; with ``significance`` its Wilson 95 % lower bound less the
    ``noise_floor``) stays over its threshold, overall or per category, for ``patience`` evaluations."""

    def __init__(
        self,
        max_forgetting: float | None = None,
        metric: str = "forgetting",
        patience: int = 1,
        significance: bool = False,
        category_max_forgetting: Mapping[str, float] | None = None,
        noise_floor: Mapping[str, float] | None = None,
    ):
        self.thresholds: dict[str, float] = dict(category_max_forgetting or {})
        if max_forgetting is not None:
            self.thresholds[OVERALL] = max_forgetting
        self.metric, self.patience, self.significance = metric, patience, significance
        self.streaks: dict[str, int] = {}
        self.noise_floor = dict(noise_floor or {})

    @property
    def active(self) -> bool:
        return bool(self.thresholds)

    def update(self, report: TransitionReport) -> str | None:
        """Count one evaluation; return why to stop, or ``None`` to go on."""
        reasons = []
        for scope, threshold in self.thresholds.items():
            figures = report if scope == OVERALL else report.by_category.get(scope)
            value = math.nan if figures is None else self.value(figures, self.noise_floor.get(scope, 0.0))
            self.streaks[scope] = self.streaks.get(scope, 0) + 1 if value > threshold else 0
            if self.streaks[scope] >= self.patience:
                reasons.append(self._reason(scope, value, threshold))
        return "; ".join(reasons) or None

    def value(self, report: TransitionReport, noise: float = 0.0) -> float:
        """The number compared with the threshold (NaN is never over it)."""
        estimate = float(getattr(report, self.metric))
        if not self.significance:
            return estimate
        # shift the raw rate's lower bound by the chance correction the estimate received
        return report.forgetting_ci[0] - (report.forgetting - estimate) - noise

    def _reason(self, scope: str, value: float, threshold: float) -> str:
        what = self.metric
        if self.significance:
            what += " lower bound (95 %)" + (" less the noise floor" if self.noise_floor.get(scope) else "")
        where = "" if scope == OVERALL else f" in category {scope!r}"
        times = f" for {self.patience} consecutive evaluations" if self.patience > 1 else ""
        return f"{what}{where} {pct(value, digits=2)} > {pct(threshold, digits=2)}{times}"
