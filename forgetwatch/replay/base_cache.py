"""The base model's next-token distribution on the replay rows, kept once, for ``replay_loss="kl"``.

At each position of each row, the ``k`` most likely next tokens with their log-probabilities,
and the log of the mass outside them: enough for KL(base ‖ current) with no second model in
memory. Computed when the base snapshot is taken and stored beside it (npz, never pickle),
copied into checkpoints and reused on resume.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..files import atomic_write
from ..scoring.batching import group
from ..scoring.borrow import borrowed
from .penalty import right_padded

__all__ = ["BaseDistribution", "base_distribution"]



@dataclass
class BaseDistribution:
    """Per row (by id): ``top_ids`` and ``top_logprobs`` (positions × k) and ``tail`` (the log
    of the probability outside the top k, per position); row ``i``'s positions are
    ``offsets[i]:offsets[i + 1]``, one per predicted token."""

    ids: list[str]
    offsets: np.ndarray
    top_ids: np.ndarray
    top_logprobs: np.ndarray
    tail: np.ndarray

    def __post_init__(self) -> None:
        self._index = {pid: i for i, pid in enumerate(self.ids)}

    @property
    def k(self) -> int:
        return int(self.top_ids.shape[1])

    def row(self, pid: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        i = self._index[pid]
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.top_ids[a:b], self.top_logprobs[a:b].astype(np.float32), self.tail[a:b]

    def to_dict(self) -> dict[str, Any]:
        """Plain lists (to share between ranks as JSON)."""
        return {"ids": self.ids, "offsets": self.offsets.tolist(), "top_ids": self.top_ids.tolist(),
                "top_logprobs": self.top_logprobs.astype(np.float32).tolist(), "tail": self.tail.tolist()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BaseDistribution:
        return cls(list(d["ids"]), np.asarray(d["offsets"], dtype=np.int64), np.asarray(d["top_ids"], dtype=np.int32),
                   np.asarray(d["top_logprobs"], dtype=np.float16), np.asarray(d["tail"], dtype=np.float32))

    def save(self, path: str | os.PathLike[str]) -> None:
        ids = np.frombuffer(json.dumps(self.ids, ensure_ascii=False).encode("utf-8"), dtype=np.uint8)
        with atomic_write(path, "wb") as f:
            np.savez(f, ids=ids, offsets=self.offsets, top_ids=self.top_ids, top_logprobs=self.top_logprobs,
                     tail=self.tail)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> BaseDistribution:
        with np.load(Path(path), allow_pickle=False) as z:
            return cls(json.loads(z["ids"].tobytes().decode("utf-8")), z["offsets"], z["top_ids"], z["top_logprobs"],
                       z["tail"])


def base_distribution(model: torch.nn.Module, tokenizer: Any, row_ids: Sequence[str],
                      token_ids: Sequence[Sequence[int]], pad_id: int, k: int, rows_per_batch: int = 8
                      ) -> BaseDistribution:
    """The model's top-``k`` next-token log-probabilities at every position of each row (the
    model borrowed: eval mode, no gradients, handed back as found)."""
    device = next(model.parameters()).device
    parts: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    with borrowed(model, tokenizer), torch.no_grad():
        for idx in group([len(x) for x in token_ids], rows_per_batch, None):
            ids, mask = right_padded([token_ids[i] for i in idx], pad_id)
            logp = torch.log_softmax(model(input_ids=ids.to(device), attention_mask=mask.to(device))
                                     .logits[:, :-1].float(), -1)
            top_lp, top_ids = logp.topk(min(k, logp.shape[-1]), dim=-1)
            tail = torch.log1p(-top_lp.exp().sum(-1).clamp(max=1 - 1e-7))
            for r, i in enumerate(idx):
                n = len(token_ids[i]) - 1
                parts[i] = (top_ids[r, :n].cpu().numpy().astype(np.int32),
                            top_lp[r, :n].cpu().numpy().astype(np.float16), tail[r, :n].cpu().numpy())
    order = range(len(token_ids))
    offsets = np.zeros(len(token_ids) + 1, dtype=np.int64)
    np.cumsum([len(parts[i][0]) for i in order], out=offsets[1:])
    return BaseDistribution(list(row_ids), offsets, np.concatenate([parts[i][0] for i in order]),
                            np.concatenate([parts[i][1] for i in order]), np.concatenate([parts[i][2] for i in order]))
