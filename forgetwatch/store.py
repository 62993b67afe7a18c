"""The files of a monitored run: the base snapshot and the evaluation history.

Both live in the run's forgetwatch directory and are copied into every checkpoint, so a run
resumed from a checkpoint finds the answers of its original base model (the weights it
resumes with have moved and must never stand in for the base).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from .answers import Answers
from .files import atomic_write

SNAPSHOT = "base_answers.npz"
HISTORY = "history.jsonl"
SUBDIR = "forgetwatch"  # inside each checkpoint directory


def model_key(model: torch.nn.Module) -> str:
    """What the model is: its name and configuration (the same after training steps)."""
    from .scoring.borrow import unwrap

    config = getattr(unwrap(model), "config", None)
    described = config.to_dict() if hasattr(config, "to_dict") else {}
    for volatile in ("transformers_version", "_commit_hash", "use_cache"):  # trainers toggle use_cache
        described.pop(volatile, None)
    text = json.dumps(described, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def weights_key(model: torch.nn.Module) -> str:
    """A cheap signature of the weights: a few strided values of every parameter.

    Catches a snapshot cached for other weights under the same name and configuration
    (a re-trained base saved to the same path) without reading every parameter.
    """
    h = hashlib.sha256()
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            h.update(name.encode())
            flat = p.detach().reshape(-1)
            if flat.numel():  # sharded-away parameters (ZeRO-3) hold no values here
                sample = flat[:: max(1, flat.numel() // 16)][:16].float().cpu()
                h.update(sample.numpy().tobytes())
    return h.hexdigest()[:16]


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

    def load_snapshot(self) -> Answers | None:
        return Answers.load(self.snapshot_path) if self.snapshot_path.is_file() else None

    def save_snapshot(self, answers: Answers) -> None:
        answers.save(self.snapshot_path)

    def load_history(self) -> list[dict[str, Any]]:
        if not self.history_path.is_file():
            return []
        records = []
        with open(self.history_path, encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                if line.strip():
                    try:
                        records.append(json.loads(line))
                    except json.JSONDecodeError as err:
                        raise ValueError(f"{self.history_path}: line {number}: not JSON ({err.msg})") from err
        return records

    def save_history(self, records: list[dict[str, Any]]) -> None:
        """Rewrite the whole file atomically (it holds one short line per evaluation)."""
        with atomic_write(self.history_path) as f:
            for record in records:
                f.write(json.dumps(_json_safe(record), ensure_ascii=False, allow_nan=False) + "\n")

    def set_aside_history(self) -> Path | None:
        """Move an earlier run's history out of the way (kept, renamed) before a fresh run."""
        if not self.history_path.is_file():
            return None
        kept = self.dir / f"history-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
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


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value
