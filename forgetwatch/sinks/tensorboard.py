"""TensorBoard: the tables of flipped probes and of every probe's trajectory, as text."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from forgetwatch.common.text import first_line
from forgetwatch.probes import ProbeSet
from forgetwatch.results.events import Evaluation
from forgetwatch.results.trajectory import Trajectory
from forgetwatch.sinks.tables import FLIP_COLUMNS, PROBE_COLUMNS, flip_rows, markdown, probe_rows

logger = logging.getLogger("forgetwatch")


class TensorBoardText:
    """Adds the tables as markdown to ``writer()`` (``None`` while there is none); a failure warns once, then
    it stops."""

    def __init__(self, probes: ProbeSet, writer: Callable[[], Any], limit: int = 500):
        self.probes, self.writer, self.limit = probes, writer, limit
        self._broken = False

    def on_evaluation(self, evaluation: Evaluation) -> None:
        rows = flip_rows(evaluation, self.limit)
        self._text("forgetwatch/flips", markdown(FLIP_COLUMNS, rows) if rows else "no probe flipped", evaluation.step)

    def on_end(self, trajectory: Trajectory) -> None:
        rows = probe_rows(self.probes, trajectory, self.limit)
        self._text("forgetwatch/probes", markdown(PROBE_COLUMNS, rows), int(trajectory.steps[-1]))

    def _text(self, tag: str, text: str, step: int) -> None:
        writer = None if self._broken else self.writer()
        if writer is None:
            return
        try:
            writer.add_text(tag, text, step)
        except Exception as err:  # noqa: BLE001 - a dashboard that fails must not end training
            self._broken = True
            logger.warning(
                "forgetwatch: writing tensorboard failed (%s: %s); no more of it this run, training goes on",
                type(err).__name__,
                first_line(err),
            )
