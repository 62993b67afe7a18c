"""The history file of a monitored run: its record format and its one reader.

``history.jsonl`` holds one JSON object per evaluation, one per line, each line written whole
and ended by a newline::

    {"step": 40, "time": 1718000000.123, "seconds": 1.25, "trigger": "schedule",
     "report": {...TransitionReport.to_dict(), ids once at the top level...}, "stop": "..."}

``stop`` is there only when forgetwatch stopped training at that evaluation.

Example:
    >>> from forgetwatch.history import read_history, report_from_record
    >>> records = read_history("run/forgetwatch/history.jsonl")               # doctest: +SKIP
    >>> report = report_from_record(records[-1], {p.id: p.category for p in probes})  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .report import TransitionReport
from .text import describe

logger = logging.getLogger(__name__)

__all__ = ["HistoryError", "history_record", "read_history", "report_from_record"]

#: The id lists of a report: kept once, at the top level of a record.
_ID_LISTS = ("forgotten_ids", "gained_ids", "at_risk_ids")


class HistoryError(ValueError):
    """A line of a history file that is not an evaluation record (names the file and line)."""


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
    """One evaluation as ``history.jsonl`` stores it.

    The forgotten and gained ids are kept once, at the top level of the report: repeating
    them per category would double the file. :func:`report_from_record` gives each category
    its ids back.

    Args:
        step: the trainer's global step.
        report: the evaluation's :class:`~forgetwatch.report.TransitionReport`.
        time: when it was made (seconds since the epoch, ``time.time()``).
        seconds: how long the evaluation took.
        trigger: what asked for it (``"schedule"``, ``"evaluate"``, ``"train_end"``).
        stop: why forgetwatch stopped training here, if it did.
        columns: the evaluation's trajectory column (:meth:`~forgetwatch.trajectory.Trajectory.column`).

    Example:
        >>> r = history_record(10, TransitionReport(n=1, kept=1), time=0.0, seconds=0.5, trigger="schedule")
        >>> r["step"], r["report"]["kept"]
        (10, 1)
    """
    data = report.to_dict()
    for child in data["by_category"].values():
        for name in _ID_LISTS:
            child.pop(name, None)
        child.pop("by_category", None)
    record: dict[str, Any] = {"step": step, "time": round(time, 3), "seconds": round(seconds, 4),
                              "trigger": trigger, "report": data}
    if stop is not None:
        record["stop"] = stop
    if columns is not None:
        record["columns"] = columns
    return record


def report_from_record(record: Mapping[str, Any], category_of: Mapping[str, str]) -> TransitionReport:
    """The :class:`~forgetwatch.report.TransitionReport` of a history record, each category's
    forgotten and gained ids rebuilt from ``category_of`` (probe id → category).

    Example:
        >>> r = history_record(10, TransitionReport(n=1, forgotten=1, forgotten_ids=["q1"],
        ...     by_category={"math": TransitionReport(n=1, forgotten=1, forgotten_ids=["q1"])}),
        ...     time=0.0, seconds=0.5, trigger="schedule")
        >>> report_from_record(r, {"q1": "math"}).by_category["math"].forgotten_ids
        ['q1']
    """
    report = TransitionReport.from_dict(record["report"])
    children = {
        cat: dataclasses.replace(child, **{name: [i for i in getattr(report, name) if category_of.get(i) == cat]
                                           for name in _ID_LISTS})
        for cat, child in report.by_category.items()
    }
    return dataclasses.replace(report, by_category=children)


def read_history(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a ``history.jsonl``, in file order; blank lines are skipped.

    A last line without its final newline was cut short (a crash in the middle of a write):
    it is dropped with a warning. Any other line that is not a record raises
    :class:`HistoryError` naming the file and line: not JSON, not an object, no ``step``
    (an integer) or no ``report`` (an object).

    Example:
        >>> records = read_history("run/forgetwatch/history.jsonl")   # doctest: +SKIP
        >>> records[-1]["step"], records[-1]["report"]["forgetting"]  # doctest: +SKIP
        (40, 0.031)
    """
    path = Path(path)
    lines = path.read_bytes().split(b"\n")
    if lines[-1].strip():  # no final newline: the write of that line never finished
        logger.warning("%s, line %d: dropping an incomplete last line (a write cut short, e.g. by a crash)",
                       path, len(lines))
    records = []
    for number, line in enumerate(lines[:-1], start=1):
        if line.strip():
            try:
                records.append(_record(line))
            except HistoryError as err:
                raise HistoryError(f"{path}, line {number}: {err}; fix or delete that line "
                                   "(each line is one evaluation)") from None
    return records


def first_whole_history(paths: Iterable[str | os.PathLike[str]]) -> list[dict[str, Any]]:
    """The records of the first of ``paths`` that holds a readable, non-empty history (a
    resumed run's copies, the checkpoint's first): a damaged copy is named and skipped.

    Example:
        >>> first_whole_history(["ckpt/forgetwatch/history.jsonl", "run/forgetwatch/history.jsonl"])  # doctest: +SKIP
    """
    for path in paths:
        if not Path(path).is_file():
            continue
        try:
            records = read_history(path)
        except HistoryError as err:
            logger.warning("forgetwatch: %s; looking for another copy of the history", err)
            continue
        if records:
            return records
    return []


def _record(line: bytes) -> dict[str, Any]:
    """The record on one line, or :class:`HistoryError` saying what is wrong with it."""
    try:
        record = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        raise HistoryError("not UTF-8 text") from None
    except json.JSONDecodeError as err:
        raise HistoryError(f"not valid JSON ({err.msg})") from None
    if not isinstance(record, dict):
        raise HistoryError(f"expected a JSON object, got {describe(record)}")
    for key in ("step", "report"):
        if key not in record:
            raise HistoryError(f"record has no {key!r}")
    step, report = record["step"], record["report"]
    if not isinstance(step, int) or isinstance(step, bool):
        raise HistoryError(f"'step' must be an integer, got {describe(step)}")
    if not isinstance(report, dict):
        raise HistoryError(f"'report' must be a JSON object, got {describe(report)}")
    categories = report.get("by_category", {})
    if not isinstance(categories, dict) or not all(isinstance(c, dict) for c in categories.values()):
        raise HistoryError(f"'report.by_category' must map categories to JSON objects, got {describe(categories)}")
    return record
