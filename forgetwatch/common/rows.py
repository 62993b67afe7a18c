"""Rows from a JSONL file (read in bounded chunks, each line strict JSON) or from records, validated one by one,
with one error listing every problem (file, line or record, field)."""

from __future__ import annotations

import codecs
import errno
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar

from forgetwatch.common import strict_json
from forgetwatch.common.problems import InputError, Problems
from forgetwatch.common.text import shorten, type_name

#: A line longer than this (bytes) is refused, and so is a file over MAX_FILE_BYTES: reading
#: stops there instead of filling memory (``--probes /dev/zero``).
MAX_LINE_BYTES = 16 << 20
MAX_FILE_BYTES = 4 << 30

T = TypeVar("T")
FieldProblem = tuple[str | None, str]  # (field, message) within one row
#: One row's parser: its value, or every problem found in it.
Parser = Callable[[Mapping[str, Any]], T | list[FieldProblem]]


class Rows(Generic[T]):
    """Validates rows one by one with ``parse``; :meth:`finish` raises ``error`` listing every problem. ``unit``:
    "line", "record" or "dataset row".

    Example:
        >>> def parse(row):
        ...     return row["id"] if isinstance(row.get("text"), str) else [("text", "must be text")]
        >>> rows = Rows("<records>", "record", parse, InputError, "no rows found")
        >>> rows.read_records([{"id": "a", "text": "x"}, {"id": "a", "text": 1}])
        Traceback (most recent call last):
            ...
        forgetwatch.common.problems.InputError: <records>: record 2: key 'id': duplicate id 'a' (first used on record 1); ids must be unique
        <records>: record 2: key 'text': must be text
    """

    def __init__(self, source: str, unit: str, parse: Parser[T], error: type[InputError], none_found: str):
        self.source, self.unit = source, unit
        self._parse, self._error, self._none_found = parse, error, none_found
        self.values: list[T] = []
        self.problems = Problems(source, unit)
        self._first_seen: dict[str, int] = {}

    def problem(self, where: int | None, field: str | None, message: str) -> None:
        """Note a problem outside the row's own fields (a line that is not JSON, a missing column)."""
        self.problems.add(where, field, message)

    def add(self, where: int, row: Any, *, read_strictly: bool = False) -> None:
        """Validate one row; ``read_strictly``: already checked by :func:`~forgetwatch.common.strict_json.loads`."""
        if not isinstance(row, Mapping):
            kind = "a JSON object ({...})" if self.unit == "line" else "a mapping (dict)"
            self.problem(where, None, f"expected {kind}, got {type_name(row)}")
            return
        # first, whether the row can be kept as strict JSON at all (rows built in code may hold
        # anything): its fields are read only then, so no check meets a NaN or a 5,000-digit int
        unkeepable = None if read_strictly else strict_json.value_problem(row)
        parsed = [(unkeepable[0] or None, unkeepable[1])] if unkeepable else self._parse(row)
        # Track ids of invalid rows too, so a duplicate is reported now rather than after a fix.
        pid = row.get("id")
        duplicate = isinstance(pid, str) and pid in self._first_seen
        if duplicate:
            self.problem(
                where,
                "id",
                f"duplicate id {shorten(pid)} (first used on {self.unit} {self._first_seen[pid]}); ids must be unique",
            )
        elif isinstance(pid, str):
            self._first_seen[pid] = where
        if isinstance(parsed, list):
            for field, message in parsed:
                self.problem(where, field, message)
        elif not duplicate:
            self.values.append(parsed)

    def finish(self) -> list[T]:
        """The valid rows' values, or ``error`` listing every problem (or saying there were no rows)."""
        self.problems.raise_if_any(self._error)
        if not self.values:
            raise self._error([(self.source, None, None, self._none_found)], self.unit)
        return self.values

    def read_records(self, records: Iterable[Any]) -> list[T]:
        """Every record (numbered from 1), then :meth:`finish`."""
        for number, record in enumerate(records, start=1):
            self.add(number, record)
        return self.finish()

    def read_jsonl(self, path: str | os.PathLike[str], what: str) -> list[T]:
        """Every line of a JSONL file (``what`` names it: "probe file"), then :meth:`finish`."""
        for lineno, obj, problem in json_lines(path, what, self._error):
            if problem is not None:
                self.problem(lineno, *problem)
            else:
                self.add(lineno, obj, read_strictly=True)
        return self.finish()


def json_lines(
    path: str | os.PathLike[str], what: str, error: type[InputError]
) -> Iterator[tuple[int, Any, FieldProblem | None]]:
    """``(line, object, None)`` for each non-blank line of a JSONL file, or ``(line, None, (field, problem))``;
    a file or line too big raises ``error``."""
    source = str(path)
    if not Path(path).exists():
        raise FileNotFoundError(errno.ENOENT, f"{what} not found; check the path", source)
    for lineno, raw in enumerate(_bounded_lines(path, source, what, error), start=1):
        obj, problem = _decode_line(raw, lineno == 1)
        if obj is not _BLANK:
            yield lineno, obj, problem


def _bounded_lines(path: str | os.PathLike[str], source: str, what: str, error: type[InputError]) -> Iterator[bytes]:
    """The file's lines as bytes, read in chunks, refused past :data:`MAX_LINE_BYTES` or :data:`MAX_FILE_BYTES`
    (split on b"\\n" only: U+2028 may sit inside JSON strings)."""
    number, total, pending = 0, 0, b""
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            total += len(chunk)
            if total > MAX_FILE_BYTES:
                why = (
                    f"is over {MAX_FILE_BYTES >> 30} GiB; a {what} is one JSON object per line: is this the right file?"
                )
                raise error([(source, None, None, why)])
            *whole, pending = (pending + chunk).split(b"\n")
            for line in whole:
                number += 1
                yield line
            if len(pending) > MAX_LINE_BYTES:
                why = f"is over {MAX_LINE_BYTES >> 20} MiB with no line break; a {what} is one JSON object per line"
                raise error([(source, number + 1, None, why)])
    yield pending


_BLANK = object()


def _decode_line(raw: bytes, first: bool) -> tuple[Any, FieldProblem | None]:
    """(object, None), (_BLANK, None) for a blank line, or (None, (field, problem))."""
    if first and raw.startswith(codecs.BOM_UTF8):
        raw = raw[len(codecs.BOM_UTF8) :]  # editors on Windows like to add one
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        why = f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at byte offset {exc.start}); re-save the file with UTF-8 encoding"
        return None, (None, why)
    if not text.strip():
        return _BLANK, None
    try:
        return strict_json.loads(text), None
    except json.JSONDecodeError as exc:
        why = f"invalid JSON ({exc.msg} at column {exc.colno}); each non-blank line must be one JSON object"
        return None, (None, why)
    except strict_json.StrictJSONError as exc:  # where it is reads like a field of the row
        return None, (exc.where or None, exc.why)
