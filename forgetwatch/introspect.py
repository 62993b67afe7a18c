"""What a running transformers Trainer does not pass to its callbacks, read from the call stack.

Callbacks get the model, tokenizer and optimizer, but neither the ``CallbackHandler`` that
dispatches events (needed to log to every integration without ``Trainer.log``) nor the
checkpoint being resumed (``trainer.train(resume_from_checkpoint=path)`` does not record it
in ``args``). Both are locals of frames below the callback while it runs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

MAX_DEPTH = 12


def _find_local(name: str, accept: Callable[[Any], bool]) -> Any:
    frame = sys._getframe(2)
    for _ in range(MAX_DEPTH):
        if frame is None:
            return None
        if name in frame.f_locals and accept(frame.f_locals[name]):
            return frame.f_locals[name]
        frame = frame.f_back
    return None


def calling_handler(callback: Any) -> Any:
    """The transformers ``CallbackHandler`` dispatching an event to ``callback`` now, if any."""
    from transformers.trainer_callback import CallbackHandler

    return _find_local("self", lambda owner: isinstance(owner, CallbackHandler)
                       and any(cb is callback for cb in owner.callbacks))


def resumed_checkpoint() -> str | None:
    """The checkpoint directory ``Trainer.train`` is resuming from, if any."""
    return _find_local("resume_from_checkpoint", lambda value: isinstance(value, str) and bool(value))
