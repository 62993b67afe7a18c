"""What a run hands to its sinks: the base once, then each evaluation (plain records)."""

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
    """The base model's answers as a run starts.

    Attributes:
        answers: the base :class:`~forgetwatch.Answers`.
        path: the snapshot file the run keeps (``None`` if it keeps none).
        computed: whether they were scored now (``False``: loaded from a file).
        step: the training step the run starts (or resumes) at.
        metrics: figures to log once (``forgetwatch/noise_floor`` when it was measured now).
        notes: what the run says once as it starts, for the console (which categories are not logged).
    """

    answers: Answers
    path: Path | None
    computed: bool
    step: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass
class Evaluation:
    """One evaluation of the live model against the base.

    Attributes:
        step: the training step it was made at.
        report: the :class:`~forgetwatch.results.report.TransitionReport` against the base.
        answers: the live model's :class:`~forgetwatch.Answers`.
        seconds: how long scoring and comparing took.
        stop: why training should stop here (a sentence), or ``None``.
        trigger: what asked for it (``"schedule"``, ``"evaluate"``, ``"train_end"``, or a caller's word).
        metrics: the figures to log, ``forgetwatch/<name>`` (no NaN: a figure that does not apply is left out).
        record: the ``history.jsonl`` record of it.
        probes, base, trajectory: the run's probes, the base answers, every probe's correctness so far.
        notes: what the repair method and the schedule say at this evaluation, for the console line.

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
    metrics: dict[str, float]
    record: dict[str, Any]
    probes: ProbeSet
    base: Answers
    trajectory: Trajectory
    notes: list[str] = field(default_factory=list)
