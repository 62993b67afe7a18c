"""Rows from a JSONL file (bounded reads, strict JSON) or from records, validated; one error lists every problem."""

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

#: Longer lines and larger files are refused: reading stops there instead of filling memory (``--probes /dev/zero``).
MAX_LINE_BYTES = 16 << 20
MAX_FILE_BYTES = 4 << 30

T = TypeVar("T")
FieldProblem = tuple[str | None, str]  # (field, message) within one row
Parser = Callable[[Mapping[str, Any]], T | list[FieldProblem]]


class Rows(Generic[T]):
    """Validates rows one by one with ``parse``; :meth:`finish` raises ``error`` listing every problem. ``unit``:
    "line", "record" or "dataset row"."""

    def __init__(self, source: str, unit: str, parse: Parser[T], error: type[InputError], none_found: str):
        self.source, self.unit = source, unit
        self._parse, self._error, self._none_found = parse, error, none_found
        self.values: list[T] = []
        self.problems = Problems(source, unit)
        self.problem = self.problems.add  # (where, field, message)
        self._first_seen: dict[str, int] = {}

    def add(self, where: int, row: Any, *, read_strictly: bool = False) -> None:
        """Validate one row; ``read_strictly``: already checked by ``strict_json.loads``."""
        if not isinstance(row, Mapping):
            kind = "a JSON object ({...})" if self.unit == "line" else "a mapping (dict)"
            self.problem(where, None, f"expected {kind}, got {type_name(row)}")
            return
        # first whether strict JSON can keep the row, so that no field's check meets a NaN or a 5,000-digit int
        unkeepable = None if read_strictly else strict_json.value_problem(row)
        parsed = [(unkeepable[0] or None, unkeepable[1])] if unkeepable else self._parse(row)
        pid = row.get("id")
        duplicate = isinstance(pid, str) and pid in self._first_seen
        if duplicate:
            first = f"{self.unit} {self._first_seen[pid]}"
            self.problem(where, "id", f"duplicate id {shorten(pid)} (first used on {first}); ids must be unique")
        elif isinstance(pid, str):
            self._first_seen[pid] = where  # an invalid row's too: a duplicate is reported now, not after a fix
        if isinstance(parsed, list):
            for field, message in parsed:
                self.problem(where, field, message)
        elif not duplicate:
            self.values.append(parsed)

    def finish(self) -> list[T]:
        self.problems.raise_if_any(self._error)
        if not self.values:
            raise self._error([(self.source, None, None, self._none_found)], self.unit)
        return self.values

    def read_records(self, records: Iterable[Any]) -> list[T]:
        for number, record in enumerate(records, start=1):
            self.add(number, record)
        return self.finish()

    def read_jsonl(self, path: str | os.PathLike[str], what: str) -> list[T]:
        """Every line of a JSONL file (``what`` names it: "probe file"), then :meth:`finish`."""
        if not Path(path).exists():
            raise FileNotFoundError(errno.ENOENT, f"{what} not found; check the path", str(path))
        for lineno, raw in enumerate(_bounded_lines(path, str(path), what, self._error), start=1):
            if lineno == 1:
                raw = raw.removeprefix(codecs.BOM_UTF8)  # editors on Windows like to add one
            try:
                text = raw.decode("utf-8")
                row = strict_json.loads(text) if text.strip() else None
            except UnicodeDecodeError as exc:
                at = f"byte 0x{raw[exc.start]:02x} at byte offset {exc.start}"
                self.problem(lineno, None, f"not valid UTF-8 ({at}); re-save the file with UTF-8 encoding")
            except json.JSONDecodeError as exc:
                why = f"invalid JSON ({exc.msg} at column {exc.colno}); each non-blank line must be one JSON object"
                self.problem(lineno, None, why)
            except strict_json.StrictJSONError as exc:  # where it is reads like a field of the row
                self.problem(lineno, exc.where or None, exc.why)
            else:
                if text.strip():
                    self.add(lineno, row, read_strictly=True)
        return self.finish()


def _bounded_lines(path: str | os.PathLike[str], source: str, what: str, error: type[InputError]) -> Iterator[bytes]:
    # split on b"\n" only: U+2028 may sit inside JSON strings
    number, total, pending = 0, 0, b""
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            total += len(chunk)
            if total > MAX_FILE_BYTES:
                why = f"is over {MAX_FILE_BYTES >> 30} GiB; a {what} is one JSON object per line: check the path"
                raise error([(source, None, None, why)])
            *whole, pending = (pending + chunk).split(b"\n")
            for line in whole:
                number += 1
                yield line
            if len(pending) > MAX_LINE_BYTES:
                why = f"is over {MAX_LINE_BYTES >> 20} MiB with no line break; a {what} is one JSON object per line"
                raise error([(source, number + 1, None, why)])
    yield pending
