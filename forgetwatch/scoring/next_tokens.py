"""A model's top-k next-token distribution on token rows, kept once (npz), and KL(base ‖ current) against it."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from forgetwatch.common import strict_json
from forgetwatch.common.files import NPZ_ERRORS, atomic_write, read_npz, strict_dumps
from forgetwatch.common.text import first_line
from forgetwatch.scoring.batching import group, padded
from forgetwatch.scoring.borrow import borrowed, scoring_in, unwrap


class KeptFileError(ValueError):
    """A file kept with the run cannot serve this run: which one (``None``: several), and why."""

    def __init__(self, path: str | os.PathLike[str] | None, reason: str):
        self.path, self.reason = None if path is None else str(path), reason
        super().__init__(reason if path is None else f"{path}: {reason}")


MASS_TOLERANCE = 0.01  # how far a position's kept probabilities may sum from 1 (float16 rounds by < 0.05 %)
#: The arrays of a BaseDistribution, in order: their dtypes and dimensions.
_ARRAYS = {
    "offsets": ((np.int64,), 1),
    "top_ids": ((np.int32,), 2),
    "top_logprobs": ((np.float16, np.float32), 2),  # float32 for train KL: the base against itself gives exactly 0
    "tail": ((np.float32,), 1),
}


def first_usable(
    paths: Sequence[Path], read: Callable[[Path], Any], problem: Callable[[Any], str | None]
) -> tuple[Any, list[str]]:
    """The first of ``paths`` that exists, reads and has no ``problem``; and why each before it was passed over."""
    rejected = []
    for path in paths:
        if not path.is_file():
            continue
        try:
            value = read(path)
        except KeptFileError as err:
            rejected.append(str(err))
            continue
        if reason := problem(value):
            rejected.append(f"{path}: {reason}")
        else:
            return value, rejected
    return None, rejected


def target_mask(mask: torch.Tensor, rows: Sequence[int], starts: Sequence[int] | None) -> torch.Tensor:
    """The positions that predict a target token: the mask shifted, each row's positions before its start cleared."""
    targets = mask[:, 1:].clone()
    if starts is not None:
        for r, i in enumerate(rows):
            targets[r, : starts[i] - 1] = 0
    return targets


def aligned_targets(
    parts: Sequence[tuple[Any, Any, Any]], firsts: Sequence[int], positions: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One batch's base distribution laid out like its logits (rows × ``positions``), from each row's first target."""
    rows, k = len(parts), parts[0][0].shape[1]
    top_ids, top_lp = torch.zeros((rows, positions, k), dtype=torch.long), torch.zeros((rows, positions, k))
    tail = torch.zeros((rows, positions))
    for r, (part, first) in enumerate(zip(parts, firsts)):
        for whole, values in zip((top_ids, top_lp, tail), part):  # copied into the whole's dtype
            whole[r, first : first + len(values)] = torch.as_tensor(values)
    return top_ids.to(device), top_lp.to(device), tail.to(device)


def kl_to_base(logits: torch.Tensor, top_ids: torch.Tensor, top_lp: torch.Tensor, tail: torch.Tensor) -> torch.Tensor:
    """KL(base ‖ current) per position, from the base's top-k and ``tail`` mass; exact when k covers the vocabulary."""
    logq = torch.log_softmax(logits, -1)
    q_top = logq.gather(-1, top_ids)
    q_tail = torch.log1p(-q_top.exp().sum(-1).clamp(max=1 - 1e-7))
    return (top_lp.exp() * (top_lp - q_top)).sum(-1) + tail.exp() * (tail - q_tail)


@dataclass
class BaseDistribution:
    """Per row (by id) positions × k ``top_ids``, ``top_logprobs``, and the ``tail`` mass's log; ``key``: its source."""

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
        """What is wrong with these arrays as a distribution, or ``None``."""
        for name, (dtypes, ndim) in _ARRAYS.items():
            a = getattr(self, name)
            if not isinstance(a, np.ndarray) or a.dtype not in dtypes or a.ndim != ndim:
                return f"its {name} are not a {ndim}-d {' or '.join(np.dtype(t).name for t in dtypes)} array"
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
        """Plain lists, to share between ranks as JSON."""
        arrays = {name: getattr(self, name).tolist() for name in _ARRAYS}
        return {"ids": self.ids, **arrays, "logprob_type": self.top_logprobs.dtype.name, "key": self.key}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BaseDistribution:
        dtypes = {name: types[0] for name, (types, _) in _ARRAYS.items()} | {"top_logprobs": d["logprob_type"]}
        return cls(list(d["ids"]), *(np.asarray(d[n], dtype=t) for n, t in dtypes.items()), dict(d["key"]))

    def save(self, path: str | os.PathLike[str], extra: dict[str, np.ndarray] | None = None) -> None:
        """Write it as an npz (no pickle), with ``extra`` arrays in the same file."""
        with atomic_write(path, "wb") as f:
            arrays = {name: getattr(self, name) for name in _ARRAYS}
            np.savez(f, ids=_text(self.ids), key=_text(self.key), **arrays, **(extra or {}))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> BaseDistribution:
        """Read a file :meth:`save` wrote; a :class:`KeptFileError` names it and what is wrong."""
        return cls.read(path)[0]

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> tuple[BaseDistribution, dict[str, np.ndarray]]:
        """As :meth:`load`, with every array of the file."""
        try:
            z = read_npz(path)
            base = cls(_json(z["ids"]), *(z[name] for name in _ARRAYS), _json(z["key"]) if "key" in z else {})
        # a damaged npz fails inside zipfile, zlib or numpy with their own exception types
        except NPZ_ERRORS as err:
            raise KeptFileError(path, f"damaged or not a base distribution ({first_line(err)})") from None
        if not isinstance(base.key, dict):
            raise KeptFileError(path, "damaged: its key is not a JSON object")
        if problem := base.problem():
            raise KeptFileError(path, f"damaged: {problem}")
        return base, z


def _text(value: Any) -> np.ndarray:
    # npz holds no text without pickling
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
    precision: type = np.float16,
    compute: str = "autocast",
) -> BaseDistribution:
    """The model's top-``k`` next-token log-probabilities at each row's targets (from ``starts``), as ``precision``."""
    rows: list[Any] = [None] * len(token_ids)
    batches = _forwards(model, model, tokenizer, token_ids, range(len(token_ids)), pad_id, rows_per_batch, compute)
    for idx, _, _, logits in batches:
        logp = torch.log_softmax(logits, -1)
        top_lp, top_ids = logp.topk(min(k, logp.shape[-1]), dim=-1)
        tail = torch.log1p(-top_lp.exp().sum(-1).clamp(max=1 - 1e-7))
        for r, i in enumerate(idx):
            at = slice(0 if starts is None else starts[i] - 1, len(token_ids[i]) - 1)
            parts = (top_ids[r, at], top_lp[r, at], tail[r, at])
            rows[i] = tuple(t.cpu().numpy().astype(d) for t, d in zip(parts, (np.int32, precision, np.float32)))
    offsets = np.cumsum([0] + [len(row[0]) for row in rows], dtype=np.int64)
    return BaseDistribution(list(row_ids), offsets, *(np.concatenate(a) for a in zip(*rows)), dict(key or {}))


def _forwards(module, model, tokenizer, rows, indices, pad_id, rows_per_batch, compute):
    """Each right-padded batch of ``rows[indices]``, longest first: indices, ids, mask and float next-token logits."""
    device = next(module.parameters()).device
    with borrowed(model, tokenizer), scoring_in(model, device, compute):
        for batch in group([len(rows[i]) for i in indices], rows_per_batch, None):
            idx = [indices[j] for j in batch]
            ids, mask = (t.to(device) for t in padded([rows[i] for i in idx], pad_id))
            yield idx, ids, mask, module(input_ids=ids, attention_mask=mask).logits[:, :-1].float()


class MeasureFailed(RuntimeError):
    """A measurement over rows failed on some rank (every rank raises it, together)."""


def row_sums(
    model: torch.nn.Module,
    tokenizer: Any,
    rows: Sequence[Sequence[int]],
    starts: Sequence[int],
    pad_id: int,
    rows_per_batch: int,
    ranks: Any,
    per_position: Callable[[torch.Tensor, torch.Tensor, list[int]], torch.Tensor],
    compute: str = "autocast",
) -> np.ndarray:
    """Each row's sum of ``per_position(logits, ids, rows)`` over its targets, shared by ranks (failing all alike)."""
    n = len(rows)
    sums = np.zeros(n + 1, dtype=np.float64)  # each row's sum; then a failure flag
    failure: BaseException | None = None
    try:
        mine = ranks.my_share([len(x) for x in rows])
        batches = _forwards(unwrap(model), model, tokenizer, rows, mine, pad_id, rows_per_batch, compute)
        for idx, ids, mask, logits in batches:
            values = per_position(logits, ids, idx) * target_mask(mask, idx, starts)
            sums[idx] = values.sum(1).double().cpu().numpy()
            del logits, values
    except Exception as err:  # noqa: BLE001 - said below, on every rank alike
        failure, sums[n] = err, 1.0
    sums = ranks.sum(sums)
    if sums[n] > 0:
        why = f"{type(failure).__name__}: {first_line(failure)}" if failure is not None else "it failed on another rank"
        raise MeasureFailed(why) from failure
    return sums[:n]


def logits_width(model: torch.nn.Module) -> int | None:
    get = getattr(unwrap(model), "get_output_embeddings", None)
    weight = getattr(get() if callable(get) else None, "weight", None)
    return int(weight.shape[0]) if isinstance(weight, torch.Tensor) and weight.dim() == 2 else None
