"""A watched run's saved checkpoints, each with the forgetting measured at its step and the target by then (the
training loss the trainer logged, or a target measured on each): the front of forgetting against the target, and
the checkpoint to take."""

from __future__ import annotations

import json
import math
import numbers
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forgetwatch.common.problems import InputError
from forgetwatch.common.text import describe
from forgetwatch.store import HISTORY, SUBDIR
from forgetwatch.store.read import read_history

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


@dataclass(frozen=True)
class SavedCheckpoint:
    """A checkpoint folder: its step, its forgetting (chance-adjusted where it applies) and its target: the training
    loss the trainer last logged at or before its step, or what ``measure`` gave."""

    step: int
    path: Path
    forgetting: float | None  # None: no evaluation at this step
    forgotten: int | None
    target: float | None
    on_front: bool = False


def saved_checkpoints(
    output_dir: str | os.PathLike[str], measure: Callable[[Path], float] | None = None, higher_is_better: bool = False
) -> list[SavedCheckpoint]:
    """The trainer's ``checkpoint-<step>`` folders in ``output_dir``, by step, with what the run measured there and
    the target (``measure(folder)``; default the logged training loss), marked on the front."""
    root = Path(output_dir)
    history = root / SUBDIR / HISTORY if (root / SUBDIR / HISTORY).is_file() else root / HISTORY
    if not history.is_file():
        raise FileNotFoundError(f"{root}: no {SUBDIR}/{HISTORY}; give the output directory of a watched run")
    reports = {int(r["step"]): r["report"] for r in read_history(history)}
    folders = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := _CHECKPOINT.match(p.name)) and p.is_dir())
    if not folders:
        raise FileNotFoundError(f"{root}: no checkpoint-<step> folders (save_strategy='no'?)")
    losses = _logged_losses(folders[-1][1]) if measure is None else []
    rows = []
    for step, path in folders:
        report = reports.get(step)
        if measure is None:
            target = next((value for at, value in reversed(losses) if at <= step), None)
        else:
            target = measure(path) if report is not None else None  # off the front anyway: not loaded
        forgetting = None if report is None else _forgetting(report)
        rows.append(SavedCheckpoint(step, path, forgetting, None if report is None else report["forgotten"], target))
    sign = -1 if higher_is_better else 1
    front = pareto_front([(r.forgetting, None if r.target is None else sign * r.target) for r in rows])
    return [SavedCheckpoint(**{**vars(r), "on_front": i in front}) for i, r in enumerate(rows)]


def pareto_front(points: list[tuple[float | None, float | None]]) -> set[int]:
    """The indices of the points no other point beats on both (lower is better); points with a None are left out."""
    whole = [(i, p) for i, p in enumerate(points) if None not in p]
    return {
        i
        for i, (f, loss) in whole
        if not any(g <= f and m <= loss and (g, m) != (f, loss) for _, (g, m) in whole)  # type: ignore[operator]
    }


def choose(
    rows: list[SavedCheckpoint], keep: float = 0.9, start: float | None = None, higher_is_better: bool = False
) -> SavedCheckpoint | None:
    """On the front, the checkpoint with the least forgetting among those that reached ``keep`` of the run's gain on
    the target, from ``start`` (the base's; default the first checkpoint's) to the best at a checkpoint; ties to the
    later step."""
    front = [r for r in rows if r.on_front]
    values = [r.target for r in rows if r.target is not None]
    if not front or not values:
        return None
    sign = -1 if higher_is_better else 1  # the gain as a fall
    first = values[0] if start is None else start
    fell = sign * (first - min(values, key=lambda v: sign * v))
    kept = [r for r in front if fell <= 0 or sign * (first - r.target) / fell >= keep]  # type: ignore[operator]
    return min(kept or front, key=lambda r: (r.forgetting, -r.step))


def _forgetting(report: dict[str, Any]) -> float | None:
    for key in ("forgetting_adjusted", "forgetting"):
        value = report.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            return float(value)
    return None


def _logged_losses(checkpoint: Path) -> list[tuple[int, float | None]]:
    """The training losses in the checkpoint's ``trainer_state.json`` by step (``None``: not finite); an
    :class:`InputError` names the file and the field of a loss or step that is not a number."""
    path = checkpoint / "trainer_state.json"
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    history = state.get("log_history", []) if isinstance(state, dict) else []
    losses = []
    for i, entry in enumerate(history if isinstance(history, list) else []):
        if not isinstance(entry, dict) or "loss" not in entry or "step" not in entry:
            continue
        for key, kind, what in (("step", int, "a whole number"), ("loss", numbers.Real, "a number")):
            if isinstance(entry[key], bool) or not isinstance(entry[key], kind):
                message = f"expected {what}, got {describe(entry[key])}; is this the trainer's own file?"
                raise InputError([(str(path), None, f"log_history[{i}].{key}", message)])
        losses.append((entry["step"], float(entry["loss"]) if math.isfinite(entry["loss"]) else None))
    return losses
