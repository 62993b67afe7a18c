"""The trainer's log: forgetwatch's figures to ``state.log_history`` and the reporting integrations a TrainerLink
reaches, at the step they were measured; W&B's from its own section (WandbSection), which the trainer's
``WandbCallback`` would put under ``train/``."""

from __future__ import annotations

import logging
from typing import Any

from forgetwatch.integrations.trainer_link import TrainerLink
from forgetwatch.probes import ProbeSet
from forgetwatch.results.events import BaseSnapshot, Ending, Evaluation
from forgetwatch.sinks import Sinks
from forgetwatch.sinks.tables import TensorBoardText
from forgetwatch.sinks.wandb import WandbSection

logger = logging.getLogger("forgetwatch")


class TrainerLog:
    """Sends each evaluation's metrics through ``link``; on every rank, as ``Trainer.log`` runs (the integrations
    write on the main process only)."""

    def __init__(self, link: TrainerLink, skip: tuple[str, ...] = ()):
        self.link, self.skip = link, skip

    def on_base(self, snapshot: BaseSnapshot) -> None:
        if snapshot.metrics:
            self.send(snapshot.metrics)

    def on_evaluation(self, evaluation: Evaluation) -> None:
        self.send(evaluation.metrics)

    def on_ending(self, ending: Ending) -> None:
        self.send(ending.metrics)

    def send(self, metrics: dict[str, float]) -> None:
        """To every integration but those of classes named in ``skip``."""
        step = self.link.state.global_step
        try:
            self.link.emit(metrics, skip=self.skip)
        except Exception as err:  # noqa: BLE001 - a logger that is gone must not end training
            logger.warning(
                "forgetwatch: sending the metrics of step %d to the trainer's integrations failed "
                "(%s: %s); training goes on, and the figures are in the history file",
                step,
                type(err).__name__,
                err,
            )


class WhileTraining(Sinks):
    """Forwards sinks' events only while the trainer's integrations are open (after training they may be closed:
    the history file keeps the figures); ``all_ranks`` as for a sink."""

    def __init__(self, link: TrainerLink, *sinks: Any, all_ranks: bool = False):
        super().__init__(sinks)
        self.link, self.all_ranks = link, all_ranks

    def _call(self, event: str, payload: Any) -> None:
        if self.link.open:
            super()._call(event, payload)


def trainer_sinks(link: TrainerLink, probes: ProbeSet, rows: int) -> list[Any]:
    """W&B's section and tables (when ``args.report_to`` names it) and TensorBoard's text, then the log every
    integration reads."""
    wandb = WandbSection(probes, rows) if "wandb" in (link.args.report_to or []) else None
    board = link.integration("TensorBoardCallback")  # its writer is the trainer's (or forgetwatch's own)
    tensorboard = TensorBoardText(probes, lambda: board.tb_writer, rows) if board else None
    rank_zero = WhileTraining(link, *(s for s in (wandb, tensorboard) if s))
    log = TrainerLog(link, skip=("WandbCallback",) if wandb else ())
    return [rank_zero, WhileTraining(link, log, all_ranks=True)]
