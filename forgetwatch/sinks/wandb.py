"""W&B: forgetwatch's figures in a section of their own against ``train/global_step``, and tables of the probes.

Written to the run directly: the trainer's ``WandbCallback`` would log ``forgetwatch/forgetting`` as
``train/forgetwatch/forgetting``, in the trainer's section, so the trainer's log skips it for these keys."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

from forgetwatch.probes import ProbeSet
from forgetwatch.results.events import BaseSnapshot, Ending, Evaluation
from forgetwatch.results.trajectory import Trajectory
from forgetwatch.sinks.tables import FLIP_COLUMNS, PROBE_COLUMNS, Guard, flip_rows, probe_rows

STEP_KEY = "train/global_step"


def current_run() -> Any:
    return getattr(sys.modules.get("wandb"), "run", None)


class WandbSection:
    """Writes to the process's active W&B run, if any; ``limit``: most rows of each table."""

    def __init__(self, probes: ProbeSet, limit: int = 500):
        self.probes, self.limit = probes, limit
        self._flips: Any = None  # the incremental table
        self._defined = False
        self._guard = Guard()

    def on_base(self, snapshot: BaseSnapshot) -> None:
        self._scalars(snapshot.metrics, snapshot.step)

    def on_evaluation(self, evaluation: Evaluation) -> None:
        self._scalars(evaluation.metrics, evaluation.step)

        def flips(wandb: Any) -> Any:  # one incremental table, grown at each evaluation
            if self._flips is None:
                self._flips = wandb.Table(columns=list(FLIP_COLUMNS), log_mode="INCREMENTAL")
            for row in flip_rows(evaluation, self.limit):
                self._flips.add_data(*row)
            return self._flips

        self._table("forgetwatch/flips", flips, evaluation.step)

    def on_ending(self, ending: Ending) -> None:
        self._scalars(ending.metrics, ending.step)

    def on_end(self, trajectory: Trajectory) -> None:
        def probes(wandb: Any) -> Any:
            return wandb.Table(columns=list(PROBE_COLUMNS), data=probe_rows(self.probes, trajectory, self.limit))

        self._table("forgetwatch/probes", probes, int(trajectory.steps[-1]))

    def _table(self, key: str, make: Callable[[Any], Any], step: int) -> None:
        def log() -> None:
            if (run := current_run()) is not None:
                run.log({key: make(importlib.import_module("wandb")), STEP_KEY: step})

        self._guard("wandb tables", log)

    def _scalars(self, values: dict[str, float], step: int) -> None:
        def log() -> None:
            run = current_run()
            if run is None or not values:
                return
            if not self._defined:
                run.define_metric("forgetwatch/*", step_metric=STEP_KEY)
                self._defined = True
            run.log({**values, STEP_KEY: step})

        self._guard("wandb scalars", log)
