"""Scoring options whose rules the config, the scorer and the command line share."""

from __future__ import annotations

from typing import Any

#: ``normalize`` values: ``None`` is lm-eval ``acc``, ``"chars"`` is ``acc_norm``.
NORMALIZE_MODES: tuple[str | None, ...] = (None, "chars")

BatchSize = int | str  # a positive int, or "auto"


def batch_size_problem(value: Any) -> str | None:
    """Why ``value`` is not a batch size (a positive integer or ``"auto"``), or ``None``.

    Example:
        >>> batch_size_problem(0)
        "expected a positive integer or 'auto', got 0"
    """
    if value == "auto" and isinstance(value, str):
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return f"expected a positive integer or 'auto', got {value!r:.40}"
    return None


def check_batch_size(value: Any) -> BatchSize:
    """``value`` if it is a batch size, else a ``ValueError`` saying what is expected."""
    problem = batch_size_problem(value)
    if problem:
        raise ValueError(f"batch_size: {problem}")
    return value
