"""The files of a monitored run: the base snapshot and the evaluation history.

Both live in the run's forgetwatch directory and are copied into every checkpoint, so a run
resumed from a checkpoint finds the answers of its original base model (the weights it
resumes with have moved and must never stand in for the base).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

from .answers import Answers
from .files import atomic_write

logger = logging.getLogger("forgetwatch")

SNAPSHOT = "base_answers.npz"
HISTORY = "history.jsonl"
SUBDIR = "forgetwatch"  # inside each checkpoint directory


class RunStore:
    """Snapshot and history files in one directory (written atomically).

    Example:
        >>> store = RunStore("out/forgetwatch")            # doctest: +SKIP
        >>> store.save_history([{"step": 10, "report": {}}])  # doctest: +SKIP
    """

    def __init__(self, directory: str | os.PathLike[str]):
        self.dir = Path(directory)

    @property
    def snapshot_path(self) -> Path:
        return self.dir / SNAPSHOT

    @property
    def history_path(self) -> Path:
        return self.dir / HISTORY

    def check_writable(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)

    def load_snapshot(self) -> Answers | None:
        return Answers.load(self.snapshot_path) if self.snapshot_path.is_file() else None

    def save_snapshot(self, answers: Answers) -> None:
        answers.save(self.snapshot_path)

    def load_history(self) -> list[dict[str, Any]]:
        """The records, in order. A last line cut short by a crash mid-write is dropped."""
        if not self.history_path.is_file():
            return []
        text = self.history_path.read_text(encoding="utf-8")
        lines = text.split("\n")
        if lines and lines[-1].strip():  # no final newline: the write of that line never finished
            logger.warning("%s: dropping an incomplete last line", self.history_path)
        records = []
        for number, line in enumerate(lines[:-1], start=1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{self.history_path}: line {number}: not JSON ({err.msg})") from err
        return records

    def save_history(self, records: list[dict[str, Any]]) -> None:
        """Replace the whole file atomically (at the start of a run, or after a resume)."""
        with atomic_write(self.history_path) as f:
            f.writelines(_line(r) for r in records)

    def append_history(self, record: dict[str, Any]) -> None:
        """Add one record: one write of one whole line, flushed to disk (a crash can cut only
        this line short, and :meth:`load_history` drops such a line)."""
        self.history_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.history_path, "a", encoding="utf-8") as f:
            f.write(_line(record))
            f.flush()
            os.fsync(f.fileno())

    def set_aside_history(self) -> Path | None:
        """Move an earlier run's history out of the way (kept, renamed) before a fresh run."""
        if not self.history_path.is_file():
            return None
        stamp = time.strftime("%Y%m%d-%H%M%S")
        kept = self.dir / f"history-{stamp}.jsonl"
        n = 1
        while kept.exists():
            n += 1
            kept = self.dir / f"history-{stamp}-{n}.jsonl"
        os.replace(self.history_path, kept)
        return kept

    def copy_to(self, directory: str | os.PathLike[str]) -> None:
        """Copy snapshot and history into ``directory`` (a checkpoint's forgetwatch folder)."""
        target = Path(directory)
        target.mkdir(parents=True, exist_ok=True)
        for source in (self.snapshot_path, self.history_path):
            if source.is_file():
                with open(source, "rb") as src, atomic_write(target / source.name, "wb") as dst:
                    shutil.copyfileobj(src, dst)


def _line(record: dict[str, Any]) -> str:
    return json.dumps(_json_safe(record), ensure_ascii=False, allow_nan=False) + "\n"


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value
