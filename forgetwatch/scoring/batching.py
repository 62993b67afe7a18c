"""Length-sorted batches under a row count or a token budget, kept apart from model code."""

from __future__ import annotations

import gc
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import TypeVar

import torch

from forgetwatch.common.distributed import Ranks

T = TypeVar("T")
B = TypeVar("B")
R = TypeVar("R")


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


def group_runs(
    own: Sequence[int],
    shared: Sequence[int],
    runs: Sequence[Hashable],
    max_rows: int | None,
    max_tokens: int | None,
) -> list[list[int]]:
    """Split items into batches of at most ``max_rows`` rows and ``max_tokens`` padded tokens,
    the items of one run (rows behind one shared prefix) following one another, longest
    first, and runs ordered by their longest item; batches are cut in that order, so a batch
    may hold the end of one run and the start of the next. An item's width is its ``own``
    tokens and its run's ``shared`` ones (read from a cache, attended to): a batch holds rows x
    (its longest ``shared`` + its longest ``own``) padded tokens.

    Example:
        >>> group_runs([3, 9, 5, 2], [0, 0, 4, 4], ["a", "a", "b", "b"], max_rows=3, max_tokens=None)
        [[1, 0, 2], [3]]
    """
    members: dict[Hashable, list[int]] = {}
    for i, run in enumerate(runs):
        members.setdefault(run, []).append(i)
    for idx in members.values():
        idx.sort(key=lambda i: -own[i])
    order = [i for idx in sorted(members.values(), key=lambda idx: -(own[idx[0]] + shared[idx[0]])) for i in idx]
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
    if current:
        batches.append(current)
    return batches


def default_token_budget(device: torch.device, hidden_size: int, vocab_size: int) -> int:
    """A first guess of tokens per forward for ``batch_size="auto"``.

    On CUDA: a quarter of the memory free now (counting what PyTorch caches but does not
    use). Once training has run, the peak it reached bounds the guess too: evaluation may add
    to what is held now (weights, optimizer state) no more than the peak plus a tenth, so it
    never needs more memory than the training steps around it.
    """
    if device.type != "cuda":
        return 8192
    free, _ = torch.cuda.mem_get_info(device)
    held = torch.cuda.memory_allocated(device)
    room = 0.25 * (free + torch.cuda.memory_reserved(device) - held)
    peak = torch.cuda.max_memory_allocated(device)
    if peak > 1.5 * held:  # something (training steps) needed far more than is held now
        room = min(room, 1.1 * peak - held)
    # per token: fp32 logits, and a few activations of one layer (no gradients are kept)
    per_token = 4 * (16 * hidden_size + vocab_size)
    tokens = int(max(256, min(room // per_token, 1 << 17)))
    return 1 << (tokens.bit_length() - 1)  # a power of two: planned batches stay cached


def is_out_of_memory(err: BaseException) -> bool:
    return isinstance(err, torch.cuda.OutOfMemoryError) or "out of memory" in str(err).lower()


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
    """Yield ``(batch, run(batch))`` for this rank's ``batches``, with exactly as many
    ``run`` calls on every rank of ``ranks``.

    A rank with fewer batches runs ``filler`` (its result dropped) until the others are done,
    so forwards that gather sharded parameters never wait for a rank that has stopped. After
    an out-of-memory error on any rank, every rank calls ``on_out_of_memory(rows)`` with the
    same largest failed size (it shrinks the limits that ``replan`` uses) and replans what it
    has left, starting with the batch that failed.

    Example:
        >>> list(run_lockstep([[1, 2], [3]], sum, replan=lambda xs: [xs], items_of=list, filler=[0],
        ...                   on_out_of_memory=print, ranks=Ranks.alone()))
        [([1, 2], 3), ([3], 3)]
    """
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
            # retry outside the except block: its traceback would keep the failed attempt's
            # activations alive, and then no retry could fit either
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
