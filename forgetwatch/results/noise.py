"""How much forgetting is noise: answers that flip with no weight change, when the base is scored again in
batches of another size (reduced precision rounds differently); and the smallest rate N probes can tell from zero."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from forgetwatch.config.settings import BatchSize
from forgetwatch.results.answers import Answers
from forgetwatch.results.metrics import mcnemar_exact

OVERALL = "overall"  # the scope of the whole probe set, beside each category's


def wants_noise_check(model: torch.nn.Module, reduced: bool) -> bool:
    """Whether the base is scored twice by default: on a GPU, or in ``reduced`` precision."""
    params = list(model.parameters())
    return reduced or (params[0].device.type if params else "cpu") == "cuda"


def other_batch_size(batch_size: BatchSize, rows_per_batch: int) -> int:
    """A batch size that gives each probe other neighbours than ``batch_size`` did (about ``rows_per_batch`` rows)."""
    rows = batch_size if isinstance(batch_size, int) else rows_per_batch
    other = rows // 2 + 1
    return other if other != rows else rows + 1


def measure_noise(
    scorer: Any, model: torch.nn.Module, first: Answers, batch_size: BatchSize, distributed: bool = False
) -> dict[str, object]:
    """Score ``model`` again in batches of another size than ``first``: :func:`noise_figures`."""
    other = other_batch_size(batch_size, scorer.rows_per_batch(model))
    return noise_figures(first, scorer(model, batch_size=other, show_progress=False, distributed=distributed))


def noise_figures(first: Answers, again: Answers) -> dict[str, object]:
    """Two scorings of the same weights: ``noise_flips`` (changed either way) and ``noise_floor`` (overall and
    ``noise_floor_by_category``), the share that went from right to wrong."""
    before, after = np.asarray(first.correct, dtype=bool), np.asarray(again.correct, dtype=bool)
    lost = before & ~after
    categories = np.asarray(first.categories)
    by_category = {c: float(lost[categories == c].mean()) for c in sorted(set(first.categories))}
    return {
        "noise_flips": int((before != after).sum()),
        "noise_floor": float(lost.mean()) if len(lost) else 0.0,
        "noise_floor_by_category": by_category,
    }


def noise_by_scope(meta: dict[str, Any]) -> dict[str, float]:
    """The noise floors in a snapshot's ``meta``, by stop-rule scope."""
    if "noise_floor" not in meta:
        return {}
    return {OVERALL: meta["noise_floor"], **meta.get("noise_floor_by_category", {})}


def smallest_detectable(n: int, alpha: float = 0.05) -> tuple[int, float]:
    """The fewest forgotten probes (none gained) an exact McNemar test tells from chance at ``alpha``, and that as
    a share of ``n``: smaller rates cannot be told from zero."""
    k = 1
    while mcnemar_exact(0, k) >= alpha:
        k += 1
    return k, (k / n if n else math.nan)
