"""The run's own files: each evaluation appended to ``history.jsonl``, the live answers as ``answers_latest.npz``."""

from __future__ import annotations

from forgetwatch.results.events import Evaluation
from forgetwatch.results.run_files import RunStore
from forgetwatch.results.trajectory import Trajectory


class HistoryFile:
    """Writes each evaluation into the run's store; a failed write warns and is retried at the next one."""

    def __init__(self, store: RunStore):
        self.store = store

    def on_evaluation(self, evaluation: Evaluation) -> None:
        self.store.append_history(evaluation.record)
        evaluation.answers.meta["step"] = evaluation.step
        self.store.save_latest(evaluation.answers)

    def on_end(self, trajectory: Trajectory) -> None:
        self.store.flush()  # a last try for anything a failed write left in memory
