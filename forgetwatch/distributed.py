"""Rank agreement: decisions that must be the same on every rank come from rank 0.

Ranks that disagree on whether to evaluate or to stop hang: evaluation forwards of sharded
models gather parameters across ranks, and a stopped rank leaves the others waiting in their
next collective. Each rank's clock and timings differ, so timing-based decisions are taken on
rank 0 and broadcast, at steps every rank reaches alike.
"""

from __future__ import annotations

import torch


def world_size() -> int:
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def from_rank_zero(values: list[int]) -> list[int]:
    """Rank 0's ``values`` on every rank (unchanged in a single process).

    Example:
        >>> from_rank_zero([1, 40])
        [1, 40]
    """
    if world_size() == 1:
        return list(values)
    dist = torch.distributed
    on_gpu = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    shared = torch.tensor(values, dtype=torch.long, device=device)
    dist.broadcast(shared, src=0)
    return shared.tolist()
