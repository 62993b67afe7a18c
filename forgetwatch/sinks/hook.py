"""``on_forgetting=``: the user's function, called after each evaluation on every rank."""

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
