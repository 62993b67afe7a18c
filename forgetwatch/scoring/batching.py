"""Length-sorted batches under a row count or a token budget, kept apart from model code."""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch

from forgetwatch.common.distributed import Ranks

T = TypeVar("T")
B = TypeVar("B")
R = TypeVar("R")
logger = logging.getLogger(__name__)


def padded(rows: Sequence[Sequence[int]], pad_id: int, left: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` padded to the longest, on the right (positions as in training) or the left: ids and attention mask."""
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, row in enumerate(rows):
        at = slice(width - len(row), width) if left else slice(0, len(row))
        ids[r, at] = torch.tensor(row, dtype=torch.long)
        mask[r, at] = 1
    return ids, mask


def group(widths: Sequence[int], max_rows: int | None, max_tokens: int | None) -> list[list[int]]:
    """Split items, longest first, into batches of at most ``max_rows`` rows and ``max_tokens`` padded tokens."""
    return group_runs(widths, [0] * len(widths), range(len(widths)), max_rows, max_tokens)  # each item a run


def group_runs(
    own: Sequence[int],
    shared: Sequence[int],
    runs: Sequence[Hashable],
    max_rows: int | None,
    max_tokens: int | None,
    per_batch: int | None = None,
) -> list[list[int]]:
    """Batches of items (``own`` tokens after their run's ``shared`` prefix) within the limits, a run's items together,
    longest first; cut where padded tokens plus ``per_batch`` tokens a forward cost least (``None``: when full)."""
    members: dict[Hashable, list[int]] = {}
    for i, run in enumerate(runs):
        members.setdefault(run, []).append(i)
    for idx in members.values():
        idx.sort(key=lambda i: -own[i])
    order = [i for idx in sorted(members.values(), key=lambda idx: -(own[idx[0]] + shared[idx[0]])) for i in idx]
    if per_batch is not None:
        starts = [k == 0 or runs[i] != runs[order[k - 1]] for k, i in enumerate(order)]  # a run's first item
        cuts = _cheapest_cuts(own, shared, starts, order, max_rows, max_tokens, per_batch)
        return [[order[k] for k in cut] for cut in cuts]
    batches: list[list[int]] = []
    current: list[int] = []
    widest = (0, 0)
    for i in order:
        wider = (max(widest[0], own[i]), max(widest[1], shared[i]))
        full = current and (
            (max_rows is not None and len(current) >= max_rows)
            or (max_tokens is not None and (len(current) + 1) * sum(wider) > max_tokens)
        )
        if full:
            batches.append(current)
            current, wider = [], (own[i], shared[i])
        current.append(i)
        widest = wider
    return batches + [current] if current else batches


#: The most rows a batch of ``_cheapest_cuts`` may hold when only tokens are limited.
MAX_ROWS_CUT = 512


def _cheapest_cuts(own, shared, starts, order, max_rows, max_tokens, per_batch) -> list[range]:
    """Ranges of ``order`` within the limits with the fewest padded tokens plus forwards (dynamic programming)."""
    n = len(order)
    own_w = np.asarray([own[i] for i in order], dtype=np.int64)
    shared_w = np.asarray([shared[i] for i in order], dtype=np.int64)
    new_prefix = np.asarray([s and shared[i] > 0 for s, i in zip(starts, order)], dtype=np.int64)
    window = max_rows or MAX_ROWS_CUT
    best = np.zeros(n + 1)
    start = np.zeros(n + 1, dtype=np.int64)
    for end in range(1, n + 1):
        lo = max(0, end - window)
        # the batch [i, end) for i = end - 1, end - 2, ..., lo: its rows and its padded width
        rows = np.arange(1, end - lo + 1)
        width = np.maximum.accumulate(own_w[lo:end][::-1]) + np.maximum.accumulate(shared_w[lo:end][::-1])
        forwards = 1 + np.maximum.accumulate(new_prefix[lo:end][::-1])
        cost = best[lo:end][::-1] + rows * width + per_batch * forwards
        if max_tokens is not None:
            cost[1:][rows[1:] * width[1:] > max_tokens] = np.inf  # one row always fits
        k = int(np.argmin(cost))
        best[end], start[end] = cost[k], end - 1 - k
    cuts = []
    end = n
    while end:
        cuts.append(range(int(start[end]), end))
        end = int(start[end])
    return cuts[::-1]


def forward_cost(device: torch.device) -> int:
    """What one more forward costs, in padded tokens (measured on CPUs: 41-87; modelled on accelerators)."""
    return 64 if device.type == "cpu" else 1024


def default_token_budget(device: torch.device, config) -> int:
    """Tokens per forward for ``batch_size="auto"``: on CUDA a quarter of the free memory, within training's peak."""
    if device.type != "cuda":
        return 8192
    free, _ = torch.cuda.mem_get_info(device)
    held = torch.cuda.memory_allocated(device)
    room = 0.25 * (free + torch.cuda.memory_reserved(device) - held)
    peak = torch.cuda.max_memory_allocated(device)
    if peak > 1.5 * held:  # something (training steps) needed far more than is held now
        room = min(room, 1.1 * peak - held)
    # per token: fp32 logits, and a few activations of one layer (no gradients are kept)
    per_token = 4 * (16 * getattr(config, "hidden_size", 1024) + getattr(config, "vocab_size", 32000))
    tokens = int(max(256, min(room // per_token, 1 << 17)))
    return 1 << (tokens.bit_length() - 1)  # a power of two: planned batches stay cached


def is_out_of_memory(err: BaseException) -> bool:
    return isinstance(err, torch.cuda.OutOfMemoryError) or "out of memory" in str(err).lower()


@dataclass
class Caps:
    """The most rows and tokens per forward since running out of memory (``None``: as asked)."""

    row_cap: int | None = None
    token_cap: int | None = None

    def limits(self, rows: int | None, tokens: int | None = None) -> tuple[int | None, int | None]:
        """``rows`` and ``tokens`` per forward (``None``: no limit) within the caps."""
        rows = min(filter(None, (rows, self.row_cap)), default=None)
        return rows, min(filter(None, (tokens, self.token_cap)), default=None)

    def halve(self, rows: int, tokens: int | None = None) -> None:
        """After ``rows`` (and ``tokens``, when limited) did not fit; every rank calls it alike."""
        torch.cuda.empty_cache()
        self.row_cap = max(1, min(rows, self.row_cap or rows) // 2)
        if tokens is not None:
            self.token_cap = max(1, tokens // 2)
        logger.warning("forgetwatch: out of memory with %d sequences per batch; retrying with %d", rows, self.row_cap)


def run_lockstep(
    batches: list[B],
    run: Callable[[B], R],
    *,
    replan: Callable[[list[T]], list[B]],
    items_of: Callable[[B], list[T]],
    filler: B,
    on_out_of_memory: Callable[[int], None],
    ranks: Ranks,
) -> Iterator[tuple[B, R]]:
    """``(batch, run(batch))`` for this rank's ``batches``, ``filler`` evening the calls; after running out of memory
    on any rank, every rank calls ``on_out_of_memory(rows)`` and replans what is left."""
    pending = list(batches)
    while True:
        total = ranks.agree_max([len(pending)])[0]
        for k in range(total):
            batch = pending[k] if k < len(pending) else None
            failed = 0
            try:
                result = run(filler if batch is None else batch)
            except (torch.cuda.OutOfMemoryError, RuntimeError) as err:
                if not is_out_of_memory(err):
                    raise
                failed = len(items_of(filler if batch is None else batch))
            # retried outside the except block, whose traceback would keep the failed attempt's activations alive
            failed = ranks.agree_max([failed])[0]
            if failed:
                gc.collect()
                if failed == 1:
                    raise torch.cuda.OutOfMemoryError(
                        "forgetwatch ran out of memory scoring a single sequence; evaluate with fewer "
                        "max_new_tokens or shorter probes, or leave more memory free"
                    )
                on_out_of_memory(failed)
                pending = replan([x for b in pending[k:] for x in items_of(b)])
                break
            if batch is not None:
                yield batch, result
        else:
            return
