"""forgetwatch: watch an LLM forget while it is being post-trained (docs/quickstart.md)."""

import logging as _logging

from forgetwatch.common.console import ConsoleHandler as _ConsoleHandler
from forgetwatch.config.settings import Monitor, Output, Scoring
from forgetwatch.merge import MergeAtEnd, MergeSweep, merge_sweep
from forgetwatch.probes import Probe, ProbeError, ProbeKind, ProbeSet
from forgetwatch.replay import Replay, ReplayPool, ReplayPoolError
from forgetwatch.results.answers import Answers, AnswersMismatchError
from forgetwatch.results.events import BaseSnapshot, Evaluation
from forgetwatch.results.metrics import compare
from forgetwatch.results.report import TransitionReport
from forgetwatch.results.trajectory import Trajectory
from forgetwatch.run.watch import Watch
from forgetwatch.scoring import Scorer, evaluate
from forgetwatch.sinks import Sink
from forgetwatch.store.read import load_trajectory

__version__ = "0.1.0"

# warnings on a line of their own, not glued to a progress bar, when the application shows them nowhere else
if not any(isinstance(h, _ConsoleHandler) for h in _logging.getLogger(__name__).handlers):
    _logging.getLogger(__name__).addHandler(_ConsoleHandler())


def __getattr__(name: str):
    # the callback pulls in the transformers Trainer stack: import it when first asked for
    if name == "ForgetWatchCallback":
        from forgetwatch.integrations.callback import ForgetWatchCallback

        return ForgetWatchCallback
    raise AttributeError(f"module 'forgetwatch' has no attribute {name!r}")


__all__ = [
    "Answers",
    "AnswersMismatchError",
    "BaseSnapshot",
    "Evaluation",
    "MergeAtEnd",
    "MergeSweep",
    "ForgetWatchCallback",
    "Monitor",
    "Output",
    "Probe",
    "ProbeError",
    "ProbeKind",
    "ProbeSet",
    "Replay",
    "ReplayPool",
    "ReplayPoolError",
    "Scorer",
    "Scoring",
    "Sink",
    "Trajectory",
    "TransitionReport",
    "Watch",
    "__version__",
    "compare",
    "evaluate",
    "load_trajectory",
    "merge_sweep",
]
