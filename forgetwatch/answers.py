"""Answers: one model's per-sample results on a probe set, saved as JSON or npz (never pickle)."""

from __future__ import annotations

import json
import math
import numbers
import os
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .files import atomic_write

FORMAT = "forgetwatch.answers"
VERSION = 1


class AnswersMismatchError(ValueError):
    """Two answer sets (or answers and probes) do not describe the same probes and scoring."""


@dataclass
class Answers:
    """Per-sample results of one model on one probe set, aligned to the probe set's order.

    Attributes:
        ids: probe ids, in probe-set order.
        correct: bool per sample.
        predicted: chosen choice index (multiple choice) or extracted text (generative;
            ``None`` when extraction failed).
        choice_logprobs: per sample, the summed log-probability of each choice
            (empty for generative probes).
        gold_logprob: log-probability of the correct choice (NaN for generative probes).
        n_choices: number of choices per sample (0 for generative probes).
        categories: category per sample.
        outputs: raw generated text for generative probes (``None`` for multiple choice).
        probe_fingerprint: fingerprint of the probe set's content.
        scoring: the scoring options the answers were computed with.
        model: a name for the model (path or hub id), informational.
        meta: free-form extra information (version, time, step, ...).

    Example:
        >>> a = Answers.from_samples("fp", {}, [dict(id="q1", correct=True, predicted=0,
        ...     choice_logprobs=[-0.1, -2.0], n_choices=2)])
        >>> a.accuracy
        1.0
    """

    ids: list[str]
    correct: np.ndarray
    predicted: list[int | str | None]
    choice_logprobs: list[np.ndarray]
    gold_logprob: np.ndarray
    n_choices: np.ndarray
    categories: list[str]
    outputs: list[str | None]
    probe_fingerprint: str
    scoring: dict[str, Any] = field(default_factory=dict)
    model: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.correct = np.asarray(self.correct, dtype=bool)
        self.gold_logprob = np.asarray(self.gold_logprob, dtype=np.float64)
        self.n_choices = np.asarray(self.n_choices, dtype=np.int64)
        self.choice_logprobs = [np.asarray(x, dtype=np.float64) for x in self.choice_logprobs]
        n = len(self.ids)
        lengths = {
            "correct": len(self.correct), "predicted": len(self.predicted),
            "choice_logprobs": len(self.choice_logprobs), "gold_logprob": len(self.gold_logprob),
            "n_choices": len(self.n_choices), "categories": len(self.categories),
            "outputs": len(self.outputs),
        }
        bad = {k: v for k, v in lengths.items() if v != n}
        if bad:
            raise ValueError(f"Answers fields must all have {n} entries (one per id); got {bad}")

    @classmethod
    def from_samples(
        cls,
        probe_fingerprint: str,
        scoring: dict[str, Any],
        samples: Sequence[dict[str, Any]],
        model: str = "",
        meta: dict[str, Any] | None = None,
    ) -> Answers:
        """Build from one dict per sample (keys as the attribute names, singular)."""
        return cls(
            ids=[s["id"] for s in samples],
            correct=np.array([bool(s["correct"]) for s in samples], dtype=bool),
            predicted=[s.get("predicted") for s in samples],
            choice_logprobs=[np.array([_float(x) for x in s.get("choice_logprobs", ())], dtype=float)
                             for s in samples],
            gold_logprob=np.array([_float(s.get("gold_logprob")) for s in samples]),
            n_choices=np.array([int(s.get("n_choices", 0)) for s in samples], dtype=np.int64),
            categories=[s.get("category", "all") for s in samples],
            outputs=[s.get("output") for s in samples],
            probe_fingerprint=probe_fingerprint,
            scoring=dict(scoring),
            model=model,
            meta=dict(meta or {}),
        )

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def accuracy(self) -> float:
        """Share of correct samples (NaN when there are none)."""
        return float(self.correct.mean()) if len(self) else math.nan

    def samples(self) -> list[dict[str, Any]]:
        """One plain dict per sample (the inverse of :meth:`from_samples`)."""
        return [
            {
                "id": self.ids[i],
                "category": self.categories[i],
                "correct": bool(self.correct[i]),
                "predicted": self.predicted[i],
                "choice_logprobs": [_json_float(x) for x in self.choice_logprobs[i]],
                "gold_logprob": _json_float(self.gold_logprob[i]),
                "n_choices": int(self.n_choices[i]),
                "output": self.outputs[i],
            }
            for i in range(len(self))
        ]

    def check_compatible(self, other: Answers, what: str = "answers") -> None:
        """Raise :class:`AnswersMismatchError` unless ``other`` covers the same probes, scored the same way."""
        if self.probe_fingerprint != other.probe_fingerprint or self.ids != other.ids:
            raise AnswersMismatchError(
                f"these {what} were computed on a different probe set "
                f"(fingerprint {self.probe_fingerprint} vs {other.probe_fingerprint}); "
                "evaluate both models on the same probe file"
            )
        if not self.scored_like(other.scoring):
            raise AnswersMismatchError(
                f"these {what} were scored with different options ({self.scoring} vs {other.scoring}); "
                "evaluate both with the same options"
            )

    def mismatch(self, *, fingerprint: str, scoring: dict[str, Any], ids: Sequence[str] | None = None,
                 meta: dict[str, str] | None = None) -> str | None:
        """Why these answers cannot stand for the given probes and scoring, or ``None``."""
        if self.probe_fingerprint != fingerprint:
            return "another probe set"
        if ids is not None and list(ids) != self.ids:
            return "other probe ids"
        if not self.scored_like(scoring):
            return f"other scoring options ({self.scoring} vs {scoring})"
        for key, value in (meta or {}).items():
            if self.meta.get(key) != value:
                return "another model" if key == "model_key" else "other weights"
        return None

    def scored_like(self, scoring: dict[str, Any]) -> bool:
        """Whether these answers were scored with options that give the same answers."""
        return _comparable_scoring(self.scoring) == _comparable_scoring(scoring)

    def check_probes(self, probes: Any) -> None:
        """Raise :class:`AnswersMismatchError` unless these answers belong to ``probes`` (a ProbeSet)."""
        fp = probes.fingerprint()
        if fp != self.probe_fingerprint:
            raise AnswersMismatchError(
                f"answers were computed on a different probe set than {probes.source} "
                f"(fingerprint {self.probe_fingerprint} vs {fp}); re-evaluate on these probes"
            )

    # -- persistence -------------------------------------------------------------------------

    def _header(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "probe_fingerprint": self.probe_fingerprint,
            "scoring": self.scoring,
            "model": self.model,
            "meta": self.meta,
        }

    def to_dict(self) -> dict[str, Any]:
        """Everything, as JSON-able values: the content of a ``.json`` answers file."""
        return {**self._header(), "samples": self.samples()}

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Answers:
        """The inverse of :meth:`to_dict`.

        Example:
            >>> again = Answers.from_dict(answers.to_dict())  # doctest: +SKIP
        """
        _check_header(doc)
        return cls.from_samples(doc["probe_fingerprint"], doc.get("scoring", {}), doc["samples"],
                                model=doc.get("model", ""), meta=doc.get("meta", {}))

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write atomically as JSON (``.json``) or numpy archive (``.npz``, no pickle).

        Example:
            >>> answers.save("base_answers.json")  # doctest: +SKIP
        """
        path = Path(path)
        if path.suffix == ".npz":
            arrays = self._to_arrays()
            with atomic_write(path, "wb") as f:
                np.savez_compressed(f, **arrays)
        elif path.suffix == ".json":
            with atomic_write(path) as f:
                json.dump(self.to_dict(), f, ensure_ascii=False, allow_nan=False)
        else:
            raise ValueError(f"{path}: answers are saved as .json or .npz; choose one of those endings")
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str], probes: Any = None) -> Answers:
        """Read answers saved by :meth:`save`; if ``probes`` is given, check they belong to it.

        Example:
            >>> base = Answers.load("base_answers.json")  # doctest: +SKIP
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such answers file")
        try:
            if path.suffix == ".npz":
                with np.load(path, allow_pickle=False) as z:
                    answers = cls._from_arrays({k: z[k] for k in z.files})
            else:
                with open(path, encoding="utf-8") as f:
                    answers = cls.from_dict(json.load(f))
        # corrupt/truncated npz files fail inside zipfile/zlib with their own exception types
        except (KeyError, ValueError, TypeError, OSError, EOFError, zipfile.BadZipFile, zlib.error,
                NotImplementedError) as e:
            if isinstance(e, AnswersMismatchError):
                raise
            raise ValueError(f"{path}: not a readable forgetwatch answers file ({e})") from e
        if probes is not None:
            answers.check_probes(probes)
        return answers

    def _to_arrays(self) -> dict[str, np.ndarray]:
        pred_index = np.array(
            [int(p) if isinstance(p, numbers.Integral) else -1 for p in self.predicted], dtype=np.int64
        )
        pred_text = [p if isinstance(p, str) else "" for p in self.predicted]
        flat = (
            np.concatenate(self.choice_logprobs) if self.choice_logprobs else np.zeros(0)
        ).astype(np.float64)
        return {
            "header": np.array(json.dumps(self._header(), ensure_ascii=False)),
            "ids": np.array(self.ids, dtype=str),
            "categories": np.array(self.categories, dtype=str),
            "correct": self.correct,
            "n_choices": self.n_choices,
            "gold_logprob": self.gold_logprob,
            "choice_logprobs": flat,
            "choice_counts": np.array([len(x) for x in self.choice_logprobs], dtype=np.int64),
            "pred_index": pred_index,
            "pred_text": np.array(pred_text, dtype=str),
            "pred_none": np.array([p is None for p in self.predicted], dtype=bool),
            "outputs": np.array([o or "" for o in self.outputs], dtype=str),
            "outputs_none": np.array([o is None for o in self.outputs], dtype=bool),
        }

    @classmethod
    def _from_arrays(cls, z: dict[str, np.ndarray]) -> Answers:
        header = json.loads(str(z["header"]))
        _check_header(header)
        counts = z["choice_counts"].astype(int)
        splits = np.cumsum(counts)[:-1] if len(counts) else []
        predicted: list[int | str | None] = []
        for idx, text, none in zip(z["pred_index"], z["pred_text"], z["pred_none"]):
            predicted.append(None if none else int(idx) if idx >= 0 else str(text))
        return cls(
            ids=[str(x) for x in z["ids"]],
            correct=z["correct"],
            predicted=predicted,
            choice_logprobs=list(np.split(z["choice_logprobs"], splits)) if len(counts) else [],
            gold_logprob=z["gold_logprob"],
            n_choices=z["n_choices"],
            categories=[str(x) for x in z["categories"]],
            outputs=[None if none else str(o) for o, none in zip(z["outputs"], z["outputs_none"])],
            probe_fingerprint=header["probe_fingerprint"],
            scoring=header.get("scoring", {}),
            model=header.get("model", ""),
            meta=header.get("meta", {}),
        )


def _check_header(doc: dict[str, Any]) -> None:
    if not isinstance(doc, dict):
        raise ValueError(f"expected a JSON object, got {type(doc).__name__}")
    if doc.get("format") != FORMAT:
        raise ValueError(f"format is {doc.get('format')!r}, expected {FORMAT!r}")
    if doc.get("version") != VERSION:
        raise ValueError(f"version {doc.get('version')!r} is not supported (expected {VERSION})")


def _comparable_scoring(scoring: dict[str, Any]) -> dict[str, Any]:
    # batch size and device change speed, not answers
    return {k: v for k, v in scoring.items() if k not in ("batch_size", "device")}


def _float(x: Any) -> float:
    return math.nan if x is None else float(x)


def _json_float(x: float) -> float | str | None:
    """Strict JSON has no NaN or infinity: NaN -> null, infinities -> "inf" / "-inf".

    A log-probability can be -inf (a model that masks part of its vocabulary with -inf);
    ``float()`` and numpy read the strings back.
    """
    if math.isnan(x):
        return None
    return float(x) if math.isfinite(x) else ("inf" if x > 0 else "-inf")
