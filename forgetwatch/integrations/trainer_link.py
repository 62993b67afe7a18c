"""The transformers ``Trainer`` as a callback sees it, through public routes only (why: docs/trainer.md, "Logging" and
"Resume"), and the sinks that log forgetwatch's figures through it, at the step they were measured."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from forgetwatch.probes import ProbeSet
from forgetwatch.results.events import BaseSnapshot, Ending, Evaluation
from forgetwatch.sinks import Sinks
from forgetwatch.sinks.tables import TensorBoardText, WandbSection

logger = logging.getLogger("forgetwatch")

#: Callbacks that print every log dict to the console: forgetwatch's one line replaces them.
#: Only these classes: a framework's subclass keeps a log of its own (ms-swift's ``logging.jsonl``).
CONSOLE_CALLBACKS = frozenset(
    {"ProgressCallback", "PrinterCallback", "NotebookProgressCallback", "RichProgressCallback"}
)

#: ``args.report_to`` entries reached without ``trainer=``
REACHED_ALONE = frozenset({"wandb", "tensorboard"})


def sharded_run(args: Any) -> bool:
    """Whether the training arguments shard the model (DeepSpeed ZeRO, FSDP)."""
    return bool(getattr(args, "deepspeed", None) or getattr(args, "fsdp", None))


def grad_scaler(optimizer: Any) -> tuple[Any, Any] | None:
    """The enabled gradient scaler of accelerate's ``optimizer`` (fp16) and the optimizer it steps, or ``None``."""
    scaler = getattr(optimizer, "scaler", None)
    if scaler is None or not scaler.is_enabled():
        return None
    from accelerate.optimizer import AcceleratedOptimizer

    while isinstance(optimizer, AcceleratedOptimizer):
        optimizer = optimizer.optimizer
    return scaler, optimizer


class TrainerLink:
    """The trainer as forgetwatch sees it during one ``train()`` call."""

    def __init__(self, callback: Any, trainer: Any = None):
        self.callback, self.trainer = callback, trainer
        self.args: Any = None
        self.state: Any = None  # the trainer's state and control during train()
        self.control: Any = None
        self.objects: dict[str, Any] = {}  # what the trainer hands every event: model, optimizer, ...
        self.own: list[Any] = []  # integrations forgetwatch runs itself, without trainer=
        self.open = False  # whether the integrations take logs now
        self._said: set[str] = set()

    def attach(self, args: Any, state: Any, control: Any, **objects: Any) -> None:
        """Take the trainer's arguments, state and event objects (on_train_begin)."""
        self.args, self.state, self.control, self.objects, self.open = args, state, control, objects, True
        reported = set(args.report_to or [])
        if self.trainer is None:
            if missed := ", ".join(sorted(reported - REACHED_ALONE)):
                self._say_once(
                    f"forgetwatch: its metrics reach state.log_history, W&B and TensorBoard but not {missed}: for "
                    "every reporting integration give the trainer, ForgetWatchCallback(..., trainer=trainer), then "
                    "trainer.add_callback(callback)"
                )
            if "tensorboard" in reported:  # transformers' own writer, as the trainer's makes it
                from transformers.integrations import TensorBoardCallback

                self.own = [TensorBoardCallback()]
                self.own[0].on_train_begin(args, state, control)
        if state.is_hyper_param_search and not state.trial_name:
            self._say_once(
                "forgetwatch: a hyperparameter search without hp_name: transformers names no trial's folder to a "
                f"callback, so the trials' files go to {self.run_dir()} one after the other (each setting the one "
                "before aside); give hyperparameter_search(hp_name=...) to keep each trial's own"
            )

    def _say_once(self, message: str) -> None:
        if message not in self._said:
            self._said.add(message)
            logger.warning(message)

    def close(self) -> None:
        """The integrations take no more logs; forgetwatch's own close."""
        self.open = False
        for integration in self.own:
            integration.on_train_end(self.args, self.state, self.control)
        self.own = []

    def run_dir(self) -> Path:
        """Where this run saves its checkpoints: ``output_dir``, or a named trial's folder in it."""
        trial = self.state.trial_name if self.state.is_hyper_param_search else None
        return Path(self.args.output_dir, trial or "")

    def checkpoint_dir(self, step: int) -> Path:
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        return self.run_dir() / f"{PREFIX_CHECKPOINT_DIR}-{step}"

    @property
    def integrations(self) -> list[Any]:
        """The trainer's callbacks (``trainer=``), or the integrations forgetwatch runs itself."""
        return list(self.trainer.callback_handler.callbacks) if self.trainer is not None else self.own

    def integration(self, name: str) -> Any:
        """The callback of class ``name`` (e.g. ``"TensorBoardCallback"``) among :attr:`integrations`, or ``None``."""
        return next((cb for cb in self.integrations if any(c.__name__ == name for c in type(cb).__mro__)), None)

    def emit(self, metrics: Mapping[str, float], skip: tuple[str, ...] = ()) -> None:
        """Log ``metrics`` at ``state.global_step`` into ``state.log_history`` and to the ``on_log`` of every
        integration but console printers, ``skip`` and this callback (``control.should_log`` left alone)."""
        state = self.state
        epoch = {} if state.epoch is None else {"epoch": state.epoch}
        try:
            state.log_history.append({**metrics, **epoch, "step": state.global_step})
            for cb in self.integrations:
                if cb is self.callback or type(cb).__name__ in CONSOLE_CALLBACKS:
                    continue
                if not any(c.__name__ in skip for c in type(cb).__mro__):
                    cb.on_log(self.args, state, self.control, logs=dict(metrics), **self.objects)
        except Exception as err:  # noqa: BLE001 - a logger that is gone must not end training
            logger.warning(
                "forgetwatch: sending the metrics of step %d to the trainer's integrations failed "
                "(%s: %s); training goes on, and the figures are in the history file",
                state.global_step,
                type(err).__name__,
                err,
            )


class TrainerLog:
    """A sink, on every rank as ``Trainer.log`` runs (the integrations write on the main process only): each event's
    metrics through ``link`` while the integrations are open, to all but those of classes named in ``skip``."""

    all_ranks = True

    def __init__(self, link: TrainerLink, skip: tuple[str, ...] = ()):
        self.link, self.skip = link, skip

    def _log(self, event: BaseSnapshot | Evaluation | Ending) -> None:
        if self.link.open and event.metrics:
            self.link.emit(event.metrics, self.skip)

    on_base = on_evaluation = on_ending = _log


class WhileTraining(Sinks):
    """Forwards sinks' events only while the trainer's integrations are open (after training they may be closed:
    the history file keeps the figures)."""

    def __init__(self, link: TrainerLink, *sinks: Any):
        super().__init__(sinks)
        self.link = link

    def _call(self, event: str, payload: Any) -> None:
        if self.link.open:
            super()._call(event, payload)


def trainer_sinks(link: TrainerLink, probes: ProbeSet, rows: int) -> list[Any]:
    """W&B's section and tables (when ``args.report_to`` names it; the trainer's ``WandbCallback`` would put them
    under ``train/``) and TensorBoard's text, then the log every integration reads."""
    wandb = WandbSection(probes, rows) if "wandb" in (link.args.report_to or []) else None
    board = link.integration("TensorBoardCallback")  # its writer is the trainer's (or forgetwatch's own)
    tensorboard = TensorBoardText(probes, lambda: board.tb_writer, rows) if board else None
    rank_zero = WhileTraining(link, *(s for s in (wandb, tensorboard) if s))
    return [rank_zero, TrainerLog(link, skip=("WandbCallback",) if wandb else ())]
