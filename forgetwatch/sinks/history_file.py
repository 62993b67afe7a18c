"""The run's own files: each evaluation appended to ``history.jsonl``, the live answers as ``answers_latest.npz``."""

from __future__ import annotations

import time

from forgetwatch.results.events import Evaluation
from forgetwatch.results.history import history_record
from forgetwatch.results.run_files import RunStore
from forgetwatch.results.trajectory import Trajectory


class HistoryFile:
    """Writes each evaluation into the run's store (the one place it is serialized); a failed write warns and is
    retried at the next one."""

    def __init__(self, store: RunStore):
        self.store = store

    def on_evaluation(self, evaluation: Evaluation) -> None:
        e = evaluation
        record = history_record(
            e.step,
            e.report,
            time=time.time(),
            seconds=e.seconds,
            trigger=e.trigger,
            stop=e.stop,
            columns=e.trajectory.column(),
        )
        if e.repair is not None:
            record[e.repair] = {**e.repaired, **e.repair_state}
        if e.drift:
            record["drift"] = e.drift
        self.store.append_history(record)
        e.answers.meta["step"] = e.step
        self.store.save_latest(e.answers)

    def on_end(self, trajectory: Trajectory) -> None:
        self.store.flush()  # a last try for anything a failed write left in memory
