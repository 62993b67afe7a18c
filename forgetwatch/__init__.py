"""forgetwatch: watch an LLM forget while it is being post-trained.

Example:
    >>> from forgetwatch import ProbeSet, evaluate, compare     # doctest: +SKIP
    >>> probes = ProbeSet.from_jsonl("probes.jsonl")            # doctest: +SKIP
    >>> base = evaluate(base_model, tokenizer, probes)          # doctest: +SKIP
    >>> print(compare(base, evaluate(tuned_model, tokenizer, probes)).summary())  # doctest: +SKIP
"""

import logging as _logging

from .answers import Answers, AnswersMismatchError
from .console import ConsoleHandler as _ConsoleHandler
from .events import BaseSnapshot, Evaluation
from .metrics import compare
from .probes import Probe, ProbeError, ProbeKind, ProbeSet
from .replay import ReplayPool, ReplayPoolError
from .replay.driver import Replay
from .report import TransitionReport
from .run_dir import load_trajectory
from .scoring import Scorer, evaluate
from .settings import Output, ReplaySettings, Schedule, Scoring, Signals, Stopping
from .sinks import Sink
from .trajectory import Trajectory
from .watch import Watch

__version__ = "0.1.0"

# warnings on a line of their own, not glued to a progress bar, when the application shows them nowhere else
if not any(isinstance(h, _ConsoleHandler) for h in _logging.getLogger(__name__).handlers):
    _logging.getLogger(__name__).addHandler(_ConsoleHandler())


def __getattr__(name: str):
    # the callback pulls in the transformers Trainer stack: import it when first asked for
    if name == "ForgetWatchCallback":
        from .callback import ForgetWatchCallback

        return ForgetWatchCallback
    if name == "ForgetWatchConfig":
        from .config import ForgetWatchConfig

        return ForgetWatchConfig
    raise AttributeError(f"module 'forgetwatch' has no attribute {name!r}")


__all__ = [
    "Answers",
    "AnswersMismatchError",
    "BaseSnapshot",
    "Evaluation",
    "ForgetWatchCallback",
    "ForgetWatchConfig",
    "Output",
    "Probe",
    "ProbeError",
    "ProbeKind",
    "ProbeSet",
    "Replay",
    "ReplayPool",
    "ReplayPoolError",
    "ReplaySettings",
    "Schedule",
    "Scorer",
    "Scoring",
    "Signals",
    "Sink",
    "Stopping",
    "Trajectory",
    "TransitionReport",
    "Watch",
    "__version__",
    "compare",
    "evaluate",
    "load_trajectory",
]
