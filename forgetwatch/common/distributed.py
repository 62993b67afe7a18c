"""What crosses ranks, as numbers or JSON (never pickled); one process touches no ``torch.distributed``."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class Ranks:
    """The processes of one evaluation: all of them (``Ranks.all()``, which call together) or this one alone."""

    size: int = 1
    index: int = 0

    @classmethod
    def all(cls) -> Ranks:
        dist = torch.distributed
        return cls(dist.get_world_size(), dist.get_rank()) if dist.is_available() and dist.is_initialized() else cls()

    @property
    def device(self) -> torch.device:
        """Where collective tensors live: NCCL moves only CUDA tensors."""
        if torch.distributed.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _ints(self, values: list[int], collective: Callable[[torch.Tensor], Any]) -> list[int]:
        if self.size == 1:
            return list(values)
        shared = torch.tensor(values, dtype=torch.long, device=self.device)
        collective(shared)
        return shared.tolist()

    def from_rank_zero(self, values: list[int]) -> list[int]:
        """Rank 0's ``values`` on every rank."""
        return self._ints(values, lambda t: torch.distributed.broadcast(t, src=0))

    def agree_max(self, values: list[int]) -> list[int]:
        """The element-wise largest of every rank's ``values``."""
        return self._ints(values, lambda t: torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX))

    def agree_min(self, values: list[int]) -> list[int]:
        """The element-wise smallest of every rank's ``values``."""
        return [-v for v in self.agree_max([-v for v in values])]

    def sum(self, values: np.ndarray) -> np.ndarray:
        """The sum of every rank's float64 array: bit for bit the same everywhere."""
        if self.size == 1:
            return values
        shared = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float64)).to(self.device)
        torch.distributed.all_reduce(shared)
        return shared.cpu().numpy()

    def sum_tensors(self, tensors: Sequence[torch.Tensor]) -> None:
        """Replace each tensor, in place, by its sum over the ranks."""
        if self.size > 1:
            for t in tensors:
                torch.distributed.all_reduce(t)

    def gather_json(self, value: Any) -> list[Any]:
        """Every rank's JSON-able ``value``, in rank order."""
        if self.size == 1:
            return [value]
        data = json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")
        width = self.agree_max([len(data)])[0]
        local = torch.frombuffer(bytearray(data.ljust(width)), dtype=torch.uint8).to(self.device)  # JSON ends in spaces
        parts = [torch.empty_like(local) for _ in range(self.size)]
        torch.distributed.all_gather(parts, local)
        return [json.loads(p.cpu().numpy().tobytes()) for p in parts]

    def share_from_rank_zero(self, make: Callable[[], Any]) -> Any:
        """``make()`` run on rank 0, its JSON-able result on every rank; if it raises, every rank raises."""
        if self.size == 1:
            return make()
        error, text = None, ""
        if self.index == 0:
            try:
                text = json.dumps({"ok": make()}, ensure_ascii=False, allow_nan=False)
            except Exception as err:  # noqa: BLE001 - raised again below, once the others know
                error, text = err, json.dumps({"error": f"{type(err).__name__}: {err}"})
        message = json.loads(self.gather_json(text)[0])
        if error is not None:
            raise error
        if "error" in message:
            raise RuntimeError(f"forgetwatch failed on rank 0: {message['error']}")
        return message["ok"]

    def my_share(self, costs: Sequence[float]) -> list[int]:
        return shard(costs, self.size)[self.index] if self.size > 1 else list(range(len(costs)))


def shard(costs: Sequence[float], n_shards: int) -> list[list[int]]:
    """Split item indices into ``n_shards`` lists of about equal cost, the same on every rank."""
    loads = [0.0] * n_shards
    shards: list[list[int]] = [[] for _ in range(n_shards)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        target = min(range(n_shards), key=lambda s: (loads[s], len(shards[s]), s))
        shards[target].append(i)
        loads[target] += costs[i]
    return [sorted(s) for s in shards]
