"""Per-probe correctness over a whole run (the base at step 0, then each evaluation) and its drift signal."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from forgetwatch.results.answers import Answers
from forgetwatch.results.history import HistoryError, decode_column, encode_column
from forgetwatch.results.metrics import margins
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
        self.ids = list(ids)
        self.fingerprint = fingerprint
        self.categories = list(categories)
        self.steps = np.asarray(steps, dtype=np.int64).reshape(-1)
        self.correct = np.asarray(correct, dtype=bool).reshape(len(self.ids), len(self.steps))
        shape = self.correct.shape
        self.signal = (
            np.full(shape, np.nan, dtype=np.float32)
            if signal is None
            else np.asarray(signal, dtype=np.float32).reshape(shape)
        )

    @classmethod
    def start(cls, base: Answers) -> Trajectory:
        return cls(
            base.ids, base.categories, [0], base.correct[:, None], _signal(base)[:, None], base.probe_fingerprint
        )

    def append(self, step: int, answers: Answers) -> None:
        """Add an evaluation's column (answers aligned with :attr:`ids`)."""
        self._add(step, answers.correct, _signal(answers))

    def plus(self, step: int, answers: Answers) -> Trajectory:
        """A new trajectory: this one and an evaluation's column (this one is left as it is)."""
        grown = Trajectory(self.ids, self.categories, self.steps, self.correct, self.signal, self.fingerprint)
        grown.append(step, answers)
        return grown

    def up_to(self, step: int) -> Trajectory:
        """The base and the evaluations at or before ``step`` (what a resume keeps)."""
        keep = self.steps <= step
        keep[0] = True
        return Trajectory(
            self.ids, self.categories, self.steps[keep], self.correct[:, keep], self.signal[:, keep], self.fingerprint
        )

    def __repr__(self) -> str:
        return f"Trajectory({len(self.ids)} probes, steps {self.steps.tolist()})"

    # -- per probe ---------------------------------------------------------------------------

    def forgetting_events(self) -> np.ndarray:
        """How many times each probe went from right at one evaluation to wrong at the next."""
        return (self.correct[:, :-1] & ~self.correct[:, 1:]).sum(axis=1)

    def first_forgotten(self) -> np.ndarray:
        """The step of each probe's first forgetting event; ``-1`` where it has none."""
        events = self.correct[:, :-1] & ~self.correct[:, 1:]
        if not events.shape[1]:
            return np.full(len(self.ids), -1, dtype=np.int64)
        return np.where(events.any(axis=1), self.steps[1:][np.argmax(events, axis=1)], -1)

    def regained(self) -> np.ndarray:
        """Whether each probe was right again at a later evaluation after a forgetting event."""
        events = self.correct[:, :-1] & ~self.correct[:, 1:]
        lost_before = np.cumsum(events, axis=1)[:, :-1] > 0  # for each column from the third on
        return (lost_before & self.correct[:, 2:]).any(axis=1)

    def persistent(self) -> np.ndarray:
        """Right at the base and wrong at the last two evaluations (none before two)."""
        if len(self.steps) < 3:
            return np.zeros(len(self.ids), dtype=bool)
        return self.correct[:, 0] & ~self.correct[:, -1] & ~self.correct[:, -2]

    # -- over the run ------------------------------------------------------------------------

    def survival(self, rows: ArrayLike | None = None) -> np.ndarray:
        """At each step, the share of base-correct probes (of ``rows``) with no forgetting event up to it."""
        rows = slice(None) if rows is None else np.asarray(rows, dtype=np.intp)
        correct = self.correct[rows]
        right = correct[:, 0]
        if not right.any():
            return np.full(len(self.steps), np.nan)
        events = np.concatenate([np.zeros((len(correct), 1), dtype=bool), correct[:, :-1] & ~correct[:, 1:]], axis=1)
        unbroken = np.cumsum(events, axis=1) == 0
        return unbroken[right].mean(axis=0)

    def metrics(self, rows: ArrayLike | None = None) -> dict[str, float]:
        """The latest evaluation's figures for ``rows``: ``forgetting_events`` (summed) and, from the second
        evaluation on, ``forgetting_persistent``."""
        rows = slice(None) if rows is None else np.asarray(rows, dtype=np.intp)
        out = {"forgetting_events": float(self.forgetting_events()[rows].sum())}
        n = len(self.correct[rows])
        if len(self.steps) >= 3 and n:
            out["forgetting_persistent"] = float(self.persistent()[rows].sum()) / n
        return out

    # -- a column as a history record stores it ----------------------------------------------

    def column(self, position: int = -1) -> dict[str, str]:
        """One evaluation's column as a history record stores it."""
        return encode_column(self.fingerprint, self.correct[:, position], self.signal[:, position])

    def _add(self, step: int, correct: np.ndarray, signal: np.ndarray) -> None:
        self.steps = np.append(self.steps, np.int64(step))
        self.correct = np.concatenate([self.correct, np.asarray(correct, dtype=bool)[:, None]], axis=1)
        # at float16's precision, as the history stores it: a resumed run shows the same numbers
        signal = np.asarray(signal, dtype=np.float16).astype(np.float32)
        self.signal = np.concatenate([self.signal, signal[:, None]], axis=1)

    @classmethod
    def from_history(cls, base: Answers, records: Sequence[Mapping[str, Any]]) -> Trajectory:
        """The trajectory of a run from its base answers and history records (a record without a column: from its
        ids, no signal); a column of another probe set raises a ``HistoryError`` naming the step and field."""
        trajectory = cls.start(base)
        n = len(base)
        for record in records:
            column = record.get("columns")
            if column is not None:
                try:
                    correct, signal = decode_column(column, n, base.probe_fingerprint)
                except HistoryError as err:
                    raise HistoryError(f"history record of step {record['step']}: {err.reason}", err.field) from None
            else:
                flipped = set(record["report"].get("forgotten_ids", [])) | set(record["report"].get("gained_ids", []))
                correct = np.array([c != (i in flipped) for i, c in zip(base.ids, base.correct)], dtype=bool)
                signal = np.full(n, np.nan, dtype=np.float32)
            trajectory._add(record["step"], correct, signal)
        return trajectory


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


def _signal(answers: Answers) -> np.ndarray:
    normalized = answers.scoring.get("normalize") == "chars"
    return margins(answers.gold_logprob, answers.choice_logprobs, normalized).astype(np.float32)
