"""``replay_select="rows"``: the pool measures itself. At each evaluation each scanned row's loss
is compared with the base's, and rows are drawn in proportion to how much it rose.

Why the rise and not the loss: a row the base already found hard is not being forgotten; the
rise is what training did to it. Why a mean per target token: a long row must not outweigh a
short one for being long. Why a floor: a row whose loss fell still gets a little replay, so the
draws never narrow to a handful of rows.

The base's losses are computed once when training begins and kept with the run
(``replay_scan.json``): they cannot be recomputed from moved weights.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from forgetwatch.common.distributed import Ranks
from forgetwatch.common.files import atomic_write, strict_dumps
from forgetwatch.replay.base_cache import ReplayFileError, read_kept_json
from forgetwatch.replay.sampler import FLOOR
from forgetwatch.scoring.next_tokens import row_sums

__all__ = ["ScanBase", "decode_increase", "encode_increase", "row_losses", "row_probabilities", "scan_sample"]

_FORMAT = "forgetwatch.replay_scan"
#: A kept scan file larger than this is not one (4096 rows of ids and losses).
MAX_SCAN_BYTES = 16 << 20


def scan_sample(n: int, scan_rows: int, seed: int) -> np.ndarray:
    """Which of ``n`` rows are scanned (and replayed): all when ``n <= scan_rows``, else a seeded
    sample of ``scan_rows``, in pool order.

    Example:
        >>> scan_sample(4, 8, 0).tolist(), len(scan_sample(100, 8, 0)), (scan_sample(100, 8, 0) == scan_sample(100, 8, 0)).all()
        ([0, 1, 2, 3], 8, np.True_)
    """
    if n <= scan_rows:
        return np.arange(n)
    return np.sort(np.random.default_rng([seed, 0x5CA9]).choice(n, scan_rows, replace=False))


def row_probabilities(increase: np.ndarray, floor: float = FLOOR) -> np.ndarray:
    """Draw probabilities from each row's loss rise: in proportion to the rise (a fall counts
    as none), mixed with even shares by ``floor``; even when nothing rose (before any scan).

    Example:
        >>> row_probabilities(np.array([0.3, 0.1, -0.2, 0.0])).round(3).tolist()
        [0.7, 0.25, 0.025, 0.025]
    """
    n = len(increase)
    rise = np.maximum(np.asarray(increase, dtype=np.float64), 0.0)
    total = rise.sum()
    if not total > 0:
        return np.full(n, 1 / n)
    return (1 - floor) * rise / total + floor / n


def row_losses(
    model: torch.nn.Module,
    token_ids: Sequence[Sequence[int]],
    starts: Sequence[int],
    pad_id: int,
    rows_per_batch: int,
    ranks: Ranks,
    tokenizer: Any = None,
) -> np.ndarray:
    """Each row's mean next-token loss over its target tokens (from its ``starts`` entry on),
    float64, sharded over the ranks (see :func:`~forgetwatch.scoring.next_tokens.row_sums`: a
    failure on any rank is a ``MeasureFailed`` on every rank).

    Example:
        >>> row_losses(model, [[1, 5, 6]], [1], pad_id=0, rows_per_batch=8, ranks=Ranks.alone())  # doctest: +SKIP
        array([2.31...])
    """

    def nll(logits: torch.Tensor, ids: torch.Tensor, rows: list[int]) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")

    sums = row_sums(model, tokenizer, token_ids, starts, pad_id, rows_per_batch, ranks, nll)
    return sums / np.array([len(x) - s for x, s in zip(token_ids, starts)], dtype=np.float64)


def encode_increase(increase: np.ndarray) -> str:
    """The rows' loss rises as float32 bytes in base64: exact, and small in a history record."""
    return base64.b64encode(np.asarray(increase, dtype="<f4").tobytes()).decode("ascii")


def decode_increase(text: Any, n: int) -> np.ndarray | None:
    """:func:`encode_increase`'s ``n`` finite numbers back, or ``None`` if ``text`` is not that.

    Example:
        >>> decode_increase(encode_increase(np.array([0.25, -1.0])), 2).tolist()
        [0.25, -1.0]
    """
    try:
        values = np.frombuffer(base64.b64decode(text, validate=True), dtype="<f4")
    except (TypeError, ValueError):
        return None
    return values.astype(np.float32) if len(values) == n and np.isfinite(values).all() else None


def sample_key(ids: Sequence[str]) -> str:
    """A hash of the scanned rows' ids, in order."""
    return hashlib.sha256(json.dumps(list(ids)).encode("utf-8")).hexdigest()[:16]


@dataclass
class ScanBase:
    """The base's mean loss per target token on each scanned row (by id), and ``key``: what it
    was made from (pool, tokens, sample, model and weights)."""

    ids: list[str]
    base_loss: list[float]
    key: dict[str, Any] = field(default_factory=dict)

    def problem(self) -> str | None:
        """What is wrong with it, or ``None``.

        Example:
            >>> ScanBase(["r1", "r1"], [0.5, 0.5]).problem()
            'a row id appears twice'
        """
        if not isinstance(self.ids, list) or not all(isinstance(i, str) for i in self.ids):
            return "its row ids are not a list of strings"
        if len(set(self.ids)) != len(self.ids):
            return "a row id appears twice"
        losses = self.base_loss
        if not isinstance(losses, list) or len(losses) != len(self.ids):
            return f"it has {len(losses) if isinstance(losses, list) else 'no list of'} losses for {len(self.ids)} rows"
        if not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0 for x in losses
        ):
            return "a loss is not a finite number from 0"
        if not isinstance(self.key, dict):
            return "its key is not a JSON object"
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"format": _FORMAT, "version": 1, "key": self.key, "ids": self.ids, "base_loss": self.base_loss}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ScanBase:
        return cls(list(d["ids"]), list(d["base_loss"]), dict(d["key"]))

    def save(self, path: str | os.PathLike[str]) -> None:
        with atomic_write(path, "w") as f:
            f.write(strict_dumps(self.to_dict()))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ScanBase:
        """Read a file written by :meth:`save`; a :class:`ReplayFileError` names it and what is wrong."""
        d = read_kept_json(path, MAX_SCAN_BYTES, _FORMAT)
        scan = cls(d.get("ids"), d.get("base_loss"), d.get("key"))
        if problem := scan.problem():
            raise ReplayFileError(path, f"damaged: {problem}")
        return scan
