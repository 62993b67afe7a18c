"""The tables W&B and TensorBoard show (the probes that flipped, and each probe's trajectory), and W&B's figures in
a section of their own; a dashboard's write that fails warns once, and that kind of write stops."""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from forgetwatch.common.text import first_line
from forgetwatch.probes import ProbeSet
from forgetwatch.results.answers import Answers, chosen_text
from forgetwatch.results.events import BaseSnapshot, Ending, Evaluation
from forgetwatch.results.trajectory import Trajectory

logger = logging.getLogger("forgetwatch")

FLIP_COLUMNS = ("step", "id", "category", "question", "answer", "base", "now", "transition", "margin", "events so far")
FLIPS = "forgetwatch/flips"  # the key of the table of flips; the other: "forgetwatch/probes"
PROBE_COLUMNS = ("id", "category", "question", "answer", "events", "first forgotten", "right at each evaluation")


def shown_answer(answers: Answers, i: int, choices: Sequence[str] | None) -> str:
    """What a model answered to probe ``i``: the chosen choice's text, or the raw output."""
    predicted = answers.predicted[i]
    chosen = chosen_text(predicted, choices)
    if chosen is not None:
        return chosen
    output = answers.outputs[i]
    return output if output is not None else ("" if predicted is None else str(predicted))


def flip_rows(evaluation: Evaluation, limit: int) -> list[list[Any]]:
    """The probes that flipped at this evaluation (forgotten first; at most ``limit``), in :data:`FLIP_COLUMNS`."""
    step, probes, base, now = evaluation.step, evaluation.probes, evaluation.base, evaluation.answers
    report, trajectory = evaluation.report, evaluation.trajectory
    index = {pid: i for i, pid in enumerate(base.ids)}
    events = trajectory.forgetting_events()
    rows = []
    flipped = [*((p, "1→0") for p in report.forgotten_ids), *((p, "0→1") for p in report.gained_ids)]
    for pid, transition in flipped[:limit]:
        i = index[pid]
        p, margin = probes[i], float(trajectory.signal[i, -1])
        shown = [shown_answer(answers, i, p.choices) for answers in (base, now)]
        margin = round(margin, 3) if np.isfinite(margin) else None
        rows.append([step, pid, p.category, p.question, p.answer_text, *shown, transition, margin, int(events[i])])
    return rows


def probe_rows(probes: ProbeSet, trajectory: Trajectory, limit: int) -> list[list[Any]]:
    """One row per probe (most events first; at most ``limit``), its trajectory as ■ right / □ wrong."""
    events = trajectory.forgetting_events()
    first = [None if f < 0 else f for f in trajectory.first_forgotten().tolist()]
    rows = []
    for i in np.argsort(-events, kind="stable")[:limit]:
        p, trail = probes[i], "".join("■" if c else "□" for c in trajectory.correct[i])
        rows.append([trajectory.ids[i], p.category, p.question, p.answer_text, int(events[i]), first[i], trail])
    return rows


def markdown(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table (what TensorBoard's text tab renders)."""
    cells = [["" if v is None else str(v).replace("|", "\\|").replace("\n", " ") for v in row] for row in rows]
    lines = ["| " + " | ".join(row) + " |" for row in [list(columns), *cells]]
    return "\n".join([lines[0], "|" + "---|" * len(columns), *lines[1:]])


class _Tables:
    """A dashboard's two tables: each evaluation's flips and, at the end, every probe's trajectory (``limit``: most
    rows of each), written by ``_add``; the first failure of each kind of write warns, and that kind stops."""

    kind = ""

    def __init__(self, probes: ProbeSet, limit: int = 500):
        self.probes, self.limit = probes, limit
        self._broken: set[str] = set()

    def on_evaluation(self, evaluation: Evaluation) -> None:
        rows = flip_rows(evaluation, self.limit)
        self._guarded(self.kind, self._add, FLIPS, FLIP_COLUMNS, rows, evaluation.step)

    def on_end(self, trajectory: Trajectory) -> None:
        rows = probe_rows(self.probes, trajectory, self.limit)
        self._guarded(self.kind, self._add, "forgetwatch/probes", PROBE_COLUMNS, rows, int(trajectory.steps[-1]))

    def _add(self, key: str, columns: Sequence[str], rows: list[list[Any]], step: int) -> None:
        raise NotImplementedError

    def _guarded(self, kind: str, write: Callable[..., Any], *args: Any) -> None:
        if kind in self._broken:
            return
        try:
            write(*args)
        except Exception as err:  # noqa: BLE001 - a dashboard that fails must not end training
            self._broken.add(kind)
            logger.warning(
                "forgetwatch: writing %s failed (%s: %s); no more of it this run, training goes on",
                kind,
                type(err).__name__,
                first_line(err),
            )


class TensorBoardText(_Tables):
    """Adds the tables as markdown to ``writer()`` (``None`` while there is none)."""

    kind = "tensorboard"

    def __init__(self, probes: ProbeSet, writer: Callable[[], Any], limit: int = 500):
        super().__init__(probes, limit)
        self.writer = writer

    def _add(self, key: str, columns: Sequence[str], rows: list[list[Any]], step: int) -> None:
        if (writer := self.writer()) is not None:
            writer.add_text(key, markdown(columns, rows) if rows or key != FLIPS else "no probe flipped", step)


STEP_KEY = "train/global_step"


def current_run() -> Any:
    return getattr(sys.modules.get("wandb"), "run", None)


class WandbSection(_Tables):
    """Writes to the process's active W&B run, if any: the figures in a section of their own against
    ``train/global_step`` (the trainer's ``WandbCallback`` would log them under ``train/``), and the tables."""

    kind = "wandb tables"

    def __init__(self, probes: ProbeSet, limit: int = 500):
        super().__init__(probes, limit)
        self._flips: Any = None  # the incremental table, grown at each evaluation
        self._defined = False

    def on_base(self, snapshot: BaseSnapshot) -> None:
        self._guarded("wandb scalars", self._scalars, snapshot.metrics, snapshot.step)

    def on_evaluation(self, evaluation: Evaluation) -> None:
        self._guarded("wandb scalars", self._scalars, evaluation.metrics, evaluation.step)
        super().on_evaluation(evaluation)

    def on_ending(self, ending: Ending) -> None:
        self._guarded("wandb scalars", self._scalars, ending.metrics, ending.step)

    def _add(self, key: str, columns: Sequence[str], rows: list[list[Any]], step: int) -> None:
        if (run := current_run()) is None:
            return
        wandb = importlib.import_module("wandb")
        if key != FLIPS:
            table = wandb.Table(columns=list(columns), data=rows)
        else:
            if self._flips is None:
                self._flips = wandb.Table(columns=list(columns), log_mode="INCREMENTAL")
            for row in rows:
                self._flips.add_data(*row)
            table = self._flips
        run.log({key: table, STEP_KEY: step})

    def _scalars(self, values: dict[str, float], step: int) -> None:
        if (run := current_run()) is None or not values:
            return
        if not self._defined:
            run.define_metric("forgetwatch/*", step_metric=STEP_KEY)
            self._defined = True
        run.log({**values, STEP_KEY: step})
