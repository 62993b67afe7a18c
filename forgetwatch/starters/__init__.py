"""Starter probe sets written by this project (not copied from any benchmark), shipped with the package so a fresh
checkout runs with no downloads: smoke alarms, not benchmarks (docs/behaviour.md)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

__all__ = ["STARTERS", "starter_path", "write_starter"]

#: Starter set name -> what it holds.
STARTERS = {
    "behaviour": "30 behaviour probes: benign requests answered, harmful ones refused, format and length instructions",
    "knowledge": "40 multiple-choice general facts: geography, science, language, everyday",
    "tools": "16 tool calls (weather, currency, timer, search, email): the right tool and its arguments",
    "multiturn": "16 conversations: recall an earlier turn, compute from it, keep an instruction, resolve a reference",
}


def starter_path(name: str) -> Path:
    """The shipped JSONL file of starter set ``name`` (one of :data:`STARTERS`)."""
    if name not in STARTERS:
        raise ValueError(f"no starter set {name!r}; choose one of {', '.join(STARTERS)}")
    return Path(__file__).with_name(f"{name}.jsonl")


def write_starter(name: str, out: str | os.PathLike[str]) -> Path:
    """Copy starter set ``name`` to ``out`` (a JSONL probe file to edit and extend)."""
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(starter_path(name), target)
    return target
