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
    """One evaluation of the live model against the base: what every sink and the stop rule read.

    Attributes:
        step: the training step it was made at.
        report: the :class:`~forgetwatch.results.report.TransitionReport` against the base, trajectory figures included.
        answers: the live model's :class:`~forgetwatch.Answers`.
        seconds: how long scoring and comparing took.
        stop: why training should stop here (a sentence), or ``None``.
        trigger: what asked for it (``"schedule"``, ``"evaluate"``, ``"train_end"``, or a caller's word).
        probes, base, trajectory: the run's probes, the base answers, every probe's correctness so far.
        logged: the report whose figures are logged: by category group where the run maps categories
            into groups, holding only the categories (or groups) that get keys of their own.
        drift: train KL to the base (``train_kl``, over ``rows`` and ``tokens``, in ``seconds``); empty when not measured.
        repair, repaired, repair_state: the repair method's name (or ``None``), its figures since the last
            evaluation (``replay/loss``, ...) and its state after this one (what a resume reads back).
        notes: what the schedule says at this evaluation, for the console line.

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
    logged: TransitionReport
    drift: dict[str, float] = field(default_factory=dict)
    repair: str | None = None
    repaired: dict[str, float] = field(default_factory=dict)
    repair_state: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
