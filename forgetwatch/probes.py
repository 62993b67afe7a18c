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
import logging
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
from .text import shorten

EXTRACT_MODES = ("number", "letter", "exact")
#: A question longer than this (characters) is more than any model sees: it loads, with one
#: warning for all such probes, and is cut from the left before tokenizing.
LONG_QUESTION = 100_000
#: A probe file line longer than this (bytes) is refused, and so is a file over MAX_FILE_BYTES:
#: reading stops there instead of filling memory (``--probes /dev/zero``).
MAX_LINE_BYTES = 16 << 20
MAX_FILE_BYTES = 4 << 30
MAX_REPORTED_ERRORS = 20

logger = logging.getLogger(__name__)

PROBE_FIELDS = ("id", "question", "category", "choices", "answer", "extract")

ErrorTuple = tuple[str, int | None, str | None, str]


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

    @property
    def answer_text(self) -> str:
        """The correct answer as text: the right choice, or the reference."""
        return self.choices[self.answer] if self.choices is not None else str(self.answer)

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


def type_name(value: Any) -> str:
    """How a JSON value's type reads in an error message."""
    return "null" if value is None else type(value).__name__


def _is_int(value: Any) -> bool:
    # bool is an int subclass, but True as an answer index is almost surely a mistake.
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_scalar(value: Any) -> bool:
    """A number or bool: something the user probably meant to write as a quoted string."""
    return isinstance(value, (bool, int, float))


def _is_blank(value: str) -> bool:
    return not value.strip()


# control characters (Unicode Cc) and lone surrogates; the first also allows tab and line breaks,
# which prompts and answers may hold
_UNKEEPABLE_IN_TEXT = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")
_UNKEEPABLE_IN_NAME = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def _unkeepable(value: str, allow_layout: bool) -> str | None:
    """Why ``value`` cannot be kept as written (stored, compared, reloaded), or ``None``:
    a lone surrogate cannot be encoded as UTF-8; a control character (NUL is stripped from
    npz text, a line break splits a CSV row) is refused, bar tab and line breaks in prompts
    and answers."""
    found = (_UNKEEPABLE_IN_TEXT if allow_layout else _UNKEEPABLE_IN_NAME).search(value)
    if found is None:
        return None
    ch, i = found.group(), found.start()
    if "\ud800" <= ch <= "\udfff":
        return f"has a lone surrogate (U+{ord(ch):04X}) at character {i}, which is not valid Unicode text"
    where = "" if allow_layout else " (no tabs or line breaks either)"
    return f"has a control character (U+{ord(ch):04X}) at character {i}; remove it{where}"


def _did_you_mean(row: Mapping[str, Any], fld: str) -> str:
    """A hint naming an unknown key of ``row`` that looks like a misspelling of ``fld``."""
    unknown = [k for k in row if isinstance(k, str) and k not in PROBE_FIELDS]
    close = difflib.get_close_matches(fld, unknown, n=1, cutoff=0.75)
    return f" (found key '{close[0]}': did you mean '{fld}'?)" if close else ""


def _check_id(row: Mapping[str, Any]) -> str | None:
    if "id" not in row:
        return "missing; every probe needs a unique string id" + _did_you_mean(row, "id")
    value = row["id"]
    if not isinstance(value, str):
        hint = f'; quote it: "{value}"' if _is_scalar(value) else ""
        return f"must be a string, got {type_name(value)} {value!r}{hint}"
    if _is_blank(value):
        return "is empty; give every probe a unique, non-empty id"
    return _unkeepable(value, allow_layout=False)


def _check_question(row: Mapping[str, Any]) -> str | None:
    if "question" not in row:
        return "missing; give the full prompt text" + _did_you_mean(row, "question")
    value = row["question"]
    if not isinstance(value, str):
        return f"must be a string (the full prompt text), got {type_name(value)}"
    if _is_blank(value):
        return "is empty; give the full prompt text"
    return _unkeepable(value, allow_layout=True)


def _check_category(value: Any) -> str | None:
    if not isinstance(value, str):
        return f"must be a string, got {type_name(value)} {value!r}; quote it or leave it out (default 'all')"
    if _is_blank(value):
        return "is empty; leave it out to use the default category 'all'"
    return _unkeepable(value, allow_layout=False)


def _check_choices(value: Any) -> list[Problem]:
    if not isinstance(value, (list, tuple)):
        return [("choices", f"must be a list of strings, got {type_name(value)}; "
                            "for a generative probe leave 'choices' out")]
    if len(value) < 2:
        return [("choices", f"needs at least 2 choices, got {len(value)}")]
    problems: list[Problem] = []
    for i, choice in enumerate(value):
        if not isinstance(choice, str):
            problems.append(("choices", f"choice at index {i} must be a string, got {type_name(choice)} {choice!r}"))
        elif _is_blank(choice):
            problems.append(("choices", f"choice at index {i} is empty; every choice needs text"))
        elif message := _unkeepable(choice, allow_layout=True):
            problems.append(("choices", f"choice at index {i} {message}"))
    texts = [c for c in value if isinstance(c, str)]
    for i, choice in enumerate(texts):
        if choice in texts[:i]:
            # ties go to the lowest index, so the later copy could never be chosen
            problems.append(("choices", f"choice at index {i} repeats choice {texts.index(choice)} "
                                        f"({shorten(choice)}); make every choice different"))
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
        return (f"must be an integer index into 'choices'{span}, got {type_name(answer)} {answer!r}"
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
            hint = f", got {type_name(answer)}"
        return ("must be a string for a generative probe (this row has no 'choices', so it is "
                f"generative){hint}" + _did_you_mean(row, "choices"))
    if _is_blank(answer):
        return "is empty; give the reference answer text"
    if message := _unkeepable(answer, allow_layout=True):
        return message
    return _never_extracted(answer, row.get("extract"))


def _never_extracted(answer: str, mode: Any) -> str | None:
    """Why no output could ever match ``answer`` under this extract mode, or ``None``."""
    if mode == "number":
        from .scoring.extract import normalize_number  # here: scoring imports this module

        if normalize_number(answer) is None:
            return (f"{shorten(answer)} is not a number, but extract is 'number' (the last number of the "
                    "output is compared with it); write the number, or use another extract mode")
    elif mode == "letter" and not re.fullmatch(r"\(?[A-Za-z]\)?", answer.strip()):
        return (f"{shorten(answer)} is not a single letter, but extract is 'letter' (a choice letter such as "
                "'B' is compared with it); write the letter, or use another extract mode")
    return None


def _check_extract(value: Any) -> str | None:
    modes = ", ".join(repr(m) for m in EXTRACT_MODES)
    if not isinstance(value, str):
        return f"must be a string ({modes} or a regex), got {type_name(value)}"
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
        meta={k: v for k, v in present.items() if k not in PROBE_FIELDS},
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
            self.error(where, None, f"expected {kind}, got {type_name(row)}")
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
        long = [len(p.question) for p in self.probes if len(p.question) > LONG_QUESTION]
        if long:
            logger.warning("%s: %d question(s) are longer than %d characters (the longest %d): more than a "
                           "model sees; each is cut from the left to what the model can see before it is "
                           "tokenized", self.source, len(long), LONG_QUESTION, max(long))
        return ProbeSet(self.probes, self.source)


# -- JSONL ----------------------------------------------------------------------------------


def _bounded_lines(path: str | os.PathLike[str], source: str) -> Iterator[bytes]:
    """The file's lines as bytes, read in chunks: a line over :data:`MAX_LINE_BYTES` or a file
    over :data:`MAX_FILE_BYTES` is an error as soon as it is seen, not after memory is full.
    Split on b"\\n" only: str.splitlines would also split on U+2028 etc. inside JSON strings."""
    number, total, pending = 0, 0, b""
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            total += len(chunk)
            if total > MAX_FILE_BYTES:
                raise ProbeError([(source, None, None, f"is over {MAX_FILE_BYTES >> 30} GiB; a probe file is "
                                                       "one JSON object per line: is this the right file?")])
            *whole, pending = (pending + chunk).split(b"\n")
            for line in whole:
                number += 1
                yield line
            if len(pending) > MAX_LINE_BYTES:
                raise ProbeError([(source, number + 1, None, f"is over {MAX_LINE_BYTES >> 20} MiB with no line "
                                                             "break; a probe file is one JSON object per line")])
    yield pending

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
        self._content_hash: Any = None
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
        if not Path(path).exists():
            raise FileNotFoundError(errno.ENOENT, "probe file not found; check the path", source)
        collector = _Collector(source, "line")
        for lineno, raw in enumerate(_bounded_lines(path, source), start=1):
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
        columns: Mapping[str, Any] | None = None,
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
        from .presets import check_from_hf_args, dataset_source, row_to_record, RowProblem

        check_from_hf_args(dataset, preset, columns)
        if category is not None and (message := _check_category(category)):
            raise ValueError(f"category= {message}")
        if limit is not None and (not _is_int(limit) or limit < 0):
            raise ValueError(f"limit= must be a non-negative integer, got {limit!r}")

        collector = _Collector(source or dataset_source(dataset), "dataset row")
        rows = dataset if limit is None else islice(dataset, limit)
        for index, row in enumerate(rows):
            if not isinstance(row, Mapping):
                collector.row(index, row)  # reports the type problem
                continue
            try:
                record = row_to_record(row, index, preset, columns)
            except RowProblem as problem:
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
        """A stable hash of the probes' content, and of ``scoring`` options when given.

        Example:
            >>> probes.fingerprint()  # doctest: +SKIP
            '3f9c0a51d2e84b17'
        """
        if self._content_hash is None:  # probes are immutable: hash their content once
            h = hashlib.sha256()
            for p in self._probes:
                h.update(json.dumps(p.content(), sort_keys=True, ensure_ascii=False).encode())
                h.update(b"\n")
            self._content_hash = h
        h = self._content_hash.copy()
        if scoring:
            h.update(json.dumps(dict(scoring), sort_keys=True, default=str).encode())
        return h.hexdigest()[:16]
