"""Where each evaluation goes: one protocol, one file per destination.

A sink is any object with ``on_base(snapshot)``, ``on_evaluation(evaluation)`` and
``on_end(trajectory)`` (see :class:`Sink`); methods it lacks are skipped. The run decides once,
when it builds its sinks, which ranks write: the built-in writers and a user's sinks run on
rank 0 only, a sink whose ``all_ranks`` attribute is true on every rank. A sink that raises is
a loud warning and the others go on: monitoring never ends training.

A user's sink is also bounded in time: each call runs in a thread of its own, and one still
busy after ``seconds`` (a hung network call, a lock never released) is dropped for the rest of
the run, with a warning, while training goes on. Python cannot stop a thread, so the call may
go on in the background; it was handed a copy of the run's objects (see
:class:`~forgetwatch.Watch`), so whatever it does later changes nothing of the run's. The run's
own writers are not bounded: they share its files with the training loop, and one left running
in the background could write over the files behind it.

Example:
    >>> class Printer:
    ...     def on_evaluation(self, evaluation):
    ...         print(evaluation.step, evaluation.report.forgotten)
    >>> watch = Watch(probes, output_dir="out", sinks=[Printer()])   # doctest: +SKIP
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from forgetwatch.common.text import first_line
from forgetwatch.results.events import BaseSnapshot, Evaluation
from forgetwatch.results.trajectory import Trajectory
from forgetwatch.sinks.metrics import (
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
    "SINK_SECONDS",
    "Sink",
    "Sinks",
    "console_line",
    "eval_metric_values",
    "logged_categories",
    "metric_values",
]

logger = logging.getLogger("forgetwatch")

#: How long one call of a user's sink may take before training goes on without it.
SINK_SECONDS = 300.0


@runtime_checkable
class Sink(Protocol):
    """What a run tells a sink: the base once, each evaluation, and the end of training."""

    def on_base(self, snapshot: BaseSnapshot) -> None: ...

    def on_evaluation(self, evaluation: Evaluation) -> None: ...

    def on_end(self, trajectory: Trajectory) -> None: ...


class Sinks:
    """The sinks of one run, called in order; a failing one warns, and the rest go on. With
    ``seconds``, each call runs in a thread and may take that long: a sink still busy then is
    dropped for the run, with a warning.

    Example:
        >>> Sinks([]).on_end(trajectory)   # doctest: +SKIP
    """

    def __init__(self, sinks: Iterable[Any] = (), *, seconds: float | None = None):
        self.sinks = list(sinks)
        self.seconds = seconds

    def on_base(self, snapshot: BaseSnapshot) -> None:
        self._call("on_base", snapshot)

    def on_evaluation(self, evaluation: Evaluation) -> None:
        self._call("on_evaluation", evaluation)

    def on_end(self, trajectory: Trajectory) -> None:
        self._call("on_end", trajectory)

    def _call(self, event: str, payload: Any) -> None:
        for sink in list(self.sinks):
            method = getattr(sink, event, None)
            if method is None:
                continue
            outcome: list[Exception | None] = []
            if self.seconds is None:
                _run(method, payload, outcome)
            else:
                thread = threading.Thread(target=_run, args=(method, payload, outcome), daemon=True)
                thread.start()
                thread.join(self.seconds)
            if not outcome:
                self.sinks.remove(sink)
                logger.warning(
                    "forgetwatch: the sink %s did not return from %s within %g s; it is dropped for the rest of "
                    "this run and training goes on (allow it longer with Watch.sink_seconds)",
                    type(sink).__name__,
                    event,
                    self.seconds,
                )
            elif (err := outcome[0]) is not None:
                logger.warning(
                    "forgetwatch: the sink %s failed in %s (%s: %s); training goes on, and the other sinks had it",
                    type(sink).__name__,
                    event,
                    type(err).__name__,
                    first_line(err),
                )


def _run(method: Any, payload: Any, outcome: list[Exception | None]) -> None:
    """``method(payload)``; what it raised (or ``None``) appended to ``outcome``."""
    try:
        method(payload)
    except Exception as err:  # noqa: BLE001 - a sink that fails must not end training
        outcome.append(err)
    else:
        outcome.append(None)
