"""The base model's next-token distribution on the replay rows, kept once, for ``replay_loss="kl"``.

At each position of each row, the ``k`` most likely next tokens with their log-probabilities,
and the log of the mass outside them: enough for KL(base ‖ current) with no second model in
memory. Computed when the base snapshot is taken and stored beside it (npz, never pickle) with
the key of what it was made from, copied into checkpoints, and on resume read back only when
every array checks out (:meth:`BaseDistribution.problem`) and the key is this run's.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from forgetwatch.common import strict_json
from forgetwatch.common.files import NPZ_ERRORS, atomic_write, strict_dumps
from forgetwatch.common.text import first_line
from forgetwatch.replay.penalty import right_padded
from forgetwatch.scoring.batching import group
from forgetwatch.scoring.borrow import borrowed

__all__ = ["BaseDistribution", "ReplayFileError", "base_distribution", "read_kept_json"]


class ReplayFileError(ValueError):
    """A kept replay file (``replay.json``, ``replay_base.npz``, a history record's replay state)
    cannot serve this run: which one (``None`` when the reason names several), and why."""

    def __init__(self, path: str | os.PathLike[str] | None, reason: str):
        self.path, self.reason = None if path is None else str(path), reason
        super().__init__(reason if path is None else f"{path}: {reason}")


def read_kept_json(path: str | os.PathLike[str], limit: int, form: str | None = None) -> Any:
    """The JSON in a kept replay file; a :class:`ReplayFileError` names the file and why it cannot
    be read (over ``limit`` bytes, not UTF-8, not JSON, numbers past what JSON keeps, or not an
    object of ``"format": form`` when ``form`` is given)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(limit + 1)
        if len(raw) > limit:
            raise ValueError(f"over {limit >> 20} MiB")
        value = strict_json.loads(raw.decode("utf-8"))
    except (OSError, ValueError) as err:  # JSON, strict JSON and UTF-8 errors are ValueErrors
        raise ReplayFileError(path, f"damaged: {first_line(err)}") from None
    if form is not None and (not isinstance(value, dict) or value.get("format") != form):
        raise ReplayFileError(path, f"damaged: not a {form} file")
    return value


#: How far the kept probabilities of a position (its top k and its tail) may sum from 1: float16
#: log-probabilities round each term by less than 0.05 %.
MASS_TOLERANCE = 0.01


@dataclass
class BaseDistribution:
    """Per row (by id): ``top_ids`` and ``top_logprobs`` (positions × k) and ``tail`` (the log
    of the probability outside the top k, per position); row ``i``'s positions are
    ``offsets[i]:offsets[i + 1]``, one per predicted token. ``key``: what it was made from
    (pool, tokens, top k, model; see :func:`~forgetwatch.replay.resume.base_problem`)."""

    ids: list[str]
    offsets: np.ndarray
    top_ids: np.ndarray
    top_logprobs: np.ndarray
    tail: np.ndarray
    key: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._index = {pid: i for i, pid in enumerate(self.ids)}

    @property
    def k(self) -> int:
        return int(self.top_ids.shape[1])

    def row(self, pid: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        i = self._index[pid]
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.top_ids[a:b], self.top_logprobs[a:b].astype(np.float32), self.tail[a:b]

    def problem(self) -> str | None:
        """What is wrong with these arrays as a distribution, or ``None``: their types and
        shapes, offsets that do not add up, ids that repeat, log-probabilities that are not
        finite and at most 0, token ids below 0, or a position whose kept probabilities do
        not sum to 1.

        Example:
            >>> d = BaseDistribution(["r1"], np.array([0, 1]), np.array([[3]], dtype=np.int32),
            ...                      np.array([[0.5]], dtype=np.float16), np.array([-1.0], dtype=np.float32))
            >>> d.problem()
            'a log-probability is above 0 (0.5)'
        """
        arrays = {
            "offsets": (self.offsets, np.int64, 1),
            "top_ids": (self.top_ids, np.int32, 2),
            "top_logprobs": (self.top_logprobs, np.float16, 2),
            "tail": (self.tail, np.float32, 1),
        }
        for name, (a, dtype, ndim) in arrays.items():
            if not isinstance(a, np.ndarray) or a.dtype != dtype or a.ndim != ndim:
                return f"its {name} are not a {ndim}-d {np.dtype(dtype).name} array"
        if not isinstance(self.ids, list) or not all(isinstance(i, str) for i in self.ids):
            return "its row ids are not a list of strings"
        if len(self._index) != len(self.ids):
            return "a row id appears twice"
        positions = len(self.tail)
        if self.top_ids.shape != self.top_logprobs.shape or self.top_ids.shape[0] != positions or self.k < 1:
            return (
                f"its arrays do not fit together (top ids {self.top_ids.shape}, log-probabilities "
                f"{self.top_logprobs.shape}, tail {self.tail.shape})"
            )
        o = self.offsets
        if len(o) != len(self.ids) + 1 or o[0] != 0 or o[-1] != positions or (np.diff(o) < 0).any():
            return f"its offsets do not add up to {len(self.ids)} rows of {positions} positions"
        if (self.top_ids < 0).any():
            return "a token id is below 0"
        for name, values in (("log-probability", self.top_logprobs), ("tail", self.tail)):
            if not np.isfinite(values).all():
                return f"a {name} is not a finite number"
            if (values > 0).any():
                return f"a {name} is above 0 ({float(values.max()):g})"
        mass = np.exp(self.top_logprobs.astype(np.float64)).sum(1) + np.exp(self.tail.astype(np.float64))
        if positions and (off := float(np.abs(mass - 1).max())) > MASS_TOLERANCE:
            return f"the probabilities kept at a position do not sum to 1 (off by {off:.3g})"
        return None

    def to_dict(self) -> dict[str, Any]:
        """Plain lists (to share between ranks as JSON)."""
        return {
            "ids": self.ids,
            "offsets": self.offsets.tolist(),
            "top_ids": self.top_ids.tolist(),
            "top_logprobs": self.top_logprobs.astype(np.float32).tolist(),
            "tail": self.tail.tolist(),
            "key": self.key,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BaseDistribution:
        return cls(
            list(d["ids"]),
            np.asarray(d["offsets"], dtype=np.int64),
            np.asarray(d["top_ids"], dtype=np.int32),
            np.asarray(d["top_logprobs"], dtype=np.float16),
            np.asarray(d["tail"], dtype=np.float32),
            dict(d.get("key", {})),
        )

    def save(self, path: str | os.PathLike[str]) -> None:
        with atomic_write(path, "wb") as f:
            np.savez(
                f,
                ids=_text(self.ids),
                key=_text(self.key),
                offsets=self.offsets,
                top_ids=self.top_ids,
                top_logprobs=self.top_logprobs,
                tail=self.tail,
            )

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> BaseDistribution:
        """Read a file written by :meth:`save`; a :class:`ReplayFileError` names the file and
        what is wrong with it (damaged, or not a distribution: see :meth:`problem`)."""
        try:
            with np.load(Path(path), allow_pickle=False) as z:
                base = cls(
                    _json(z["ids"]),
                    z["offsets"],
                    z["top_ids"],
                    z["top_logprobs"],
                    z["tail"],
                    _json(z["key"]) if "key" in z.files else {},
                )
        # a damaged npz fails inside zipfile, zlib or numpy with their own exception types
        except NPZ_ERRORS as err:
            reason = (
                "it holds pickled (object) data, which forgetwatch never loads"
                if "pickle" in str(err)
                else f"damaged or not a replay base distribution ({first_line(err)})"
            )
            raise ReplayFileError(path, reason) from None
        if not isinstance(base.key, dict):
            raise ReplayFileError(path, "damaged: its key is not a JSON object")
        if problem := base.problem():
            raise ReplayFileError(path, f"damaged: {problem}")
        return base


def _text(value: Any) -> np.ndarray:
    """A JSON value as UTF-8 bytes in a uint8 array (npz holds no text without pickling)."""
    return np.frombuffer(strict_dumps(value).encode("utf-8"), dtype=np.uint8)


def _json(array: np.ndarray) -> Any:
    if array.dtype != np.uint8 or array.ndim != 1:
        raise ValueError("a text field is not UTF-8 bytes")
    return strict_json.loads(array.tobytes().decode("utf-8"))


def base_distribution(
    model: torch.nn.Module,
    tokenizer: Any,
    row_ids: Sequence[str],
    token_ids: Sequence[Sequence[int]],
    pad_id: int,
    k: int,
    rows_per_batch: int = 8,
    key: dict[str, Any] | None = None,
    starts: Sequence[int] | None = None,
) -> BaseDistribution:
    """The model's top-``k`` next-token log-probabilities at every target position of each row
    (those predicting its tokens from its ``starts`` entry on, 1 when not given; the model
    borrowed: eval mode, no gradients, handed back as found); ``key``: what it is made from."""
    device = next(model.parameters()).device
    parts: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    with borrowed(model, tokenizer), torch.no_grad():
        for idx in group([len(x) for x in token_ids], rows_per_batch, None):
            ids, mask = right_padded([token_ids[i] for i in idx], pad_id)
            logp = torch.log_softmax(
                model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits[:, :-1].float(), -1
            )
            top_lp, top_ids = logp.topk(min(k, logp.shape[-1]), dim=-1)
            tail = torch.log1p(-top_lp.exp().sum(-1).clamp(max=1 - 1e-7))
            for r, i in enumerate(idx):
                at = slice(0 if starts is None else starts[i] - 1, len(token_ids[i]) - 1)
                parts[i] = (
                    top_ids[r, at].cpu().numpy().astype(np.int32),
                    top_lp[r, at].cpu().numpy().astype(np.float16),
                    tail[r, at].cpu().numpy(),
                )
    order = range(len(token_ids))
    offsets = np.zeros(len(token_ids) + 1, dtype=np.int64)
    np.cumsum([len(parts[i][0]) for i in order], out=offsets[1:])
    return BaseDistribution(
        list(row_ids),
        offsets,
        np.concatenate([parts[i][0] for i in order]),
        np.concatenate([parts[i][1] for i in order]),
        np.concatenate([parts[i][2] for i in order]),
        dict(key or {}),
    )
