"""All of forgetwatch's coupling to a transformers ``Trainer``, in one place.

A callback is handed the model, the tokenizer and the optimizer, but not the trainer: its
``CallbackHandler`` (to log to every integration without ``Trainer.log``), the checkpoint being
resumed, and the folder a checkpoint goes to (hyperparameter-search trials save under
``run-*/``). Public sources come first: ``trainer=`` (or ``trainer.add_callback`` after
construction with ``trainer=``), ``args.resume_from_checkpoint``, and
``<run dir>/checkpoint-<global_step>`` (what ``resume_from_checkpoint=True`` resumes). transformers
gives a callback no public way to reach the trainer that runs it, nor a checkpoint resumed from
another folder: for those, and only then, :func:`running_train` finds the frame that executes
``Trainer.train`` (by its code object, not by a local's name) and reads its ``self`` and its
documented ``resume_from_checkpoint`` argument. ``tests/test_callback.py`` checks it against the
installed transformers.

forgetwatch does not call ``Trainer.log``: TRL trainers override it to average and clear their
own metric buffers (loss, entropy, rewards), so an extra call from a callback would take those
values away from the trainer's next log line. Instead :meth:`TrainerLink.emit` appends the
metrics to ``state.log_history`` and hands them to every other callback's ``on_log``, as
``Trainer.log`` would, at the global step they were measured.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import Any

logger = logging.getLogger("forgetwatch")

#: How many frames below ``Trainer.train`` a callback event may run.
MAX_DEPTH = 16

#: Callbacks that print every log dict to the console: forgetwatch's one line replaces them.
#: Only these classes: a framework's subclass keeps a log of its own (ms-swift's ``logging.jsonl``).
CONSOLE_CALLBACKS = frozenset(
    {"ProgressCallback", "PrinterCallback", "NotebookProgressCallback", "RichProgressCallback"}
)


def running_train() -> FrameType | None:
    """The frame executing ``transformers.Trainer.train`` below the caller, if any (no public
    way exists to reach the trainer running a callback)."""
    from transformers import Trainer

    code = Trainer.train.__code__
    frame = sys._getframe(1)
    for _ in range(MAX_DEPTH):
        if frame is None:
            return None
        if frame.f_code is code:
            return frame
        frame = frame.f_back
    return None


def sharded_run(args: Any) -> bool:
    """Whether the training arguments shard the model (DeepSpeed ZeRO, FSDP).

    Example:
        >>> from types import SimpleNamespace
        >>> sharded_run(SimpleNamespace(fsdp="full_shard"))
        True
    """
    return bool(getattr(args, "deepspeed", None) or getattr(args, "fsdp", None))


def _prints_logs(callback: Any) -> bool:
    return type(callback).__name__ in CONSOLE_CALLBACKS


def _saved_at(checkpoint: Path) -> int | None:
    """The global step of the checkpoint's ``trainer_state.json``, or ``None``."""
    try:
        return int(json.loads((checkpoint / "trainer_state.json").read_text())["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


class TrainerLink:
    """The trainer as forgetwatch sees it during one ``train()`` call.

    Example:
        >>> link = TrainerLink(callback, trainer=trainer)       # doctest: +SKIP
        >>> link.attach(args, state)   # in on_train_begin        # doctest: +SKIP
        >>> link.checkpoint_dir(20)                               # doctest: +SKIP
        PosixPath('out/run-3/checkpoint-20')
    """

    def __init__(self, callback: Any, trainer: Any = None):
        self.callback = callback
        self.trainer = trainer
        self.handler: Any = None
        self.resuming: Path | None = None  # the checkpoint this train() call resumes from
        self.open = False  # whether the trainer's integrations take logs now
        self._args: Any = None
        self.state: Any = None  # the trainer's state and control during train()
        self.control: Any = None
        self._warned = False

    def attach(self, args: Any, state: Any, control: Any) -> None:
        """Find the trainer, its callback handler and the checkpoint being resumed (call it from
        ``on_train_begin``), and run this callback ahead of ``EarlyStoppingCallback``."""
        self._args, self.state, self.control, self.open = args, state, control, True
        frame = None
        if self.trainer is None:
            frame = running_train()
            self.trainer = frame.f_locals.get("self") if frame is not None else None
        handler = getattr(self.trainer, "callback_handler", None)
        self.handler = handler if handler is not None and any(cb is self.callback for cb in handler.callbacks) else None
        if self.handler is None and not self._warned:
            self._warned = True
            logger.warning(
                "forgetwatch: no transformers Trainer is dispatching this callback, so its metrics "
                "go to state.log_history only and reach no reporting integration (W&B, TensorBoard, "
                "...); pass trainer= to ForgetWatchCallback if a trainer is running it"
            )
        self.resuming = self._resumed_checkpoint(state, frame) if state.global_step > 0 else None
        self._run_before_early_stopping()

    def _resumed_checkpoint(self, state: Any, frame: FrameType | None) -> Path | None:
        step = state.global_step
        given = getattr(self._args, "resume_from_checkpoint", None)
        if isinstance(given, str) and given and _saved_at(Path(given)) == step:
            return Path(given)
        usual = self.checkpoint_dir(step)
        if usual.is_dir():
            return usual
        frame = frame or running_train()  # a checkpoint in another folder: train()'s own argument
        given = frame.f_locals.get("resume_from_checkpoint") if frame is not None else None
        return Path(given) if isinstance(given, str) and given else None

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

    def grad_scaler(self) -> tuple[Any, Any] | None:
        """The trainer's enabled gradient scaler (fp16 mixed precision on a GPU) and the optimizer
        it steps (accelerate's wrapper taken off, as the scaler keeps its state by it), or ``None``."""
        scaler = getattr(getattr(self.trainer, "accelerator", None), "scaler", None)
        if scaler is None or not scaler.is_enabled():
            return None
        from accelerate.optimizer import AcceleratedOptimizer

        optimizer = getattr(self.trainer, "optimizer", None)
        while isinstance(optimizer, AcceleratedOptimizer):
            optimizer = optimizer.optimizer
        return scaler, optimizer

    def run_dir(self, args: Any = None) -> Path:
        """Where this run saves its checkpoints: ``output_dir``, or a trial's ``run-*`` folder
        inside it during a hyperparameter search."""
        get = getattr(self.trainer, "_get_output_dir", None)
        if callable(get):
            return Path(get(trial=getattr(self.trainer, "_trial", None)))
        return Path((args or self._args).output_dir)

    def checkpoint_dir(self, step: int) -> Path:
        """The folder the trainer saves the checkpoint of ``step`` to."""
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        return self.run_dir() / f"{PREFIX_CHECKPOINT_DIR}-{step}"

    def integration(self, name: str) -> Any:
        """The trainer's callback of class ``name`` (e.g. ``"WandbCallback"``), or ``None``."""
        callbacks = getattr(self.handler, "callbacks", [])
        return next((cb for cb in callbacks if any(c.__name__ == name for c in type(cb).__mro__)), None)

    def emit(self, metrics: Mapping[str, float], skip: tuple[str, ...] = ()) -> None:
        """Log ``metrics`` at ``state.global_step``: into ``state.log_history`` and to every
        callback's ``on_log`` except console printers, the classes named in ``skip`` and this
        callback itself.

        ``control.should_log`` is left alone (``CallbackHandler.on_log`` would reset it, which
        would cancel the trainer's own log line at this step).
        """
        state, control = self.state, self.control
        entry = dict(metrics)
        if state.epoch is not None:
            entry["epoch"] = state.epoch
        state.log_history.append({**entry, "step": state.global_step})  # as Trainer.log writes it
        handler = self.handler
        if handler is None:
            return
        everyone = handler.callbacks
        # dispatch through the handler: the same arguments Trainer.log passes
        handler.callbacks = [
            cb
            for cb in everyone
            if cb is not self.callback
            and not _prints_logs(cb)
            and not any(c.__name__ in skip for c in type(cb).__mro__)
        ]
        try:
            handler.call_event("on_log", self._args, state, control, logs=dict(metrics))
        finally:
            handler.callbacks = everyone

    def _run_before_early_stopping(self) -> None:
        """Move the callback ahead of transformers' EarlyStoppingCallback, so the
        ``eval_forgetwatch_*`` metrics exist when it reads them."""
        from transformers import EarlyStoppingCallback

        if self.handler is None:
            return
        callbacks = self.handler.callbacks
        mine = next(i for i, cb in enumerate(callbacks) if cb is self.callback)
        first = next((i for i, cb in enumerate(callbacks) if isinstance(cb, EarlyStoppingCallback)), None)
        if first is not None and first < mine:
            callbacks.insert(first, callbacks.pop(mine))
