"""One evaluation as a line of ``history.jsonl`` (``{"step", "time", "seconds", "trigger", "report", "stop"?,
"columns"?}``): the record, its trajectory column, its checks. The file itself: :mod:`~forgetwatch.store.write`."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import math
import os
import zlib
from collections.abc import Mapping
from typing import Annotated, Any

import numpy as np
from pydantic import AllowInfNan, BaseModel, Field, Strict, StrictStr, ValidationError, create_model

from forgetwatch.common import strict_json
from forgetwatch.common.text import describe
from forgetwatch.results.report import TransitionReport

_ID_LISTS = ("forgotten_ids", "gained_ids", "at_risk_ids")
_COUNTS = ("n", "forgotten", "gained", "kept", "never")
#: Most bytes a column may inflate to when the probe count is not known (no zlib bomb).
_MAX_COLUMN_BYTES = 1 << 26
_FIX = "fix or delete that line (each line is one evaluation)"


class HistoryError(ValueError):
    """A line of a history file that is not an evaluation record; the message names the file, line and field."""

    def __init__(
        self, reason: str, field: str | None = None, path: str | os.PathLike[str] | None = None, line: int | None = None
    ):
        self.reason, self.field, self.path, self.line = reason, field, path, line
        where = f"field {field!r}: " if field else ""
        if path is not None:
            where = f"{path}, line {line}" + (f", field {field!r}" if field else "") + ": "
        super().__init__(f"{where}{reason}" + (f"; {_FIX}" if path is not None else ""))


def history_record(
    step: int,
    report: TransitionReport,
    *,
    time: float,
    seconds: float,
    trigger: str,
    stop: str | None = None,
    columns: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One evaluation as ``history.jsonl`` stores it: the report's id lists once, at the top level (per category
    they would double the file); ``time`` since the epoch."""
    data = report.to_dict()
    for child in data["by_category"].values():
        for name in (*_ID_LISTS, "by_category"):
            del child[name]
    record = {"step": step, "time": round(time, 3), "seconds": round(seconds, 4), "trigger": trigger, "report": data}
    record.update((key, value) for key, value in (("stop", stop), ("columns", columns)) if value is not None)
    return record


def report_from_record(record: Mapping[str, Any], category_of: Mapping[str, str]) -> TransitionReport:
    """The report of a record, each category's ids rebuilt from ``category_of`` (probe id → category)."""
    report = TransitionReport.from_dict(record["report"])
    children = {
        cat: dataclasses.replace(
            child, **{name: [i for i in getattr(report, name) if category_of.get(i) == cat] for name in _ID_LISTS}
        )
        for cat, child in report.by_category.items()
    }
    return dataclasses.replace(report, by_category=children)


# -- trajectory columns --------------------------------------------------------------------------


def encode_column(fingerprint: str, correct: np.ndarray, signal: np.ndarray) -> dict[str, str]:
    """A trajectory column as a record stores it: correctness bit-packed, the signal float16, zlib and base64."""
    return {
        "probes": fingerprint,
        "correct": _pack(np.packbits(np.asarray(correct, dtype=bool)).tobytes()),
        "signal": _pack(np.asarray(signal).astype("<f2").tobytes()),
    }


def decode_column(
    column: Any, probes: int | None = None, fingerprint: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """A record's column back as ``(correct, signal)``, checked to hold ``probes`` probes of ``fingerprint``."""
    _check(_Column, column, "columns")
    if fingerprint is not None and column["probes"] != fingerprint:
        raise HistoryError(
            f"written for another probe set (fingerprint {column['probes']!r}, these probes "
            f"{fingerprint!r}); use the probes of that run, or start a new output directory",
            "columns.probes",
        )
    packed = _inflate(column["correct"], "columns.correct", probes, 1 / 8)  # bit-packed
    signal = _inflate(column["signal"], "columns.signal", probes, 2)  # float16
    if len(signal) % 2:
        raise HistoryError(f"holds {len(signal)} bytes; float16 values take 2 each", "columns.signal")
    n = len(signal) // 2
    if probes is not None and n != probes:
        raise HistoryError(f"holds {n} probes, the run has {probes}", "columns.signal")
    bits = np.unpackbits(np.frombuffer(packed, dtype=np.uint8))
    if len(packed) != -(-n // 8) or bits[n:].any():
        raise HistoryError(
            f"holds {len(bits)} bits, not the {n} probes of its signal (padded to a whole byte with zeros)",
            "columns.correct",
        )
    return bits[:n].astype(bool), np.frombuffer(signal, dtype="<f2").astype(np.float32)


def _pack(data: bytes) -> str:
    return base64.b64encode(zlib.compress(data, 6)).decode("ascii")


def _inflate(text: str, field: str, probes: int | None, bytes_per_probe: float) -> bytes:
    limit = _MAX_COLUMN_BYTES if probes is None else math.ceil(probes * bytes_per_probe)
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise HistoryError("not base64 text", field) from None
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error as err:
        raise HistoryError(f"not zlib-compressed data ({err})", field) from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise HistoryError(
            f"holds more than the {probes} probes of this run"
            if probes is not None
            else f"inflates to more than {limit} bytes",
            field,
        )
    if not inflater.eof or inflater.unused_data:
        raise HistoryError("zlib data cut short or followed by other bytes", field)
    return out


def parse_record(line: bytes, probes: int | None = None, fingerprint: str | None = None) -> dict[str, Any]:
    """The record on one line of a history file, or a :class:`HistoryError` (without the file and line)."""
    try:
        record = strict_json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        raise HistoryError("not UTF-8 text") from None
    except strict_json.StrictJSONError as err:  # NaN, a 5,000-digit integer, ...: not what forgetwatch writes
        raise HistoryError(err.why, err.where or None) from None
    except ValueError as err:  # JSONDecodeError
        raise HistoryError(f"not valid JSON ({getattr(err, 'msg', err)})") from None
    _check(_Record, record, "")
    _check_report(record["report"], "report")
    for cat, child in (record["report"].get("by_category") or {}).items():
        _check_report(child, f"report.by_category.{cat}")
    if "columns" in record:
        decode_column(record["columns"], probes, fingerprint)
    return record


def _check_report(report: dict[str, Any], where: str) -> None:
    _check(_Report, report, where)
    if (total := sum(report[name] for name in _COUNTS[1:])) != report["n"]:
        raise HistoryError(f"forgotten + gained + kept + never = {total}, not n = {report['n']}", f"{where}.n")


def _shaped(name: str) -> Any:
    kind, want = next(shape for end, shape in _SHAPES.items() if name.endswith(end))
    return _typed(kind | None, want)


def _typed(kind: Any, want: str, required: bool = False) -> Any:
    """A model field of type ``kind``; ``want``: what a wrong value is told it must be."""
    return (kind, Field(... if required else None, description=want))


_Figure = Annotated[float, Strict(), AllowInfNan(False)] | None
_COUNT = _typed(Annotated[int, Strict(), Field(ge=0)], "a whole number 0 or more", required=True)
_TEXT = _typed(StrictStr, "text")
#: What a report's field other than a count holds, by the end of its name (``None`` always allowed).
_SHAPES: dict[str, tuple[Any, str]] = {
    "by_category": (dict[str, dict[str, Any]], "a JSON object by category"),
    "_ids": (list[StrictStr], "a list of probe ids"),
    "_groups": (list[StrictStr], "a list of group names"),
    "_ci": (tuple[_Figure, _Figure], "[low, high] (numbers or null)"),
    "behaviour": (dict[str, _Figure], "figures' numbers or null"),
    "agreement": (list[dict[str, _Figure]], "a list of the seeds' figures (numbers or null)"),
    "": (_Figure, "a number or null"),
}
_Report = create_model(
    "_Report",
    **{name: _shaped(name) for name in sorted(TransitionReport.__dataclass_fields__.keys() - set(_COUNTS))},
    **dict.fromkeys(_COUNTS, _COUNT),  # checked last, as their sum is
)
_Record = create_model(
    "_Record", step=_COUNT, report=_typed(dict[str, Any], "a JSON object", required=True), stop=_TEXT, trigger=_TEXT
)
_Column = create_model("_Column", **dict.fromkeys(("probes", "correct", "signal"), _typed(StrictStr, "text", True)))


def _check(model: type[BaseModel], data: Any, where: str) -> None:
    """A :class:`HistoryError` naming ``where`` and the first field of ``data`` that ``model`` refuses, if any."""
    try:
        model.model_validate(data)
    except ValidationError as err:
        loc = err.errors()[0]["loc"]
        if not loc:  # not an object at all
            raise HistoryError(f"must be a JSON object, got {describe(data)}", where or None) from None
        name = str(loc[0])
        field = f"{where}.{name}" if where else name
        if name not in data:
            raise HistoryError("missing", field) from None
        want = model.model_fields[name].description
        raise HistoryError(f"must be {want}, got {describe(data[name])}", field) from None
