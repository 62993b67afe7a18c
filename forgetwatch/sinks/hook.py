"""A user's function in ``sinks=``: called as ``f(report, step)`` after each evaluation, on every rank."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from forgetwatch.results.events import Evaluation
from forgetwatch.results.report import TransitionReport

OnForgetting = Callable[[TransitionReport, int], Any]


class ForgettingHook:
    """Calls ``hook(report, step)`` after each evaluation, on every rank (``all_ranks``)."""

    all_ranks = True

    def __init__(self, hook: OnForgetting):
        self.hook = hook

    def on_evaluation(self, evaluation: Evaluation) -> None:
        self.hook(evaluation.report, evaluation.step)


def as_sink(sink: Any) -> Any:
    """``sink`` as a sink: one (it has ``on_evaluation``) as it is, a function as a
    :class:`ForgettingHook`; anything else is a ``TypeError`` naming it."""
    if hasattr(sink, "on_evaluation"):
        return sink
    if callable(sink):
        return ForgettingHook(sink)
    raise TypeError(f"sinks=[...] takes sinks (objects with on_evaluation) or functions f(report, step), not {sink!r}")
