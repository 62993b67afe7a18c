"""The trainer's log: forgetwatch's figures to ``state.log_history`` and to the reporting
integrations a :class:`~forgetwatch.integrations.trainer_link.TrainerLink` reaches (W&B only when
:class:`~forgetwatch.sinks.wandb.WandbSection` did not take them), at the step they were measured."""

from __future__ import annotations

import logging
from typing import Any

from forgetwatch.integrations.trainer_link import TrainerLink
from forgetwatch.probes import ProbeSet
from forgetwatch.results.events import BaseSnapshot, Evaluation
from forgetwatch.sinks import Sinks, logged_values
from forgetwatch.sinks.tables import TensorBoardText
from forgetwatch.sinks.wandb import WandbSection

logger = logging.getLogger("forgetwatch")


class TrainerLog:
    """Sends each evaluation's metrics through ``link`` while the trainer's integrations are open
    (after training they may be closed: the history file keeps the figures). On every rank, as
    ``Trainer.log`` runs: each rank's ``log_history`` holds them, and the integrations write on
    the main process only."""

    all_ranks = True

    def __init__(self, link: TrainerLink, wandb: WandbSection | None = None):
        self.link, self.wandb = link, wandb

    def on_base(self, snapshot: BaseSnapshot) -> None:
        if snapshot.metrics and self.link.open:
            self.send(snapshot.metrics)

    def on_evaluation(self, evaluation: Evaluation) -> None:
        if self.link.open:
            self.send(logged_values(evaluation))

    def send(self, metrics: dict[str, float]) -> None:
        """To every integration; figures the W&B section took already skip W&B."""
        step = self.link.state.global_step
        taken = self.wandb is not None and self.wandb.took == step
        try:
            self.link.emit(metrics, skip=("WandbCallback",) if taken else ())
        except Exception as err:  # noqa: BLE001 - a logger that is gone must not end training
            logger.warning(
                "forgetwatch: sending the metrics of step %d to the trainer's integrations failed "
                "(%s: %s); training goes on, and the figures are in the history file",
                step,
                type(err).__name__,
                err,
            )


class WhileTraining(Sinks):
    """Forwards sinks' events only while the trainer's integrations are open (a run that ends
    without its last epoch's events reaches them after they closed)."""

    def __init__(self, link: TrainerLink, *sinks: Any):
        super().__init__(sinks)
        self.link = link

    def _call(self, event: str, payload: Any) -> None:
        if self.link.open:
            super()._call(event, payload)


def trainer_sinks(link: TrainerLink, probes: ProbeSet, rows: int) -> list[Any]:
    """A trainer's integrations as sinks: W&B's section and tables (its active run, when
    ``args.report_to`` names it) and TensorBoard's text while they are open, then the log every
    integration reads."""
    wandb = WandbSection(probes, rows) if "wandb" in (link.args.report_to or []) else None
    board = link.integration("TensorBoardCallback")  # its writer is the trainer's (or forgetwatch's own)
    tensorboard = TensorBoardText(probes, lambda: board.tb_writer, rows) if board else None
    return [WhileTraining(link, *(s for s in (wandb, tensorboard) if s)), TrainerLog(link, wandb)]
