"""Where each evaluation goes: one protocol, one file per destination.

A sink is any object with ``on_base(snapshot)``, ``on_evaluation(evaluation)`` and
``on_end(trajectory)`` (see :class:`Sink`); methods it lacks are skipped. The run decides once,
when it builds its sinks, which ranks write: the built-in writers and a user's sinks run on
rank 0 only, a sink whose ``all_ranks`` attribute is true on every rank. A sink that raises is
a loud warning and the others go on: monitoring never ends training.

Example:
    >>> class Printer:
    ...     def on_evaluation(self, evaluation):
    ...         print(evaluation.step, evaluation.report.forgotten)
    >>> watch = Watch(probes, output_dir="out", sinks=[Printer()])   # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from forgetwatch.common.text import first_line
from forgetwatch.results.events import BaseSnapshot, Evaluation
from forgetwatch.results.trajectory import Trajectory
from forgetwatch.sinks.figures import (
    EVAL_PREFIX,
    METRICS,
    PREFIX,
    console_line,
    eval_metric_values,
    logged_categories,
    metric_values,
)

__all__ = [
    "EVAL_PREFIX",
    "METRICS",
    "PREFIX",
    "Sink",
    "Sinks",
    "console_line",
    "eval_metric_values",
    "logged_categories",
    "metric_values",
]

logger = logging.getLogger("forgetwatch")


@runtime_checkable
class Sink(Protocol):
    """What a run tells a sink: the base once, each evaluation, and the end of training."""

    def on_base(self, snapshot: BaseSnapshot) -> None: ...

    def on_evaluation(self, evaluation: Evaluation) -> None: ...

    def on_end(self, trajectory: Trajectory) -> None: ...


class Sinks:
    """The sinks of one run, called in order; a failing one warns, and the rest go on.

    Example:
        >>> Sinks([]).on_end(trajectory)   # doctest: +SKIP
    """

    def __init__(self, sinks: Iterable[Any] = ()):
        self.sinks = list(sinks)

    def on_base(self, snapshot: BaseSnapshot) -> None:
        self._call("on_base", snapshot)

    def on_evaluation(self, evaluation: Evaluation) -> None:
        self._call("on_evaluation", evaluation)

    def on_end(self, trajectory: Trajectory) -> None:
        self._call("on_end", trajectory)

    def _call(self, event: str, payload: Any) -> None:
        for sink in self.sinks:
            method = getattr(sink, event, None)
            if method is None:
                continue
            try:
                method(payload)
            except Exception as err:  # noqa: BLE001 - a sink that fails must not end training
                logger.warning(
                    "forgetwatch: the sink %s failed in %s (%s: %s); training goes on, and the other sinks had it",
                    type(sink).__name__,
                    event,
                    type(err).__name__,
                    first_line(err),
                )
