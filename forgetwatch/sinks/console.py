"""The base's and each evaluation's console line, and the line saying why forgetwatch stopped training."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from forgetwatch.common.console import say
from forgetwatch.results.events import BaseSnapshot, Evaluation
from forgetwatch.sinks.metrics import base_line, console_line, lm_eval_lines

logger = logging.getLogger("forgetwatch")


class ConsoleLines:
    """Prints the base's and each evaluation's line (when ``verbose``), and the stop line (always), naming
    ``history`` and ``stop_note(step)`` (what the trainer does on stopping, e.g. "; saving checkpoint ...")."""

    def __init__(self, history: Path, verbose: bool = True, stop_note: Callable[[int], str] = lambda step: ""):
        self.history, self.verbose, self.stop_note = history, verbose, stop_note

    def on_base(self, snapshot: BaseSnapshot) -> None:
        if self.verbose:
            say(base_line(snapshot.answers, snapshot.path, snapshot.computed))
            for line in [*lm_eval_lines(snapshot.answers, "base, "), *(f"[forgetwatch] {n}" for n in snapshot.notes)]:
                say(line)

    def on_evaluation(self, evaluation: Evaluation) -> None:
        if self.verbose:
            line = console_line(evaluation.step, evaluation.report, evaluation.drift.get("train_kl"))
            say("; ".join([line, *evaluation.notes]))
        if evaluation.stop:
            # on its own line above any progress bar, where a person sees it; and to the logs
            message = (
                f"stopping training at step {evaluation.step}: {evaluation.stop}"
                f"{self.stop_note(evaluation.step)}; history {self.history}"
            )
            say(f"[forgetwatch] {message}")
            logger.info("forgetwatch: %s", message)
