"""Per-probe correctness over a whole run (the base at step 0, then each evaluation) and its drift signal."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from forgetwatch.results.answers import Answers
from forgetwatch.results.history import decode_column, encode_column
from forgetwatch.results.metrics import drift_signal
from forgetwatch.results.report import TransitionReport


class Trajectory:
    """Whether each probe was right, and its drift signal, at the base (step ``0``) and each evaluation
    (``correct`` and ``signal``: probes × steps). A *forgetting event* is a probe going from right at one
    evaluation to wrong at the next (Toneva et al., 2019).

    Example:
        >>> t = Trajectory(["a", "b"], ["x", "x"], [0, 10, 20], [[1, 0, 1], [1, 1, 0]])
        >>> t.forgetting_events().tolist(), t.persistent().tolist(), t.survival().tolist()
        ([1, 1], [False, False], [1.0, 0.5, 0.0])
    """

    def __init__(
        self,
        ids: Sequence[str],
        categories: Sequence[str],
        steps: ArrayLike,
        correct: ArrayLike,
        signal: ArrayLike | None = None,
        fingerprint: str = "",
    ):
        self.ids, self.categories, self.fingerprint = list(ids), list(categories), fingerprint
        self.steps = np.asarray(steps, dtype=np.int64).reshape(-1)
        self.correct = np.asarray(correct, dtype=bool).reshape(len(self.ids), len(self.steps))
        signal = np.full(self.correct.shape, np.nan) if signal is None else signal
        self.signal = np.asarray(signal, dtype=np.float32).reshape(self.correct.shape)

    @classmethod
    def start(cls, base: Answers) -> Trajectory:
        return cls.from_history(base, [])

    def plus(self, step: int, answers: Answers) -> Trajectory:
        """A new trajectory: this one and an evaluation's column (answers aligned with :attr:`ids`)."""
        # the signal at float16's precision, as the history stores it: a resumed run shows the same numbers
        signal = drift_signal(answers).astype(np.float32).astype(np.float16)
        correct, signal = np.column_stack([self.correct, answers.correct]), np.column_stack([self.signal, signal])
        return Trajectory(self.ids, self.categories, [*self.steps, step], correct, signal, self.fingerprint)

    def __repr__(self) -> str:
        return f"Trajectory({len(self.ids)} probes, steps {self.steps.tolist()})"

    @cached_property
    def _events(self) -> np.ndarray:
        # probes × evaluations after the base: right at the one before, wrong at this one
        return self.correct[:, :-1] & ~self.correct[:, 1:]

    def forgetting_events(self) -> np.ndarray:
        """How many times each probe went from right at one evaluation to wrong at the next."""
        return self._events.sum(axis=1)

    def first_forgotten(self) -> np.ndarray:
        """The step of each probe's first forgetting event; ``-1`` where it has none."""
        events = np.column_stack([self._events, np.ones(len(self.ids), dtype=bool)])  # the last column: none
        return np.append(self.steps[1:], -1)[events.argmax(axis=1)]

    def regained(self) -> np.ndarray:
        """Whether each probe was right again at a later evaluation after a forgetting event."""
        lost_before = np.cumsum(self._events, axis=1)[:, :-1] > 0  # for each column from the third on
        return (lost_before & self.correct[:, 2:]).any(axis=1)

    def persistent(self) -> np.ndarray:
        """Right at the base and wrong at the last two evaluations (none before two)."""
        if len(self.steps) < 3:
            return np.zeros(len(self.ids), dtype=bool)
        return self.correct[:, 0] & ~self.correct[:, -1] & ~self.correct[:, -2]

    def survival(self, rows: ArrayLike | None = None) -> np.ndarray:
        """At each step, the share of base-correct probes (of ``rows``) with no forgetting event up to it."""
        rows = slice(None) if rows is None else np.asarray(rows, dtype=np.intp)
        right = self.correct[rows, 0]
        if not right.any():
            return np.full(len(self.steps), np.nan)
        unbroken = np.cumsum(self._events[rows], axis=1) == 0
        return np.concatenate([[1.0], unbroken[right].mean(axis=0)])

    def metrics(self, rows: ArrayLike | None = None) -> dict[str, float]:
        """The latest evaluation's figures for ``rows``: ``forgetting_events`` (summed) and, from the second
        evaluation on, ``forgetting_persistent``."""
        rows = slice(None) if rows is None else np.asarray(rows, dtype=np.intp)
        out = {"forgetting_events": float(self.forgetting_events()[rows].sum())}
        n = len(self.correct[rows])
        if len(self.steps) >= 3 and n:
            out["forgetting_persistent"] = float(self.persistent()[rows].sum()) / n
        return out

    def column(self, position: int = -1) -> dict[str, str]:
        """One evaluation's column as a history record stores it."""
        return encode_column(self.fingerprint, self.correct[:, position], self.signal[:, position])

    @classmethod
    def from_history(cls, base: Answers, records: Sequence[Mapping[str, Any]]) -> Trajectory:
        """The trajectory of a run from its base answers and history records (a record without a column: from its
        ids, no signal); a column of another probe set raises a ``HistoryError`` naming the field."""
        steps, correct, signal = [0], [base.correct], [drift_signal(base).astype(np.float32)]
        for record in records:
            if (column := record.get("columns")) is not None:
                right, margin = decode_column(column, len(base), base.probe_fingerprint)
            else:
                flipped = set(record["report"].get("forgotten_ids", [])) | set(record["report"].get("gained_ids", []))
                right = np.array([c != (i in flipped) for i, c in zip(base.ids, base.correct)], dtype=bool)
                margin = np.full(len(base), np.nan)
            steps.append(record["step"])
            correct.append(right)
            signal.append(margin)
        return cls(
            base.ids, base.categories, steps, np.column_stack(correct), np.column_stack(signal), base.probe_fingerprint
        )


def with_trajectory_metrics(
    report: TransitionReport, trajectory: Trajectory, categories: Sequence[str] | None = None
) -> TransitionReport:
    """``report`` with the trajectory's figures, overall and per category (``categories``: as the report's)."""
    rows: dict[str, list[int]] = {}
    for i, category in enumerate(trajectory.categories if categories is None else categories):
        rows.setdefault(category, []).append(i)
    children = {
        cat: dataclasses.replace(child, **trajectory.metrics(rows.get(cat, [])))
        for cat, child in report.by_category.items()
    }
    return dataclasses.replace(report, by_category=children, **trajectory.metrics())
