"""All of forgetwatch's coupling to transformers ``Trainer`` internals, in one place.

A callback is handed the model, the tokenizer and the optimizer, but not the trainer, its
``CallbackHandler`` (needed to log to every integration without ``Trainer.log``), the
checkpoint being resumed, nor the folder a checkpoint goes to (hyperparameter-search trials
save under ``run-*/``). Given ``trainer=``, they are read from it; otherwise the trainer is
found on the call stack while it dispatches ``on_train_begin``. The checkpoint being resumed is
only ever a local of ``Trainer._inner_training_loop``, so it is always read from the stack.

forgetwatch does not call ``Trainer.log``: TRL trainers override it to average and clear their
own metric buffers (loss, entropy, rewards), so an extra call from a callback would take those
values away from the trainer's next log line. Instead :meth:`TrainerBridge.emit` appends the
metrics to ``state.log_history`` and hands them to every other callback's ``on_log``, as
``Trainer.log`` would, at the global step they were measured.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: How many frames below a callback event the trainer's own frame may be.
MAX_DEPTH = 12

#: Callbacks that print every log dict to the console: forgetwatch's one line replaces them.
CONSOLE_CALLBACKS = frozenset({"ProgressCallback", "PrinterCallback", "NotebookProgressCallback",
                               "RichProgressCallback"})


def _find_local(name: str, accept: Callable[[Any], bool]) -> Any:
    frame = sys._getframe(2)
    for _ in range(MAX_DEPTH):
        if frame is None:
            return None
        if name in frame.f_locals and accept(frame.f_locals[name]):
            return frame.f_locals[name]
        frame = frame.f_back
    return None


def _calling_trainer() -> Any:
    from transformers import Trainer

    return _find_local("self", lambda owner: isinstance(owner, Trainer))


def _calling_handler(callback: Any) -> Any:
    from transformers.trainer_callback import CallbackHandler

    return _find_local("self", lambda owner: isinstance(owner, CallbackHandler)
                       and any(cb is callback for cb in owner.callbacks))


def resumed_checkpoint() -> str | None:
    """The checkpoint directory ``Trainer.train`` is resuming from, if any (call it from
    inside a trainer event)."""
    return _find_local("resume_from_checkpoint", lambda value: isinstance(value, str) and bool(value))


def _prints_logs(callback: Any) -> bool:
    return any(cls.__name__ in CONSOLE_CALLBACKS for cls in type(callback).__mro__)


class TrainerBridge:
    """The trainer as forgetwatch sees it during one ``train()`` call.

    Example:
        >>> bridge = TrainerBridge(callback, trainer=trainer)       # doctest: +SKIP
        >>> bridge.attach()   # in on_train_begin                     # doctest: +SKIP
        >>> bridge.checkpoint_dir(args, 20)                           # doctest: +SKIP
        PosixPath('out/run-3/checkpoint-20')
    """

    def __init__(self, callback: Any, trainer: Any = None):
        self.callback = callback
        self.trainer = trainer
        self.handler: Any = None
        self._warned = False

    def attach(self) -> None:
        """Find the trainer and its callback handler (call from ``on_train_begin``), and run
        this callback ahead of transformers' ``EarlyStoppingCallback``."""
        if self.trainer is None:
            self.trainer = _calling_trainer()
        handler = getattr(self.trainer, "callback_handler", None)
        if handler is None or not any(cb is self.callback for cb in handler.callbacks):
            handler = _calling_handler(self.callback)
        self.handler = handler
        if handler is None and not self._warned:
            self._warned = True
            logger.warning("forgetwatch: no transformers Trainer is dispatching this callback, so its metrics "
                           "go to state.log_history only and reach no reporting integration (W&B, TensorBoard, "
                           "...); pass trainer= to ForgetWatchCallback if a trainer is running it")
        self._run_before_early_stopping()

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

    def run_dir(self, args: Any) -> Path:
        """Where this run saves its checkpoints: ``output_dir``, or a trial's ``run-*`` folder
        inside it during a hyperparameter search."""
        get = getattr(self.trainer, "_get_output_dir", None)
        if callable(get):
            return Path(get(trial=getattr(self.trainer, "_trial", None)))
        return Path(args.output_dir)

    def checkpoint_dir(self, args: Any, step: int) -> Path:
        """The folder the trainer saves the checkpoint of ``step`` to."""
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        return self.run_dir(args) / f"{PREFIX_CHECKPOINT_DIR}-{step}"

    def integration(self, name: str) -> Any:
        """The trainer's callback of class ``name`` (e.g. ``"WandbCallback"``), or ``None``."""
        callbacks = getattr(self.handler, "callbacks", [])
        return next((cb for cb in callbacks if any(c.__name__ == name for c in type(cb).__mro__)), None)

    def emit(self, metrics: Mapping[str, float], args: Any, state: Any, control: Any,
             skip: tuple[str, ...] = ()) -> None:
        """Log ``metrics`` at ``state.global_step``: into ``state.log_history`` and to every
        callback's ``on_log`` except console printers, the classes named in ``skip`` and this
        callback itself.

        ``control.should_log`` is left alone (``CallbackHandler.on_log`` would reset it, which
        would cancel the trainer's own log line at this step).
        """
        entry = dict(metrics)
        if state.epoch is not None:
            entry["epoch"] = state.epoch
        state.log_history.append({**entry, "step": state.global_step})  # as Trainer.log writes it
        handler = self.handler
        if handler is None:
            return
        everyone = handler.callbacks
        # dispatch through the handler: the same arguments Trainer.log passes
        handler.callbacks = [cb for cb in everyone if cb is not self.callback and not _prints_logs(cb)
                             and not any(c.__name__ in skip for c in type(cb).__mro__)]
        try:
            handler.call_event("on_log", args, state, control, logs=dict(metrics))
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
