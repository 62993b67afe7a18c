"""The transformers ``Trainer`` as a callback sees it, through public routes only: what every
event hands it (``args``, ``state``, ``control``, the model, the optimizer, the training data
loader) and, when the user gives it (``trainer=``), the trainer's ``callback_handler``.

Logging: ``Trainer.log`` hands its dict to the callbacks in list order, and the reporting
integrations come before the user's callbacks, so keys added in a callback's ``on_log`` come
too late for them; calling ``Trainer.log`` from a callback would take TRL trainers' averaged
metrics (loss, rewards, ...) away from their next log line. So :meth:`TrainerLink.emit` appends
forgetwatch's metrics to ``state.log_history`` at the step they were measured and hands them to
each integration's ``on_log``: with ``trainer=``, to every callback of its handler; without, to
those forgetwatch reaches alone (W&B's active run, see :mod:`forgetwatch.sinks.wandb`, and a
TensorBoard writer of its own). transformers gives a callback no public way to the trainer
running it, so other integrations (MLflow, Comet, ...) need ``trainer=``.

Checkpoints: a resumed run (``state.global_step > 0`` when training begins) reads its kept files
from ``args.resume_from_checkpoint``, else from ``<run dir>/checkpoint-<global_step>`` (what
``train(resume_from_checkpoint=True)`` resumes). A checkpoint in another folder given to
``train()`` alone is out of a callback's sight: set ``args.resume_from_checkpoint`` to it too.
In a hyperparameter search a trial's folder is ``<output_dir>/<state.trial_name>``, which is the
folder's name only when ``hyperparameter_search(hp_name=...)`` is given: give it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

logger = logging.getLogger("forgetwatch")

#: Callbacks that print every log dict to the console: forgetwatch's one line replaces them.
#: Only these classes: a framework's subclass keeps a log of its own (ms-swift's ``logging.jsonl``).
CONSOLE_CALLBACKS = frozenset(
    {"ProgressCallback", "PrinterCallback", "NotebookProgressCallback", "RichProgressCallback"}
)

#: ``args.report_to`` entries reached without ``trainer=``
REACHED_ALONE = frozenset({"wandb", "tensorboard"})


def sharded_run(args: Any) -> bool:
    """Whether the training arguments shard the model (DeepSpeed ZeRO, FSDP).

    Example:
        >>> from types import SimpleNamespace
        >>> sharded_run(SimpleNamespace(fsdp="full_shard"))
        True
    """
    return bool(getattr(args, "deepspeed", None) or getattr(args, "fsdp", None))


def grad_scaler(optimizer: Any) -> tuple[Any, Any] | None:
    """The enabled gradient scaler of accelerate's ``optimizer`` (the one every trainer event is
    handed; fp16 mixed precision on a GPU) and the optimizer it steps (accelerate's wrapper taken
    off, as the scaler keeps its state by it), or ``None``.

    Example:
        >>> grad_scaler(None) is None
        True
    """
    scaler = getattr(optimizer, "scaler", None)
    if scaler is None or not scaler.is_enabled():
        return None
    from accelerate.optimizer import AcceleratedOptimizer

    while isinstance(optimizer, AcceleratedOptimizer):
        optimizer = optimizer.optimizer
    return scaler, optimizer


def _saved_at(checkpoint: Path) -> int | None:
    """The global step of the checkpoint's ``trainer_state.json``, or ``None``."""
    try:
        return int(json.loads((checkpoint / "trainer_state.json").read_text())["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


class TrainerLink:
    """The trainer as forgetwatch sees it during one ``train()`` call.

    Example:
        >>> link = TrainerLink(callback, trainer=None)                # doctest: +SKIP
        >>> link.attach(args, state, control, model=model)  # in on_train_begin   # doctest: +SKIP
        >>> link.checkpoint_dir(20)                                    # doctest: +SKIP
        PosixPath('out/checkpoint-20')
    """

    def __init__(self, callback: Any, trainer: Any = None):
        self.callback, self.trainer = callback, trainer
        self.args: Any = None
        self.state: Any = None  # the trainer's state and control during train()
        self.control: Any = None
        self.objects: dict[str, Any] = {}  # what the trainer hands every event: model, optimizer, ...
        self.own: list[Any] = []  # integrations forgetwatch runs itself, without trainer=
        self.resuming: Path | None = None  # the checkpoint this train() call resumes from
        self.open = False  # whether the integrations take logs now
        self._said: set[str] = set()

    def attach(self, args: Any, state: Any, control: Any, **objects: Any) -> None:
        """Take the trainer's arguments, state and event objects, and find the checkpoint being
        resumed (call it from ``on_train_begin``)."""
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
                f"callback, so the trials' files go to {self.run_dir()} one after the other, none into their "
                "checkpoints; give hyperparameter_search(hp_name=...) to keep each trial's own"
            )
        self.resuming = self._resumed(state.global_step) if state.global_step > 0 else None

    def _say_once(self, message: str) -> None:
        if message not in self._said:
            self._said.add(message)
            logger.warning(message)

    def _resumed(self, step: int) -> Path | None:
        given = getattr(self.args, "resume_from_checkpoint", None)
        if isinstance(given, str) and given and _saved_at(Path(given)) == step:
            return Path(given)
        usual = self.checkpoint_dir(step)
        if usual.is_dir():
            return usual
        self._say_once(
            f"forgetwatch: resuming at step {step} from a checkpoint other than {usual}, which a callback cannot "
            "see: set args.resume_from_checkpoint to it for forgetwatch to read its files there"
        )
        return None

    def close(self) -> None:
        """The integrations take no more logs (call it from ``on_train_end``); forgetwatch's own close."""
        self.open = False
        for integration in self.own:
            integration.on_train_end(self.args, self.state, self.control)
        self.own = []

    def resume_folders(self, subdir: str) -> list[Path]:
        """Where a resumed run finds its kept files first: ``subdir`` of the checkpoint it resumes
        from, then of this run's checkpoint at the same step (none on a fresh run)."""
        if self.resuming is None:
            return []
        return [self.resuming / subdir, self.checkpoint_dir(self.state.global_step) / subdir]

    def checkpoint_folders(self, subdir: str) -> list[Path]:
        """``subdir`` of this run's checkpoints and of the one it resumes from."""
        folders = sorted(self.run_dir().glob(f"checkpoint-*/{subdir}"))
        return folders + ([self.resuming / subdir] if self.resuming is not None else [])

    def run_dir(self) -> Path:
        """Where this run saves its checkpoints: ``output_dir``, or a named trial's folder in it."""
        trial = self.state.trial_name if self.state.is_hyper_param_search else None
        return Path(self.args.output_dir, trial or "")

    def checkpoint_dir(self, step: int) -> Path:
        """The folder the trainer saves the checkpoint of ``step`` to."""
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
        """Log ``metrics`` at ``state.global_step``: into ``state.log_history``, as ``Trainer.log``
        writes it, and to the ``on_log`` of every integration but console printers, the classes
        named in ``skip`` and this callback. ``control.should_log`` is left alone (resetting it,
        as ``CallbackHandler.on_log`` does, would cancel the trainer's own log line at this step)."""
        state = self.state
        epoch = {} if state.epoch is None else {"epoch": state.epoch}
        state.log_history.append({**metrics, **epoch, "step": state.global_step})
        for cb in self.integrations:
            if cb is self.callback or type(cb).__name__ in CONSOLE_CALLBACKS:
                continue
            if not any(c.__name__ in skip for c in type(cb).__mro__):
                cb.on_log(self.args, state, self.control, logs=dict(metrics), **self.objects)
