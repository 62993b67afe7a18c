"""W&B: forgetwatch's figures in a section of their own against ``train/global_step``, and tables of the probes; a
failed write warns once and that kind is left alone."""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Callable
from typing import Any

from forgetwatch.common.text import first_line
from forgetwatch.probes import ProbeSet
from forgetwatch.results.events import BaseSnapshot, Evaluation
from forgetwatch.results.trajectory import Trajectory
from forgetwatch.sinks.metrics import logged_values
from forgetwatch.sinks.tables import FLIP_COLUMNS, PROBE_COLUMNS, flip_rows, probe_rows

logger = logging.getLogger("forgetwatch")

STEP_KEY = "train/global_step"


def current_run() -> Any:
    module = sys.modules.get("wandb")
    return getattr(module, "run", None)


class WandbSection:
    """Writes to the W&B run ``run()`` returns (default: the process's active run), if any; ``limit``: most rows
    of each table."""

    def __init__(self, probes: ProbeSet, limit: int = 500, run: Callable[[], Any] = current_run):
        self.probes, self.limit, self.run = probes, limit, run
        self.took: int | None = None  # the last step whose scalars went here
        self._flips: Any = None  # the incremental table
        self._defined = False
        self._broken: set[str] = set()

    def on_base(self, snapshot: BaseSnapshot) -> None:
        self._scalars(snapshot.metrics, snapshot.step)

    def on_evaluation(self, evaluation: Evaluation) -> None:
        self._scalars(logged_values(evaluation), evaluation.step)

        def flips(wandb: Any) -> Any:  # one incremental table, grown at each evaluation
            if self._flips is None:
                self._flips = wandb.Table(columns=list(FLIP_COLUMNS), log_mode="INCREMENTAL")
            for row in flip_rows(evaluation, self.limit):
                self._flips.add_data(*row)
            return self._flips

        self._table("forgetwatch/flips", flips, evaluation.step)

    def on_end(self, trajectory: Trajectory) -> None:
        def probes(wandb: Any) -> Any:
            return wandb.Table(columns=list(PROBE_COLUMNS), data=probe_rows(self.probes, trajectory, self.limit))

        self._table("forgetwatch/probes", probes, int(trajectory.steps[-1]))

    def _table(self, key: str, make: Callable[[Any], Any], step: int) -> None:
        run = self._run("wandb tables")
        if run is not None:
            self._guard("wandb tables", lambda: run.log({key: make(importlib.import_module("wandb")), STEP_KEY: step}))

    def _scalars(self, values: dict[str, float], step: int) -> None:
        run = self._run("wandb scalars")
        if run is None or not values:
            return

        def log() -> None:
            if not self._defined:
                run.define_metric("forgetwatch/*", step_metric=STEP_KEY)
                self._defined = True
            run.log({**values, STEP_KEY: step})

        if self._guard("wandb scalars", log):
            self.took = step

    def _run(self, what: str) -> Any:
        return None if what in self._broken else self.run()

    def _guard(self, name: str, write: Callable[[], None]) -> bool:
        """Whether ``write`` went; a failure warns once and ``name`` is left alone from then on."""
        try:
            write()
        except Exception as err:  # noqa: BLE001 - a dashboard that fails must not end training
            self._broken.add(name)
            logger.warning(
                "forgetwatch: writing %s failed (%s: %s); no more of it this run (scalars then go the "
                "trainer's way), training goes on",
                name,
                type(err).__name__,
                first_line(err),
            )
            return False
        return True
