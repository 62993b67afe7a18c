"""Length-sorted batches under a row count or a token budget, kept apart from model code."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import torch

T = TypeVar("T")

BatchSize = int | str  # an int, or "auto"


def check_batch_size(batch_size: BatchSize) -> None:
    if batch_size == "auto":
        return
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int or 'auto', got {batch_size!r}")


def group(widths: Sequence[int], max_rows: int | None, max_tokens: int | None) -> list[list[int]]:
    """Split items, longest first, into batches of at most ``max_rows`` rows and
    ``max_tokens`` padded tokens (rows x the batch's widest row).

    Example:
        >>> group([3, 9, 5], max_rows=2, max_tokens=None)
        [[1, 2], [0]]
    """
    order = sorted(range(len(widths)), key=lambda i: -widths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        # longest first, so the first row's width is the batch's padded width
        full = current and (
            (max_rows is not None and len(current) >= max_rows)
            or (max_tokens is not None and (len(current) + 1) * widths[current[0]] > max_tokens)
        )
        if full:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def default_token_budget(device: torch.device, hidden_size: int, vocab_size: int) -> int:
    """A first guess of tokens per forward; halved on out-of-memory."""
    if device.type != "cuda":
        return 8192
    free, _ = torch.cuda.mem_get_info(device)
    # activations of one layer plus fp32 logits, per token, with room for the rest
    per_token = 4 * (16 * hidden_size + vocab_size)
    return int(max(256, min(free * 0.25 // per_token, 1 << 17)))


def is_out_of_memory(err: BaseException) -> bool:
    return isinstance(err, torch.cuda.OutOfMemoryError) or "out of memory" in str(err).lower()


def run_halving(fn: Callable[[list[T]], Any], items: list[T],
                on_out_of_memory: Callable[[int], int]) -> Iterator[tuple[list[T], Any]]:
    """Yield ``(chunk, fn(chunk))`` over ``items``, whole if it fits in memory.

    On out-of-memory, ``on_out_of_memory(len(items))`` returns how many items to try at once
    (smaller than before); ``items`` are split into chunks of that size, each retried the
    same way.

    Example:
        >>> list(run_halving(sum, [1, 2, 3], lambda n: n // 2))
        [([1, 2, 3], 6)]
    """
    try:
        result = fn(items)
    except (torch.cuda.OutOfMemoryError, RuntimeError) as err:
        if not is_out_of_memory(err) or len(items) == 1:
            raise
        result = _FAILED
    if result is _FAILED:
        # retry outside the except block: its traceback would keep the failed attempt's
        # activations alive, and then no retry could fit either
        gc.collect()
        size = [max(1, min(on_out_of_memory(len(items)), len(items) - 1))]

        def shrink(n: int) -> int:  # a failure inside a chunk shrinks the chunks after it too
            size[0] = max(1, min(on_out_of_memory(n), size[0]))
            return size[0]

        start = 0
        while start < len(items):
            chunk = items[start:start + size[0]]
            yield from run_halving(fn, chunk, shrink)
            start += len(chunk)
        return
    yield items, result


_FAILED = object()
