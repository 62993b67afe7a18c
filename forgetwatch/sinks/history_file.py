"""The run's own files: each evaluation appended to ``history.jsonl``, the live answers as ``answers_latest.npz``."""

from __future__ import annotations

import time

from forgetwatch.results.events import Evaluation
from forgetwatch.results.history import history_record
from forgetwatch.results.store import RunStore
from forgetwatch.results.trajectory import Trajectory


class HistoryFile:
    """Writes each evaluation into the run's store, serialized here and nowhere else; a failed write warns and is
    retried at the next one."""

    def __init__(self, store: RunStore):
        self.store = store

    def on_evaluation(self, evaluation: Evaluation) -> None:
        ev = evaluation
        record = history_record(
            ev.step,
            ev.report,
            time=time.time(),
            seconds=ev.seconds,
            trigger=ev.trigger,
            stop=ev.stop,
            columns=ev.trajectory.column(),
        )
        if ev.repair is not None:
            record[ev.repair] = {**ev.repaired, **ev.repair_state}
        if ev.drift:
            record["drift"] = ev.drift
        self.store.append_history(record)
        ev.answers.meta["step"] = ev.step
        self.store.save_latest(ev.answers)

    def on_end(self, trajectory: Trajectory) -> None:
        self.store.flush()  # a last try for anything a failed write left in memory
