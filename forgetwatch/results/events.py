"""What a run hands to its sinks: the base once, then each evaluation."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forgetwatch.probes import ProbeSet
from forgetwatch.results.answers import Answers
from forgetwatch.results.report import TransitionReport
from forgetwatch.results.trajectory import Trajectory


@dataclass
class BaseSnapshot:
    """The base model's answers as a run starts at ``step``: ``computed`` now or loaded, kept at ``path``, with
    ``metrics`` to log once (``forgetwatch/noise_floor``) and ``notes`` for the console."""

    answers: Answers
    path: Path | None
    computed: bool
    step: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass
class Evaluation:
    """One evaluation of the live model against the base: what every sink and the stop rule read.

    Attributes:
        report: the :class:`~forgetwatch.TransitionReport` against the base, trajectory figures included.
        stop: why training should stop here (a sentence), or ``None``.
        trigger: what asked for it (``"schedule"``, ``"evaluate"``, ``"train_end"``, or a caller's word).
        metrics: what every logger gets: ``forgetwatch/<name>``, ``forgetwatch/<category>/<name>`` (by group where
            there are groups, logged categories only), the kept plug-ins' and train KL's; none that does not apply.
        drift: train KL to the base (``train_kl``, ``rows``, ``tokens``, ``seconds``); empty when not measured.
        kept: each kept plug-in's ``metrics`` since the last evaluation and ``state``, by its name.

    Example:
        >>> ev = watch.evaluate(model, step=100)      # doctest: +SKIP
        >>> ev.report.forgetting, bool(ev.stop)       # doctest: +SKIP
        (0.04, False)
    """

    step: int
    report: TransitionReport
    answers: Answers
    seconds: float
    stop: str | None
    trigger: str
    probes: ProbeSet
    base: Answers
    trajectory: Trajectory
    metrics: dict[str, float] = field(default_factory=dict)
    drift: dict[str, float] = field(default_factory=dict)
    kept: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass
class Ending:
    """What a plug-in found after training (a merge): ``metrics`` to log once at ``step``, ``line`` for the console."""

    step: int
    metrics: dict[str, float]
    line: str
