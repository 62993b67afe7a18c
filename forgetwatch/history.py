"""TEMPORARY: replaced by the files branch."""
from __future__ import annotations

import dataclasses
from typing import Any

from .report import TransitionReport


def history_record(step, report, *, time, seconds, trigger, stop=None):
    data = report.to_dict()
    for child in data["by_category"].values():
        child.pop("forgotten_ids", None)
        child.pop("gained_ids", None)
        child.pop("by_category", None)
    record = {"step": step, "time": time, "seconds": seconds, "trigger": trigger, "report": data}
    if stop:
        record["stop"] = stop
    return record


def report_from_record(record, category):
    report = TransitionReport.from_dict(record["report"])
    children = {
        cat: dataclasses.replace(child, forgotten_ids=[i for i in report.forgotten_ids if category.get(i) == cat],
                                 gained_ids=[i for i in report.gained_ids if category.get(i) == cat])
        for cat, child in report.by_category.items()
    }
    return dataclasses.replace(report, by_category=children)
