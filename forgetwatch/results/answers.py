"""Answers: one model's per-sample results on a probe set, saved as JSON or npz (never pickle)."""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from forgetwatch.common.files import NPZ_ERRORS, atomic_write, json_safe, read_npz, strict_dumps
from forgetwatch.common.text import first_line, shorten

FORMAT = "forgetwatch.answers"
#: 3: an npz holds the JSON document as one UTF-8 array (``answers``), compressed.
VERSION = 3
ANOTHER_PROBE_SET = "another probe set"
_REDO = "evaluate the model again to re-create it"


class AnswersMismatchError(ValueError):
    """Two answer sets (or answers and probes) do not describe the same probes and scoring."""


class AnswersFileError(ValueError):
    """An answers file that is damaged, edited since written, or not forgetwatch's; ``reason``: what is wrong."""

    def __init__(self, reason: str, path: str | os.PathLike[str] | None = None, advice: str = _REDO):
        self.reason, self.path = reason, path
        super().__init__(f"{path}: {reason}; {advice}" if path is not None else f"{reason}; {advice}")


@dataclass
class Answers:
    """Per-sample results of one model on one probe set, aligned to the probe set's order.

    Attributes:
        ids: probe ids, in probe-set order.
        correct: bool per sample.
        predicted: chosen choice index, extracted text (``None``: extraction failed), or a behaviour probe's response.
        choice_logprobs: per sample, the summed log-probability of each choice (empty for generative probes).
        gold_logprob: the correct choice's or reference answer's log-probability (NaN where not scored).
        n_choices: number of choices per sample (0 for generative probes).
        outputs: raw generated text (``None`` for multiple choice; sampled: the first sample's).
        meta: free-form extra information (step, keys of the model scored, noise floor, ...).
        groups: each probe's rephrasing group (``None`` for a probe without one), when any probe has one.
        samples_correct: sampled scoring only: each sample's verdict, probes x samples (sample j drawn with the same
            seed in every evaluation); ``correct`` is then the majority's. ``None`` for greedy answers.

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
    samples_correct: np.ndarray | None = None
    groups: list[str | None] | None = None

    def __post_init__(self) -> None:
        self.correct = np.asarray(self.correct, dtype=bool)
        self.gold_logprob = np.asarray(self.gold_logprob, dtype=np.float64)
        self.n_choices = np.asarray(self.n_choices, dtype=np.int64)
        self.choice_logprobs = [np.asarray(x, dtype=np.float64) for x in self.choice_logprobs]
        n = len(self.ids)
        columns = ["correct", "predicted", "choice_logprobs", "gold_logprob", "n_choices", "categories", "outputs"]
        bad = {k: len(getattr(self, k)) for k in columns + ["groups"] * (self.groups is not None)}
        if set(bad.values()) - {n}:
            raise ValueError(f"Answers fields must all have {n} entries (one per id); got {bad}")
        if self.samples_correct is not None:
            self.samples_correct = np.asarray(self.samples_correct, dtype=bool)
            shape = self.samples_correct.shape
            if len(shape) != 2 or shape[0] != n or shape[1] < 1:
                raise ValueError(
                    f"Answers.samples_correct must be {n} rows (one per id) of 1 or more samples; got {shape}"
                )

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
            choice_logprobs=[np.array([_float(x) for x in s.get("choice_logprobs", ())], dtype=float) for s in samples],
            gold_logprob=np.array([_float(s.get("gold_logprob")) for s in samples]),
            n_choices=np.array([int(s.get("n_choices", 0)) for s in samples], dtype=np.int64),
            categories=[s.get("category", "all") for s in samples],
            outputs=[s.get("output") for s in samples],
            probe_fingerprint=probe_fingerprint,
            scoring=dict(scoring),
            model=model,
            meta=dict(meta or {}),
            samples_correct=_per_sample(samples),
            groups=[s.get("group") for s in samples] if any("group" in s for s in samples) else None,
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
                "predicted": _plain(self.predicted[i]),
                # -inf (a model that masks part of its vocabulary) kept as "-inf", not null (null is "none")
                "choice_logprobs": json_safe(self.choice_logprobs[i].tolist(), infinity_as_text=True),
                "gold_logprob": json_safe(float(self.gold_logprob[i]), infinity_as_text=True),
                "n_choices": int(self.n_choices[i]),
                "output": self.outputs[i],
                **({} if self.samples_correct is None else {"samples_correct": self.samples_correct[i].tolist()}),
                **({} if self.groups is None else {"group": self.groups[i]}),
            }
            for i in range(len(self))
        ]

    def mismatch(
        self,
        *,
        fingerprint: str,
        scoring: Mapping[str, Any] | None = None,
        ids: Sequence[str] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> str | None:
        """Why these answers cannot be the base for probe set ``fingerprint`` (and ``ids``, ``scoring`` but for batch
        size and device, ``meta`` entries, when given), or ``None``.

        Example:
            >>> a = Answers.from_samples("fp", {}, [dict(id="q1", correct=True)])
            >>> a.mismatch(fingerprint="fp", ids=["q1", "q2"])
            "other probe ids (1 missing, e.g. 'q2')"
        """
        if self.probe_fingerprint != fingerprint:
            return ANOTHER_PROBE_SET
        if ids is not None:
            problem = _ids_differ(self.ids, ids)
            if problem:
                return f"other probe ids ({problem})"
        # batch size and device change speed, not answers
        mine, theirs = (
            {k: v for k, v in s.items() if k not in ("batch_size", "device")} for s in (self.scoring, scoring or {})
        )
        if scoring is not None and mine != theirs:
            if mine.pop("precision", None) != theirs.pop("precision", None) and mine == theirs:
                return (
                    f"another precision ({self.scoring.get('precision', 'not recorded')} vs "
                    f"{scoring.get('precision', 'not recorded')}: rounding alone flips answers)"
                )
            return f"other scoring options ({'; '.join(_differences(mine, theirs))})"
        for key, value in (meta or {}).items():
            if self.meta.get(key) != value:
                return "another model" if key == "model_key" else "other weights"
        return None

    def check_compatible(self, other: Answers) -> None:
        """Raise :class:`AnswersMismatchError` unless ``other`` covers the same probes, scored the same way."""
        if problem := other.mismatch(fingerprint=self.probe_fingerprint, scoring=self.scoring, ids=self.ids):
            raise AnswersMismatchError(
                f"these answers were computed for {problem}; evaluate both models on the same probe file with the "
                "same options"
            )

    def check_probes(self, probes: Any) -> None:
        """Raise :class:`AnswersMismatchError` unless these answers belong to ``probes`` (a ProbeSet)."""
        if problem := self.mismatch(fingerprint=probes.fingerprint(), ids=probes.ids):
            detail = "" if problem == ANOTHER_PROBE_SET else f" ({problem})"
            raise AnswersMismatchError(
                f"these answers were computed on a different probe set than {probes.source}{detail}; evaluate the model "
                "again on these probes"
            )

    # -- files -------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Everything, as JSON-able values: the content of a ``.json`` answers file."""
        content = {
            "probe_fingerprint": self.probe_fingerprint,
            "scoring": json_safe(self.scoring),
            "model": self.model,
            "meta": json_safe(self.meta),
            "samples": self.samples(),
        }
        return {"format": FORMAT, "version": VERSION, "checksum": _checksum(content), **content}

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Answers:
        """The inverse of :meth:`to_dict`; :class:`AnswersFileError` when the content does not match its checksum."""
        if not isinstance(doc, dict):
            raise AnswersFileError(f"not a forgetwatch answers file (a JSON {type(doc).__name__}, not an object)")
        for key, want in (("format", FORMAT), ("version", VERSION)):
            if doc.get(key) != want:
                raise AnswersFileError(
                    f"not an answers file this forgetwatch reads ({key} is {shorten(doc.get(key))}, expected {want!r})"
                )
        content = {key: doc.get(key) for key in ("probe_fingerprint", "scoring", "model", "meta", "samples")}
        if doc.get("checksum") != _checksum(content):
            raise AnswersFileError(
                "edited or damaged since it was written (its content does not match the checksum in its header)"
            )
        return cls.from_samples(
            doc["probe_fingerprint"], doc["scoring"], doc["samples"], model=doc["model"], meta=doc["meta"]
        )

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write atomically as JSON (``.json``) or compressed JSON in a numpy archive (``.npz``, no pickle).

        Example:
            >>> answers.save("base_answers.json")  # doctest: +SKIP
        """
        path = Path(path)
        if path.suffix not in (".json", ".npz"):
            raise ValueError(f"{path}: answers are saved as .json or .npz; choose one of those endings")
        text = strict_dumps(self.to_dict())
        with atomic_write(path, "wb") as f:
            if path.suffix == ".npz":
                np.savez_compressed(f, answers=np.frombuffer(text.encode("utf-8"), dtype=np.uint8))
            else:
                f.write(text.encode("utf-8"))
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str], probes: Any = None) -> Answers:
        """Read answers saved by :meth:`save`, checked to belong to ``probes`` when given; an
        :class:`AnswersFileError` (a ``ValueError``) for a damaged, edited or foreign file.

        Example:
            >>> base = Answers.load("base_answers.json")  # doctest: +SKIP
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such answers file")
        try:
            data = read_npz(path)["answers"].tobytes() if path.suffix == ".npz" else path.read_bytes()
            answers = cls.from_dict(json.loads(data))
        except AnswersFileError as e:
            raise AnswersFileError(e.reason, path) from None
        except NPZ_ERRORS as e:  # not chained: numpy's text may advise loading pickles
            raise AnswersFileError(_unreadable(e), path) from None
        if probes is not None:
            answers.check_probes(probes)
        return answers


def chosen_text(predicted: Any, choices: Sequence[str] | None) -> str | None:
    """The text of the choice a multiple-choice prediction names; ``None`` when it names none."""
    if choices is None or isinstance(predicted, bool) or not isinstance(predicted, numbers.Integral):
        return None
    return choices[int(predicted)] if 0 <= predicted < len(choices) else None


def _unreadable(err: BaseException) -> str:
    if "pickle" in str(err).lower():  # never numpy's advice to load pickled data
        return "damaged or not written by forgetwatch: it holds pickled (object) data, and forgetwatch never loads it"
    if isinstance(err, KeyError):
        return f"damaged or not a forgetwatch answers file (no {err} in it)"
    return f"damaged or not a forgetwatch answers file ({first_line(err)})"


def _checksum(content: dict[str, Any]) -> str:
    return hashlib.sha256(strict_dumps(content, sort_keys=True).encode("utf-8")).hexdigest()[:16]


def _ids_differ(have: Sequence[str], want: Sequence[str]) -> str | None:
    if list(have) == list(want):
        return None
    have_set, want_set = set(have), set(want)
    missing, extra = [i for i in want if i not in have_set], [i for i in have if i not in want_set]
    parts = [
        f"{len(ids)} {what}, e.g. {shorten(ids[0])}" for ids, what in ((missing, "missing"), (extra, "extra")) if ids
    ]
    if len(have) != len(want) and not parts:
        parts.append(f"{len(have)} ids for {len(want)} probes, some repeated")
    return "; ".join(parts) or "the same ids in another order"


def _differences(these: Mapping[str, Any], asked: Mapping[str, Any], within: str = "") -> list[str]:
    """Each option that differs, as ``dotted.name: these answers' value, not the asked one`` (or "unset")."""
    out = []
    for key in sorted(set(these) | set(asked)):
        mine, theirs = these.get(key), asked.get(key)
        if isinstance(mine, Mapping) and isinstance(theirs, Mapping):
            out += _differences(mine, theirs, f"{within}{key}.")
        elif mine != theirs:
            shown = ["unset" if key not in side else repr(side[key]) for side in (these, asked)]
            out.append(f"{within}{key}: {shown[0]}, not {shown[1]}")
    return out


def _per_sample(samples: Sequence[dict[str, Any]]) -> np.ndarray | None:
    if not samples or "samples_correct" not in samples[0]:
        return None
    rows = [s.get("samples_correct") for s in samples]
    widths = {len(r) if isinstance(r, list) and all(isinstance(v, bool) for v in r) else None for r in rows}
    if None in widths or len(widths) != 1:
        raise AnswersFileError("damaged: its samples' samples_correct are not lists of true/false of one length")
    return np.array(rows, dtype=bool)


def _float(x: Any) -> float:
    return math.nan if x is None else float(x)


def _plain(x: Any) -> Any:
    return x.item() if isinstance(x, np.generic) else x
