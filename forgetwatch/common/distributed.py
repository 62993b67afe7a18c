"""Everything that crosses ranks: decisions taken on rank 0 and broadcast, results as numbers or JSON (never
pickled), identical on every rank; in one process nothing touches ``torch.distributed``."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


def world_size() -> int:
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


@dataclass(frozen=True)
class Ranks:
    """The processes of one evaluation: all of them (``Ranks.all()``, which call together) or this one alone.

    Example:
        >>> Ranks.alone().agree_max([3, 0])
        [3, 0]
    """

    size: int = 1
    index: int = 0

    @classmethod
    def all(cls) -> Ranks:
        size = world_size()
        return cls(size, torch.distributed.get_rank() if size > 1 else 0)

    @classmethod
    def alone(cls) -> Ranks:
        return cls()

    @property
    def device(self) -> torch.device:
        """Where collective tensors live: NCCL moves only CUDA tensors."""
        if torch.distributed.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def from_rank_zero(self, values: list[int]) -> list[int]:
        """Rank 0's ``values`` on every rank."""
        if self.size == 1:
            return list(values)
        shared = torch.tensor(values, dtype=torch.long, device=self.device)
        torch.distributed.broadcast(shared, src=0)
        return shared.tolist()

    def agree_max(self, values: list[int]) -> list[int]:
        """The element-wise largest of every rank's ``values``."""
        if self.size == 1:
            return list(values)
        shared = torch.tensor(values, dtype=torch.long, device=self.device)
        torch.distributed.all_reduce(shared, op=torch.distributed.ReduceOp.MAX)
        return shared.tolist()

    def agree_min(self, values: list[int]) -> list[int]:
        """The element-wise smallest of every rank's ``values``."""
        return [-v for v in self.agree_max([-v for v in values])]

    def gather(self, values: list[int]) -> list[list[int]]:
        """Every rank's ``values`` (the same length on each), in rank order."""
        if self.size == 1:
            return [list(values)]
        local = torch.tensor(values, dtype=torch.long, device=self.device)
        parts = [torch.empty_like(local) for _ in range(self.size)]
        torch.distributed.all_gather(parts, local)
        return [p.tolist() for p in parts]

    def sum(self, values: np.ndarray) -> np.ndarray:
        """The sum of every rank's float64 array (each fills its own entries): bit for bit the same everywhere."""
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
        """Every rank's JSON-able ``value``, in rank order.

        Example:
            >>> Ranks.alone().gather_json({"3": "Paris"})
            [{'3': 'Paris'}]
        """
        if self.size == 1:
            return [value]
        data = _encode(value)
        sizes = [s[0] for s in self.gather([len(data)])]
        local = torch.zeros(max(sizes), dtype=torch.uint8, device=self.device)
        local[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)  # JSON is never empty
        parts = [torch.empty_like(local) for _ in range(self.size)]
        torch.distributed.all_gather(parts, local)
        return [json.loads(p[:n].cpu().numpy().tobytes()) for p, n in zip(parts, sizes)]

    def share_from_rank_zero(self, make: Callable[[], Any]) -> Any:
        """``make()`` run on rank 0, its JSON-able result on every rank; if it raises, every rank raises.

        Example:
            >>> Ranks.alone().share_from_rank_zero(lambda: {"decision": "reuse"})
            {'decision': 'reuse'}
        """
        if self.size == 1:
            return make()
        error: Exception | None = None
        payload = b""
        if self.index == 0:
            try:
                payload = _encode({"ok": make()})
            except Exception as err:  # noqa: BLE001 - raised again below, once the others know
                error = err
                payload = _encode({"error": f"{type(err).__name__}: {err}"})
        size = self.from_rank_zero([len(payload)])[0]
        buffer = torch.zeros(size, dtype=torch.uint8, device=self.device)
        if self.index == 0:
            buffer.copy_(torch.frombuffer(bytearray(payload), dtype=torch.uint8))
        torch.distributed.broadcast(buffer, src=0)
        if error is not None:
            raise error
        message = json.loads(buffer.cpu().numpy().tobytes())
        if "error" in message:
            raise RuntimeError(f"forgetwatch failed on rank 0: {message['error']}")
        return message["ok"]

    def my_share(self, costs: Sequence[float]) -> list[int]:
        """The indices of the items this rank handles (see :func:`shard`)."""
        return shard(costs, self.size)[self.index] if self.size > 1 else list(range(len(costs)))


def from_rank_zero(values: list[int]) -> list[int]:
    """Rank 0's ``values`` on every rank of the default group (unchanged in one process)."""
    return Ranks.all().from_rank_zero(values)


def _encode(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")


def shard(costs: Sequence[float], n_shards: int) -> list[list[int]]:
    """Split item indices into ``n_shards`` lists of about equal cost, the same on every rank.

    Example:
        >>> shard([5, 1, 4, 2], 2)
        [[0, 1], [2, 3]]
    """
    loads = [0.0] * n_shards
    shards: list[list[int]] = [[] for _ in range(n_shards)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        target = min(range(n_shards), key=lambda s: (loads[s], len(shards[s]), s))
        shards[target].append(i)
        loads[target] += costs[i]
    return [sorted(s) for s in shards]
