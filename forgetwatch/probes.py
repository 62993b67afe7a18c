"""Probe sets: the held-out questions whose answers forgetwatch tracks.

A probe file is JSONL, one object per line::

    {"id": "q1", "question": "2 + 2 =", "choices": ["3", "4"], "answer": 1, "category": "math"}
    {"id": "q2", "question": "Question: 6 * 12?\\nAnswer:", "answer": "72", "extract": "number"}

A row with ``choices`` is multiple choice (``answer`` is a 0-based index); a row without is
generative (``answer`` is the reference string, ``extract`` says how to pull the answer out of
the generated text). Keys other than the probe fields are kept in :attr:`Probe.meta`.
Every row is validated before anything is returned, so a bad file fails before model work.
"""

from __future__ import annotations

import codecs
import copy
import difflib
import errno
import hashlib
import json
import numbers
import os
import random
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, overload

from .files import atomic_write

EXTRACT_MODES = ("number", "letter", "exact")
PRESETS = ("mmlu", "arc", "hellaswag", "gsm8k")
MAX_REPORTED_ERRORS = 20

_FIELDS = ("id", "question", "category", "choices", "answer", "extract")
_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

ErrorTuple = tuple[str, int | None, str | None, str]
ColumnSpec = str | Callable[[Mapping[str, Any]], Any]


class ProbeError(ValueError):
    """A probe file or record set is malformed.

    ``errors`` holds one ``(source, line, field, message)`` tuple per problem found.
    ``unit`` names what ``line`` counts: ``"line"`` for files, ``"record"`` for
    :meth:`ProbeSet.from_records`, ``"dataset row"`` for :meth:`ProbeSet.from_hf`.
    """

    def __init__(self, errors: Sequence[ErrorTuple], unit: str = "line"):
        self.errors = list(errors)
        self.unit = unit
        super().__init__(_format_errors(self.errors, unit))


def _format_errors(errors: Sequence[ErrorTuple], unit: str = "line") -> str:
    lines = []
    for source, line, fld, message in errors:
        where = source if line is None else f"{source}: {unit} {line}"
        if fld is not None:
            where += f": field '{fld}'"
        lines.append(f"{where}: {message}")
    return "\n".join(lines)


@dataclass(frozen=True)
class Probe:
    """One probe: a question with either choices (multiple choice) or a reference answer.

    Example:
        >>> Probe(id="q1", question="2 + 2 =", choices=("3", "4"), answer=1).is_multiple_choice
        True
    """

    id: str
    question: str
    answer: int | str
    choices: tuple[str, ...] | None = None
    category: str = "all"
    extract: str | None = None
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @property
    def is_multiple_choice(self) -> bool:
        return self.choices is not None

    @property
    def n_choices(self) -> int:
        """Number of options; 0 for a generative probe."""
        return 0 if self.choices is None else len(self.choices)

    def content(self) -> dict[str, Any]:
        """The fields that decide scoring, as a plain dict (what the fingerprint hashes)."""
        row: dict[str, Any] = {"id": self.id, "question": self.question, "category": self.category}
        if self.choices is not None:
            row["choices"] = list(self.choices)
        row["answer"] = self.answer
        if self.extract is not None:
            row["extract"] = self.extract
        return row


# -- validation of one row ------------------------------------------------------------------

Problem = tuple[str | None, str]  # (field, message) within one row


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _is_int(value: Any) -> bool:
    # bool is an int subclass, but True as an answer index is almost surely a mistake.
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_scalar(value: Any) -> bool:
    """A number or bool: something the user probably meant to write as a quoted string."""
    return isinstance(value, (bool, int, float))


def _is_blank(value: str) -> bool:
    return not value.strip()


def _did_you_mean(row: Mapping[str, Any], fld: str) -> str:
    """A hint naming an unknown key of ``row`` that looks like a misspelling of ``fld``."""
    unknown = [k for k in row if isinstance(k, str) and k not in _FIELDS]
    close = difflib.get_close_matches(fld, unknown, n=1, cutoff=0.75)
    return f" (found key '{close[0]}': did you mean '{fld}'?)" if close else ""


def _check_id(row: Mapping[str, Any]) -> str | None:
    if "id" not in row:
        return "missing; every probe needs a unique string id" + _did_you_mean(row, "id")
    value = row["id"]
    if not isinstance(value, str):
        hint = f'; quote it: "{value}"' if _is_scalar(value) else ""
        return f"must be a string, got {_type_name(value)} {value!r}{hint}"
    if _is_blank(value):
        return "is empty; give every probe a unique, non-empty id"
    return None


def _check_question(row: Mapping[str, Any]) -> str | None:
    if "question" not in row:
        return "missing; give the full prompt text" + _did_you_mean(row, "question")
    value = row["question"]
    if not isinstance(value, str):
        return f"must be a string (the full prompt text), got {_type_name(value)}"
    if _is_blank(value):
        return "is empty; give the full prompt text"
    return None


def _check_category(value: Any) -> str | None:
    if not isinstance(value, str):
        return f"must be a string, got {_type_name(value)} {value!r}; quote it or leave it out (default 'all')"
    if _is_blank(value):
        return "is empty; leave it out to use the default category 'all'"
    return None


def _check_choices(value: Any) -> list[Problem]:
    if not isinstance(value, (list, tuple)):
        return [("choices", f"must be a list of strings, got {_type_name(value)}; "
                            "for a generative probe leave 'choices' out")]
    if len(value) < 2:
        return [("choices", f"needs at least 2 choices, got {len(value)}")]
    problems: list[Problem] = []
    for i, choice in enumerate(value):
        if not isinstance(choice, str):
            problems.append(("choices", f"choice at index {i} must be a string, got {_type_name(choice)} {choice!r}"))
        elif _is_blank(choice):
            problems.append(("choices", f"choice at index {i} is empty; every choice needs text"))
    return problems


def _mc_answer_hint(answer: Any, choices: Sequence[Any] | None) -> str:
    """Suggest the index when a multiple-choice answer was written as a choice text or digit."""
    if isinstance(answer, str) and choices is not None:
        if answer in choices:
            return f"; choice {answer!r} is at index {list(choices).index(answer)}, write that"
        if answer.strip().isdigit():
            return f"; write {answer.strip()} not \"{answer}\""
    return ""


def _check_mc_answer(row: Mapping[str, Any], choices: Sequence[Any] | None) -> str | None:
    """``choices`` is None when their number is unknown (then the range cannot be checked)."""
    if "answer" not in row:
        return "missing; give the 0-based index of the correct choice" + _did_you_mean(row, "answer")
    answer = row["answer"]
    span = "" if choices is None else f" (0 to {len(choices) - 1})"
    if not _is_int(answer):
        return (f"must be an integer index into 'choices'{span}, got {_type_name(answer)} {answer!r}"
                + _mc_answer_hint(answer, choices))
    if choices is not None and not 0 <= answer < len(choices):
        return f"index {answer} is out of range; 'choices' has {len(choices)} entries, so use 0 to {len(choices) - 1}"
    return None


def _check_generative_answer(row: Mapping[str, Any]) -> str | None:
    if "answer" not in row:
        return ("missing; give the reference answer as a string (this row has no 'choices', "
                "so it is generative)" + _did_you_mean(row, "answer"))
    answer = row["answer"]
    if not isinstance(answer, str):
        if _is_scalar(answer):
            hint = f'; write "{json.dumps(answer)}" not {json.dumps(answer)}'
        else:
            hint = f", got {_type_name(answer)}"
        return ("must be a string for a generative probe (this row has no 'choices', so it is "
                f"generative){hint}" + _did_you_mean(row, "choices"))
    if _is_blank(answer):
        return "is empty; give the reference answer text"
    return None


def _check_extract(value: Any) -> str | None:
    modes = ", ".join(repr(m) for m in EXTRACT_MODES)
    if not isinstance(value, str):
        return f"must be a string ({modes} or a regex), got {_type_name(value)}"
    if value in EXTRACT_MODES:
        return None
    if _is_blank(value):
        return f"is empty; use {modes}, a regex with one capture group, or leave it out"
    if re.fullmatch(r"[A-Za-z_]+", value):
        # A bare word is a typo'd mode far more often than an intended regex.
        close = difflib.get_close_matches(value, EXTRACT_MODES, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"unknown extract mode {value!r}{hint}; use {modes}, or a regex with exactly one capture group"
    try:
        groups = re.compile(value).groups
    except re.error as exc:
        return f"regex {value!r} does not compile ({exc}); fix it or use one of {modes}"
    if groups != 1:
        fix = ("wrap the answer part in (...)" if groups == 0
               else "make the other groups non-capturing with (?:...)")
        return f"regex {value!r} has {groups} capture groups but needs exactly one (the answer); {fix}"
    return None


def _parse_row(row: Mapping[str, Any]) -> Probe | list[Problem]:
    """Validate one probe row; return the Probe, or every problem found in the row."""
    # None counts as absent for optional fields: Arrow-backed datasets pad missing keys with None.
    present = {k: v for k, v in row.items() if not (k in ("choices", "category", "extract") and v is None)}
    problems: list[Problem] = []
    for fld, check in (("id", _check_id), ("question", _check_question)):
        message = check(present)
        if message:
            problems.append((fld, message))
    if "category" in present and (message := _check_category(present["category"])):
        problems.append(("category", message))

    is_mc = "choices" in present
    if is_mc:
        choice_problems = _check_choices(present["choices"])
        problems += choice_problems
        # Bad entries do not change the count, so the answer's range can still be checked.
        choices = present["choices"]
        countable = choices if isinstance(choices, (list, tuple)) and len(choices) >= 2 else None
        if message := _check_mc_answer(present, countable):
            problems.append(("answer", message))
        if "extract" in present:
            problems.append(("extract", "extract applies only to generative probes; "
                                        "remove it from this multiple-choice row"))
    else:
        if message := _check_generative_answer(present):
            problems.append(("answer", message))
        if "extract" in present and (message := _check_extract(present["extract"])):
            problems.append(("extract", message))
    if problems:
        return problems

    return Probe(
        id=present["id"],
        question=present["question"],
        answer=int(present["answer"]) if is_mc else present["answer"],
        choices=tuple(present["choices"]) if is_mc else None,
        category=present.get("category", "all"),
        extract=present.get("extract"),
        meta={k: v for k, v in present.items() if k not in _FIELDS},
    )


class _Collector:
    """Validates rows one by one, remembering probes, first-seen ids and (capped) errors."""

    def __init__(self, source: str, unit: str):
        self.source = source
        self.unit = unit
        self.probes: list[Probe] = []
        self.errors: list[ErrorTuple] = []
        self.n_errors = 0
        self.first_seen: dict[str, int] = {}

    def error(self, where: int | None, fld: str | None, message: str) -> None:
        self.n_errors += 1
        if len(self.errors) < MAX_REPORTED_ERRORS:
            self.errors.append((self.source, where, fld, message))

    def row(self, where: int, row: Any) -> None:
        if not isinstance(row, Mapping):
            kind = "a JSON object ({...})" if self.unit == "line" else "a mapping (dict)"
            self.error(where, None, f"expected {kind}, got {_type_name(row)}")
            return
        parsed = _parse_row(row)
        # Track ids of invalid rows too, so a duplicate is reported now rather than after a fix.
        pid = row.get("id")
        duplicate = isinstance(pid, str) and pid in self.first_seen
        if duplicate:
            self.error(where, "id", f"duplicate id {pid!r} (first used on {self.unit} "
                                    f"{self.first_seen[pid]}); ids must be unique")
        elif isinstance(pid, str):
            self.first_seen[pid] = where
        if isinstance(parsed, list):
            for fld, message in parsed:
                self.error(where, fld, message)
        elif not duplicate:
            self.probes.append(parsed)

    def finish(self) -> ProbeSet:
        if self.n_errors:
            errors = list(self.errors)
            if self.n_errors > len(errors):
                more = self.n_errors - len(errors)
                errors.append((self.source, None, None, f"... and {more} more problem(s) not shown; "
                                                        "fix the ones above and load again"))
            raise ProbeError(errors, self.unit)
        if not self.probes:
            raise ProbeError([(self.source, None, None, "no probes found; add at least one probe row")], self.unit)
        return ProbeSet(self.probes, self.source)


# -- JSONL ----------------------------------------------------------------------------------

_BLANK = object()


def _decode_jsonl_line(raw: bytes, first: bool) -> tuple[Any, str | None]:
    """Return (object, None), (_BLANK, None) for a blank line, or (None, error message)."""
    if first and raw.startswith(codecs.BOM_UTF8):
        raw = raw[len(codecs.BOM_UTF8):]  # editors on Windows like to add one
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, (f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at byte offset {exc.start}); "
                      "re-save the file with UTF-8 encoding")
    if not text.strip():
        return _BLANK, None
    try:
        return json.loads(text), None
    except json.JSONDecodeError as exc:
        return None, (f"invalid JSON ({exc.msg} at column {exc.colno}); "
                      "each non-blank line must be one JSON object")


# -- Hugging Face datasets and presets --------------------------------------------------------


class _RowProblem(Exception):
    """Raised by a preset or column mapping when a row cannot be turned into a probe record."""

    def __init__(self, fld: str | None, message: str):
        super().__init__(message)
        self.field = fld
        self.message = message


def _need(row: Mapping[str, Any], column: str, what: str) -> Any:
    if column not in row:
        columns = ", ".join(map(str, row)) or "(none)"
        raise _RowProblem(column, f"missing column '{column}' needed by {what}; this row has columns: {columns}")
    return row[column]


def _need_str(row: Mapping[str, Any], column: str, what: str) -> str:
    value = _need(row, column, what)
    if not isinstance(value, str):
        raise _RowProblem(column, f"must be a string, got {_type_name(value)}")
    return value


def _need_str_list(row: Mapping[str, Any], column: str, what: str) -> list[str]:
    value = _need(row, column, what)
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise _RowProblem(column, f"must be a list of strings, got {_type_name(value)}")
    return list(value)


def _mmlu(row: Mapping[str, Any], index: int) -> dict[str, Any]:
    what = "preset 'mmlu'"
    subject = _need_str(row, "subject", what)
    question = _need_str(row, "question", what)
    options = _need_str_list(row, "choices", what)
    if len(options) > len(_LETTERS):
        raise _RowProblem("choices", f"has {len(options)} choices; at most {len(_LETTERS)} can be lettered")
    letters = list(_LETTERS[: len(options)])
    listed = "".join(f"\n{letter}. {option}" for letter, option in zip(letters, options))
    header = f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}."
    return {
        "id": f"mmlu/{subject}/{index}",
        "question": f"{header}\n\n{question.strip()}{listed}\nAnswer:",
        "choices": letters,  # lm-eval scores the letter, not the option text
        "answer": _need(row, "answer", what),
        "category": subject,
    }


def _arc(row: Mapping[str, Any], index: int) -> dict[str, Any]:
    what = "preset 'arc'"
    choices = _need(row, "choices", what)
    if not isinstance(choices, Mapping) or "text" not in choices or "label" not in choices:
        raise _RowProblem("choices", "must be a mapping with 'text' and 'label' lists (the ai2_arc layout)")
    labels = list(choices["label"])
    key = _need(row, "answerKey", what)
    if key not in labels:
        raise _RowProblem("answerKey", f"{key!r} is not one of the choice labels {labels}")
    return {
        "id": _need(row, "id", what),
        "question": f"Question: {_need_str(row, 'question', what)}\nAnswer:",
        "choices": list(choices["text"]),
        "answer": labels.index(key),
        "category": "arc",
    }


_BRACKETED = re.compile(r"\[.*?\]")


def _hellaswag_clean(text: str) -> str:
    """lm-evaluation-harness's hellaswag text preprocessing (WikiHow markup removal)."""
    text = text.strip().replace(" [title]", ". ")
    text = _BRACKETED.sub("", text)
    return text.replace("  ", " ")


def _hellaswag(row: Mapping[str, Any], index: int) -> dict[str, Any]:
    what = "preset 'hellaswag'"
    activity = _need_str(row, "activity_label", what)
    ctx_a = _need_str(row, "ctx_a", what)
    ctx_b = _need_str(row, "ctx_b", what)
    endings = _need_str_list(row, "endings", what)
    label = _need(row, "label", what)
    try:
        answer = int(label)
    except (TypeError, ValueError):
        raise _RowProblem("label", f"{label!r} is not an integer; the hellaswag test split has no "
                                   "labels, use the validation split") from None
    ind = row.get("ind")
    return {
        "id": f"hellaswag/{index if ind is None else ind}",
        "question": _hellaswag_clean(f"{activity}: {ctx_a} {ctx_b.capitalize()}"),
        "choices": [_hellaswag_clean(e) for e in endings],
        "answer": answer,
        "category": "hellaswag",
    }


def _gsm8k(row: Mapping[str, Any], index: int) -> dict[str, Any]:
    what = "preset 'gsm8k'"
    solution = _need_str(row, "answer", what)
    if "####" not in solution:
        raise _RowProblem("answer", "has no final '#### <number>' line (the gsm8k answer layout)")
    return {
        "id": f"gsm8k/{index}",
        "question": f"Question: {_need_str(row, 'question', what)}\nAnswer:",
        "answer": solution.rsplit("####", 1)[1].strip().replace(",", ""),
        "extract": "number",
        "category": "gsm8k",
    }


_PRESET_FUNCS: dict[str, Callable[[Mapping[str, Any], int], dict[str, Any]]] = {
    "mmlu": _mmlu, "arc": _arc, "hellaswag": _hellaswag, "gsm8k": _gsm8k,
}


def _map_columns(row: Mapping[str, Any], index: int, columns: Mapping[str, ColumnSpec]) -> dict[str, Any]:
    record: dict[str, Any] = {}
    for fld, spec in columns.items():
        if callable(spec):
            try:
                record[fld] = spec(row)
            except Exception as exc:  # a user's lambda failing on one row is a row problem
                raise _RowProblem(fld, f"column function raised {type(exc).__name__}: {exc}") from None
        else:
            record[fld] = _need(row, spec, f"columns['{fld}']")
    record.setdefault("id", f"{index}")
    return record


def _check_columns_arg(columns: Mapping[str, ColumnSpec]) -> None:
    unknown = sorted(set(columns) - set(_FIELDS))
    if unknown:
        raise ValueError(f"columns= has unknown probe field(s) {unknown}; use some of {list(_FIELDS)}")
    bad = [k for k, v in columns.items() if not (isinstance(v, str) or callable(v))]
    if bad:
        raise ValueError(f"columns= values must be a column name or a callable(row); not so for {bad}")


def _dataset_source(dataset: Any) -> str:
    """A readable name for a datasets.Dataset (name and split when known)."""
    info = getattr(dataset, "info", None)
    name = getattr(info, "dataset_name", None) or getattr(info, "builder_name", None)
    split = getattr(dataset, "split", None)
    if name:
        return f"{name}[{split}]" if split else str(name)
    return "<dataset>"


# -- stratified sampling ----------------------------------------------------------------------


def _allocate(sizes: Mapping[str, int], n: int) -> dict[str, int]:
    """Split ``n`` across groups in proportion to ``sizes`` (largest-remainder rounding).

    When ``n`` is at least the number of non-empty groups, each gets at least one.
    Integer arithmetic only, so the result never depends on float rounding.
    """
    total = sum(sizes.values())
    alloc = {g: n * s // total for g, s in sizes.items()}
    by_remainder = sorted(sizes, key=lambda g: (-(n * sizes[g] % total), -sizes[g], g))
    for g in by_remainder[: n - sum(alloc.values())]:
        alloc[g] += 1
    nonempty = [g for g, s in sizes.items() if s > 0]
    if n >= len(nonempty):
        for g in sorted(g for g in nonempty if alloc[g] == 0):
            # Take from the group most over its exact quota; it has >= 2 since n >= groups.
            donor = max((d for d in alloc if alloc[d] > 1),
                        key=lambda d: (alloc[d] * total - n * sizes[d], alloc[d], d))
            alloc[donor] -= 1
            alloc[g] = 1
    return alloc


# -- the probe set ----------------------------------------------------------------------------


class ProbeSet(Sequence[Probe]):
    """An ordered, validated set of probes with unique ids.

    Example:
        >>> probes = ProbeSet.from_jsonl("probes.jsonl")  # doctest: +SKIP
    """

    def __init__(self, probes: Iterable[Probe], source: str = "<records>"):
        self._probes = tuple(probes)
        self.source = source
        self._index = {p.id: i for i, p in enumerate(self._probes)}
        if len(self._index) != len(self._probes):
            raise ValueError(f"{source}: probe ids must be unique")

    # -- loading ------------------------------------------------------------------------------

    @classmethod
    def from_jsonl(cls, path: str | os.PathLike[str]) -> ProbeSet:
        """Load and validate a JSONL probe file; every bad row is reported in one ProbeError.

        Example:
            >>> probes = ProbeSet.from_jsonl("probes.jsonl")  # doctest: +SKIP
        """
        source = str(path)
        try:
            data = Path(path).read_bytes()
        except FileNotFoundError:
            raise FileNotFoundError(errno.ENOENT, "probe file not found; check the path", source) from None
        collector = _Collector(source, "line")
        # Split bytes on b"\n" only: str.splitlines would also split on U+2028 etc. inside JSON strings.
        for lineno, raw in enumerate(data.split(b"\n"), start=1):
            obj, message = _decode_jsonl_line(raw, first=lineno == 1)
            if message is not None:
                collector.error(lineno, None, message)
            elif obj is not _BLANK:
                collector.row(lineno, obj)
        return collector.finish()

    @classmethod
    def from_records(cls, records: Iterable[Mapping[str, Any]], source: str = "<records>") -> ProbeSet:
        """Build from dicts in the probe-file schema; errors name 1-based record numbers.

        Example:
            >>> ProbeSet.from_records([{"id": "q1", "question": "2+2=", "answer": "4"}]).ids
            ['q1']
        """
        collector = _Collector(source, "record")
        for number, record in enumerate(records, start=1):
            collector.row(number, record)
        return collector.finish()

    @classmethod
    def from_hf(
        cls,
        dataset: Iterable[Mapping[str, Any]],
        preset: str | None = None,
        *,
        columns: Mapping[str, ColumnSpec] | None = None,
        category: str | None = None,
        limit: int | None = None,
        source: str | None = None,
    ) -> ProbeSet:
        """Build from a ``datasets.Dataset`` (or any iterable of dict rows).

        ``preset`` ("mmlu", "arc", "hellaswag", "gsm8k") reproduces lm-evaluation-harness's
        zero-shot prompts; ``columns`` maps probe fields to column names or callables(row);
        with neither, rows must already follow the probe schema. ``category`` overrides every
        row's category, ``limit`` keeps the first N rows. Errors name 0-based dataset rows.

        Example:
            >>> probes = ProbeSet.from_hf(load_dataset("cais/mmlu", "all", split="test"), "mmlu")  # doctest: +SKIP
        """
        if isinstance(dataset, Mapping):  # e.g. a DatasetDict: iterating it yields split names
            raise TypeError(f"from_hf needs rows, got a mapping with keys {list(dataset)[:5]}; "
                            "pick a split, e.g. dataset['test']")
        if preset is not None and columns is not None:
            raise ValueError("give either preset= or columns=, not both")
        if preset is not None and preset not in _PRESET_FUNCS:
            raise ValueError(f"unknown preset {preset!r}; choose one of {list(PRESETS)} or pass columns=")
        if columns is not None:
            _check_columns_arg(columns)
        if category is not None and (message := _check_category(category)):
            raise ValueError(f"category= {message}")
        if limit is not None and (not _is_int(limit) or limit < 0):
            raise ValueError(f"limit= must be a non-negative integer, got {limit!r}")

        collector = _Collector(source or _dataset_source(dataset), "dataset row")
        rows = dataset if limit is None else islice(dataset, limit)
        for index, row in enumerate(rows):
            if not isinstance(row, Mapping):
                collector.row(index, row)  # reports the type problem
                continue
            try:
                if preset is not None:
                    record = _PRESET_FUNCS[preset](row, index)
                elif columns is not None:
                    record = _map_columns(row, index, columns)
                else:
                    # Arrow pads keys a row lacks with None; treat those as absent.
                    record = {k: v for k, v in row.items() if v is not None}
            except _RowProblem as problem:
                collector.error(index, problem.field, problem.message)
                continue
            if category is not None:
                record["category"] = category
            collector.row(index, record)
        return collector.finish()

    # -- sequence protocol ----------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._probes)

    @overload
    def __getitem__(self, i: int) -> Probe: ...
    @overload
    def __getitem__(self, i: slice) -> ProbeSet: ...
    def __getitem__(self, i):
        if isinstance(i, slice):
            return ProbeSet(self._probes[i], self.source)
        return self._probes[i]

    def __iter__(self) -> Iterator[Probe]:
        return iter(self._probes)

    def __repr__(self) -> str:
        return f"ProbeSet({len(self)} probes from {self.source!r})"

    @property
    def ids(self) -> list[str]:
        return [p.id for p in self._probes]

    @property
    def categories(self) -> list[str]:
        """The distinct categories, sorted.

        Example:
            >>> probes.categories  # doctest: +SKIP
            ['arc', 'gsm8k']
        """
        return sorted({p.category for p in self._probes})

    # -- selection ------------------------------------------------------------------------------

    def subset(self, selector: Iterable[str] | Callable[[Probe], bool]) -> ProbeSet:
        """The probes whose id is in ``selector`` (or for which it returns True), in original order.

        A single string counts as one id. Unknown ids raise KeyError.

        Example:
            >>> math = probes.subset(lambda p: p.category == "math")  # doctest: +SKIP
        """
        if callable(selector):
            return ProbeSet([p for p in self._probes if selector(p)], self.source)
        wanted = {selector} if isinstance(selector, str) else set(selector)
        unknown = sorted(wanted - self._index.keys())
        if unknown:
            shown = ", ".join(repr(u) for u in unknown[:5]) + (" ..." if len(unknown) > 5 else "")
            raise KeyError(f"{len(unknown)} id(s) not in {self.source}: {shown}")
        return ProbeSet([p for p in self._probes if p.id in wanted], self.source)

    def sample(self, n: int, seed: int = 0, stratify: bool = True) -> ProbeSet:
        """``n`` probes chosen at random (deterministic for ``seed``), in original order.

        With ``stratify``, categories get shares proportional to their size (largest-remainder
        rounding), and each gets at least one when ``n`` is at least the number of categories.

        Example:
            >>> quick = probes.sample(200, seed=1)  # doctest: +SKIP
        """
        if not _is_int(n) or n < 0:
            raise ValueError(f"n must be a non-negative integer, got {n!r}")
        if n > len(self):
            raise ValueError(f"cannot sample {n} probes from {len(self)}; use n <= {len(self)}")
        if n == len(self):
            return ProbeSet(self._probes, self.source)
        rng = random.Random(seed)
        if not stratify:
            chosen = rng.sample(range(len(self)), n)
        else:
            groups: dict[str, list[int]] = {}
            for i, p in enumerate(self._probes):
                groups.setdefault(p.category, []).append(i)
            alloc = _allocate({g: len(idx) for g, idx in groups.items()}, n)
            chosen = []
            for g in sorted(groups):  # fixed order, so the rng stream is reproducible
                chosen += rng.sample(groups[g], alloc[g])
        return ProbeSet([self._probes[i] for i in sorted(chosen)], self.source)

    # -- saving ---------------------------------------------------------------------------------

    def to_records(self) -> list[dict[str, Any]]:
        """One dict per probe in the probe-file schema, meta keys included (inverse of from_records).

        Example:
            >>> ProbeSet.from_records([{"id": "q1", "question": "2+2=", "answer": "4"}]).to_records()
            [{'id': 'q1', 'question': '2+2=', 'category': 'all', 'answer': '4'}]
        """
        records = []
        for p in self._probes:
            record = p.content()
            for key, value in p.meta.items():
                record.setdefault(key, copy.deepcopy(value))
            records.append(record)
        return records

    def to_jsonl(self, path: str | os.PathLike[str]) -> Path:
        """Write the probes as a UTF-8 JSONL probe file, atomically.

        Example:
            >>> probes.to_jsonl("probes.jsonl")  # doctest: +SKIP
        """
        lines = [json.dumps(r, ensure_ascii=False) + "\n" for r in self.to_records()]
        with atomic_write(path) as f:
            f.writelines(lines)
        return Path(path)

    def fingerprint(self, scoring: Mapping[str, Any] | None = None) -> str:
        """A stable hash of the probes' content, and of ``scoring`` options when given."""
        h = hashlib.sha256()
        for p in self._probes:
            h.update(json.dumps(p.content(), sort_keys=True, ensure_ascii=False).encode())
            h.update(b"\n")
        if scoring:
            h.update(json.dumps(dict(scoring), sort_keys=True, default=str).encode())
        return h.hexdigest()[:16]
