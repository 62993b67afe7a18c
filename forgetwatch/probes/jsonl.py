"""Reading a probe JSONL file: one JSON object per line, read in bounded chunks, every bad
line reported with its number."""

from __future__ import annotations

import codecs
import errno
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .. import strict_json
from ..problems import InputError
from ..text import shorten
from .rows import RowCollector
from .schema import Probe, ProbeError

#: A probe file line longer than this (bytes) is refused, and so is a file over MAX_FILE_BYTES:
#: reading stops there instead of filling memory (``--probes /dev/zero``).
MAX_LINE_BYTES = 16 << 20
MAX_FILE_BYTES = 4 << 30


def read_jsonl(path: str | os.PathLike[str]) -> list[Probe]:
    """The probes of a JSONL file, validated; a :class:`ProbeError` names every bad line."""
    rows = RowCollector(str(path), "line")
    for lineno, obj, problem in json_lines(path, "probe file", ProbeError):
        if problem is not None:
            rows.error(lineno, *problem)
        else:
            rows.row(lineno, obj, read_strictly=True)
    return rows.finish()


def json_lines(path: str | os.PathLike[str], what: str, error: type[InputError]
               ) -> Iterator[tuple[int, Any, tuple[str | None, str] | None]]:
    """``(line number, object, None)`` for each non-blank line of a JSONL file, or
    ``(line number, None, (field or None, what is wrong))``; a file or line too big to be one
    raises ``error``. Each line is read with :func:`forgetwatch.strict_json.loads`: a value
    strict JSON cannot hold (NaN, a 5,000-digit integer, a lone surrogate, deep nesting) is a
    bad line, its place named as the field."""
    source = str(path)
    if not Path(path).exists():
        raise FileNotFoundError(errno.ENOENT, f"{what} not found; check the path", source)
    for lineno, raw in enumerate(_bounded_lines(path, source, what, error), start=1):
        obj, problem = _decode_line(raw, lineno == 1)
        if obj is not _BLANK:
            yield lineno, obj, problem


def _bounded_lines(path: str | os.PathLike[str], source: str, what: str, error: type[InputError]) -> Iterator[bytes]:
    """The file's lines as bytes, read in chunks: a line over :data:`MAX_LINE_BYTES` or a file
    over :data:`MAX_FILE_BYTES` is an error as soon as it is seen, not after memory is full.
    Split on b"\\n" only: str.splitlines would also split on U+2028 etc. inside JSON strings."""
    number, total, pending = 0, 0, b""
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            total += len(chunk)
            if total > MAX_FILE_BYTES:
                raise error([(source, None, None, f"is over {MAX_FILE_BYTES >> 30} GiB; a {what} is "
                                                  "one JSON object per line: is this the right file?")])
            *whole, pending = (pending + chunk).split(b"\n")
            for line in whole:
                number += 1
                yield line
            if len(pending) > MAX_LINE_BYTES:
                raise error([(source, number + 1, None, f"is over {MAX_LINE_BYTES >> 20} MiB with no line "
                                                        f"break; a {what} is one JSON object per line")])
    yield pending

_BLANK = object()


def _decode_line(raw: bytes, first: bool) -> tuple[Any, tuple[str | None, str] | None]:
    """Return (object, None), (_BLANK, None) for a blank line, or (None, (field, error message))."""
    if first and raw.startswith(codecs.BOM_UTF8):
        raw = raw[len(codecs.BOM_UTF8):]  # editors on Windows like to add one
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, (None, f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at byte offset {exc.start}); "
                            "re-save the file with UTF-8 encoding")
    if not text.strip():
        return _BLANK, None
    try:
        return strict_json.loads(text), None
    except json.JSONDecodeError as exc:
        return None, (None, f"invalid JSON ({exc.msg} at column {exc.colno}); "
                            "each non-blank line must be one JSON object")
    except strict_json.StrictJSONError as exc:  # where it is reads like a field of the row
        return None, (exc.where or None, exc.why)


# -- stratified sampling ----------------------------------------------------------------------
