"""What W&B and TensorBoard show of forgetwatch beyond the trainer's scalars.

In W&B forgetwatch's figures get a section of their own (``forgetwatch/...``, categories under
it), plotted against ``train/global_step`` like the trainer's, instead of mixed into ``train/``;
a table of the probes that flipped at each evaluation grows as training goes (W&B's incremental
tables), and at the end one row per probe holds its trajectory. TensorBoard gets the same
tables as text. The rows are built by pure functions; a writer that fails warns once and is
then left alone: monitoring never stops training.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from .answers import Answers, chosen_text
from .probes import ProbeSet
from .report import TransitionReport
from .text import first_line
from .trajectory import Trajectory

logger = logging.getLogger(__name__)

FLIP_COLUMNS = ("step", "id", "category", "question", "answer", "base", "now", "transition", "margin",
                "events so far")
PROBE_COLUMNS = ("id", "category", "question", "answer", "events", "first forgotten", "right at each evaluation")


def shown_answer(answers: Answers, i: int, choices: Sequence[str] | None) -> str:
    """What a model answered to probe ``i``: the chosen choice's text (``choices``: the probe's),
    or a generative or behaviour probe's raw output.

    Example:
        >>> a = Answers.from_samples("fp", {}, [dict(id="q1", correct=False, predicted=1, n_choices=2)])
        >>> shown_answer(a, 0, ["Paris", "Lyon"])
        'Lyon'
    """
    predicted = answers.predicted[i]
    chosen = chosen_text(predicted, choices)
    if chosen is not None:
        return chosen
    output = answers.outputs[i]
    return output if output is not None else ("" if predicted is None else str(predicted))


def flip_rows(step: int, probes: ProbeSet, base: Answers, now: Answers, report: TransitionReport,
              trajectory: Trajectory, limit: int) -> list[list[Any]]:
    """The probes that flipped against the base at this evaluation (forgotten first, then
    gained; at most ``limit``), one row each in :data:`FLIP_COLUMNS` order."""
    index = {pid: i for i, pid in enumerate(base.ids)}
    events = trajectory.forgetting_events()
    rows = []
    for pid, transition in [*((p, "1→0") for p in report.forgotten_ids), *((p, "0→1") for p in report.gained_ids)]:
        if len(rows) >= limit:
            break
        i = index[pid]
        margin = float(trajectory.signal[i, -1])
        rows.append([step, pid, probes[i].category, probes[i].question, probes[i].answer_text,
                     shown_answer(base, i, probes[i].choices), shown_answer(now, i, probes[i].choices), transition,
                     round(margin, 3) if np.isfinite(margin) else None, int(events[i])])
    return rows


def probe_rows(probes: ProbeSet, trajectory: Trajectory, limit: int) -> list[list[Any]]:
    """One row per probe (most forgetting events first; at most ``limit``) in
    :data:`PROBE_COLUMNS` order, its trajectory as ■ right / □ wrong from the base on."""
    events, first = trajectory.forgetting_events(), trajectory.first_forgotten()
    order = np.argsort(-events, kind="stable")[:limit]
    return [[trajectory.ids[i], probes[i].category, probes[i].question, probes[i].answer_text, int(events[i]),
             None if first[i] < 0 else int(first[i]), "".join("■" if c else "□" for c in trajectory.correct[i])]
            for i in order]


def markdown(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table (what TensorBoard's text tab renders).

    Example:
        >>> print(markdown(["a", "b"], [[1, "x|y"]]))
        | a | b |
        |---|---|
        | 1 | x\\|y |
    """
    def cell(v: Any) -> str:
        return "" if v is None else str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


class Dashboards:
    """Writes to the W&B run and the TensorBoard writer of the trainer's integrations, when
    present (``wandb_callback``, ``tensorboard_callback``: transformers' callbacks)."""

    def __init__(self, wandb_callback: Any = None, tensorboard_callback: Any = None, limit: int = 500):
        self.wandb_callback, self.tensorboard_callback, self.limit = wandb_callback, tensorboard_callback, limit
        self._flips: Any = None  # the incremental W&B table
        self._defined = False
        self._broken: set[str] = set()

    def metrics(self, values: dict[str, float], step: int) -> bool:
        """forgetwatch's figures in W&B, in their own section, at ``step``; whether they went
        (if not, the caller sends them the trainer's way)."""
        run = self._run("wandb scalars")
        if run is None or not values:
            return False

        def log() -> None:
            if not self._defined:
                run.define_metric("forgetwatch/*", step_metric="train/global_step")
                self._defined = True
            run.log({**values, "train/global_step": step})

        return self._guard("wandb scalars", log)

    def flips(self, rows: list[list[Any]], step: int) -> None:
        """This evaluation's flips: appended to W&B's incremental table, and as TensorBoard text."""
        run = self._run("wandb tables")
        if run is not None:
            def log() -> None:
                import wandb

                if self._flips is None:
                    self._flips = wandb.Table(columns=list(FLIP_COLUMNS), log_mode="INCREMENTAL")
                for row in rows:
                    self._flips.add_data(*row)
                run.log({"forgetwatch/flips": self._flips, "train/global_step": step})

            self._guard("wandb tables", log)
        self._text("forgetwatch/flips", markdown(FLIP_COLUMNS, rows) if rows else "no probe flipped", step)

    def probes(self, rows: list[list[Any]], step: int) -> None:
        """At the end: one row per probe with its trajectory."""
        run = self._run("wandb tables")
        if run is not None:
            def log() -> None:
                import wandb

                run.log({"forgetwatch/probes": wandb.Table(columns=list(PROBE_COLUMNS), data=rows),
                         "train/global_step": step})

            self._guard("wandb tables", log)
        self._text("forgetwatch/probes", markdown(PROBE_COLUMNS, rows), step)

    def _run(self, what: str) -> Any:
        """The W&B run, unless there is none or writing ``what`` to it failed before."""
        module = getattr(self.wandb_callback, "_wandb", None)
        return None if module is None or what in self._broken else getattr(module, "run", None)

    def _text(self, tag: str, text: str, step: int) -> None:
        writer = getattr(self.tensorboard_callback, "tb_writer", None)
        if writer is not None:
            self._guard("tensorboard", lambda: writer.add_text(tag, text, step))

    def _guard(self, name: str, write: Any) -> bool:
        """Whether ``write`` went; a failure warns once and ``name`` is left alone from then on."""
        if name in self._broken:
            return False
        try:
            write()
        except Exception as err:  # noqa: BLE001 - a dashboard that fails must not end training
            self._broken.add(name)
            logger.warning("forgetwatch: writing %s failed (%s: %s); no more of it this run (scalars then go the "
                           "trainer's way), training goes on", name, type(err).__name__, first_line(err))
            return False
        return True
