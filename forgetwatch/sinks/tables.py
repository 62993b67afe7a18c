"""The tables W&B and TensorBoard show (the probes that flipped, and each probe's trajectory), TensorBoard's as
text; a dashboard's write that fails warns once, and that kind of write stops."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from forgetwatch.common.text import first_line
from forgetwatch.probes import ProbeSet
from forgetwatch.results.answers import Answers, chosen_text
from forgetwatch.results.events import Evaluation
from forgetwatch.results.trajectory import Trajectory

logger = logging.getLogger("forgetwatch")

FLIP_COLUMNS = ("step", "id", "category", "question", "answer", "base", "now", "transition", "margin", "events so far")
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


class Guard:
    """Runs a dashboard's writes: the first failure of each ``kind`` warns, and that kind is left alone from then
    on."""

    def __init__(self) -> None:
        self.broken: set[str] = set()

    def __call__(self, kind: str, write: Callable[[], Any]) -> Any:
        """What ``write()`` returned, or ``None`` when it failed or ``kind`` failed before."""
        if kind in self.broken:
            return None
        try:
            return write()
        except Exception as err:  # noqa: BLE001 - a dashboard that fails must not end training
            self.broken.add(kind)
            logger.warning(
                "forgetwatch: writing %s failed (%s: %s); no more of it this run, training goes on",
                kind,
                type(err).__name__,
                first_line(err),
            )
            return None


class TensorBoardText:
    """Adds the tables as markdown to ``writer()`` (``None`` while there is none)."""

    def __init__(self, probes: ProbeSet, writer: Callable[[], Any], limit: int = 500):
        self.probes, self.writer, self.limit = probes, writer, limit
        self._guard = Guard()

    def on_evaluation(self, evaluation: Evaluation) -> None:
        rows = flip_rows(evaluation, self.limit)
        self._text("forgetwatch/flips", markdown(FLIP_COLUMNS, rows) if rows else "no probe flipped", evaluation.step)

    def on_end(self, trajectory: Trajectory) -> None:
        rows = probe_rows(self.probes, trajectory, self.limit)
        self._text("forgetwatch/probes", markdown(PROBE_COLUMNS, rows), int(trajectory.steps[-1]))

    def _text(self, tag: str, text: str, step: int) -> None:
        def add() -> None:
            if (writer := self.writer()) is not None:
                writer.add_text(tag, text, step)

        self._guard("tensorboard", add)
