"""Where each evaluation goes: objects with ``on_base``, ``on_evaluation``, ``on_end`` (each optional; the run's own
also hear ``on_ending``: what ``merge_at_end`` found). One that raises warns, one still busy after ``seconds`` is
dropped; a user's runs on rank 0 (``all_ranks``: on every rank)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from functools import partialmethod
from typing import Any, Protocol, runtime_checkable

from forgetwatch.common.text import first_line
from forgetwatch.results.events import BaseSnapshot, Evaluation
from forgetwatch.results.history import history_record
from forgetwatch.results.report import TransitionReport
from forgetwatch.results.trajectory import Trajectory
from forgetwatch.store.write import RunStore

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
    """The sinks of one run, called in order (see the module); ``seconds()``: each call in a thread, within the time it
    says at that call (``None``: in the caller's, unbounded)."""

    def __init__(self, sinks: Iterable[Any] = (), *, seconds: Callable[[], float | None] = lambda: None):
        self.sinks = list(sinks)
        self.seconds = seconds

    def _call(self, event: str, payload: Any) -> None:
        seconds = self.seconds()
        for sink in list(self.sinks):
            method = getattr(sink, event, None)
            if method is None:
                continue
            outcome: list[Exception | None] = []
            if seconds is None:
                _run(method, payload, outcome)
            else:
                thread = threading.Thread(target=_run, args=(method, payload, outcome), daemon=True)
                thread.start()
                thread.join(min(seconds, threading.TIMEOUT_MAX))  # inf: as long as a wait can be
            if not outcome:
                self.sinks.remove(sink)
                logger.warning(
                    "forgetwatch: the sink %s did not return from %s within %g s; it is dropped for the rest of "
                    "this run and training goes on (allow it longer with Watch.sink_seconds)",
                    type(sink).__name__,
                    event,
                    seconds,
                )
            elif (err := outcome[0]) is not None:
                logger.warning(
                    "forgetwatch: the sink %s failed in %s (%s: %s); training goes on, and the other sinks had it",
                    type(sink).__name__,
                    event,
                    type(err).__name__,
                    first_line(err),
                )

    on_base = partialmethod(_call, "on_base")
    on_evaluation = partialmethod(_call, "on_evaluation")
    on_end = partialmethod(_call, "on_end")
    on_ending = partialmethod(_call, "on_ending")


def _run(method: Any, payload: Any, outcome: list[Exception | None]) -> None:
    try:
        method(payload)
    except Exception as err:  # noqa: BLE001 - a sink that fails must not end training
        outcome.append(err)
    else:
        outcome.append(None)


class ForgettingHook:
    """A user's function in ``sinks=``: called as ``hook(report, step)`` after each evaluation, on every rank."""

    all_ranks = True

    def __init__(self, hook: Callable[[TransitionReport, int], Any]):
        self.hook = hook

    def on_evaluation(self, evaluation: Evaluation) -> None:
        self.hook(evaluation.report, evaluation.step)


def as_sink(sink: Any) -> Any:
    """``sink`` as a sink: one (it has ``on_evaluation``) as it is, a function as a :class:`ForgettingHook`."""
    if hasattr(sink, "on_evaluation"):
        return sink
    if callable(sink):
        return ForgettingHook(sink)
    raise TypeError(f"sinks=[...] takes sinks (objects with on_evaluation) or functions f(report, step), not {sink!r}")


class HistoryFile:
    """Writes each evaluation into the run's store (``history.jsonl``, ``answers_latest.npz``: the one place it is
    serialized); a failed write warns and is retried at the next one."""

    def __init__(self, store: RunStore):
        self.store = store

    def on_evaluation(self, evaluation: Evaluation) -> None:
        e = evaluation
        record = history_record(e.step, e.report, time=time.time(), seconds=e.seconds, trigger=e.trigger, stop=e.stop)
        record["columns"] = e.trajectory.column()
        for name, kept in e.kept.items():  # each kept plug-in's figures and state, under its name
            record[name] = {**kept["metrics"], **kept["state"]}
        if e.drift:
            record["drift"] = e.drift
        self.store.append_history(record)
        e.answers.meta["step"] = e.step
        self.store.save_latest(e.answers)

    def on_end(self, trajectory: Trajectory) -> None:
        self.store.flush()  # a last try for anything a failed write left in memory
