"""Shared prompt prefixes, computed once: a few-shot block, a task description or a long system
prompt that many probes start with goes through the model once per evaluation, and every probe
behind it reads its keys and values from the cache instead of computing them again.

A probe behind a prefix of ``P`` tokens is its own tokens at positions ``P`` onwards, attending
to the cached prefix and to itself: the same positions and the same visible tokens as the
whole sequence, so the same answers (on models that can be packed: attention is the only way
tokens see each other, steered by the mask and the position ids).
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Sequence

import torch

#: A prefix shorter than this is not worth a forward of its own.
MIN_PREFIX_TOKENS = 16


def shared_prefix_lengths(sequences: Sequence[Sequence[int]], min_tokens: int = MIN_PREFIX_TOKENS) -> list[int]:
    """For each sequence, how many of its first tokens it shares with others as one prefix
    (0: none), chosen so that the most tokens are computed once. A sequence always keeps at
    least its last token of its own.

    Sorted, sequences that share a prefix are neighbours, and a run of neighbours shares the
    shortest prefix any two adjacent ones share. A run is kept whole, saving its prefix for all
    members but one, or split at its weakest links (where adjacent ones share least) into runs
    that share more, whichever saves more; a prefix of fewer than ``min_tokens`` saves nothing.

    Example:
        >>> shared_prefix_lengths([[1, 2, 3, 4, 9], [1, 2, 3, 4, 8], [5, 6]], min_tokens=3)
        [4, 4, 0]
    """
    order = sorted(range(len(sequences)), key=lambda i: tuple(sequences[i]))
    seqs = [sequences[i] for i in order]
    # what adjacent sequences could share: their common prefix, each keeping its last token
    links = [min(_common_length(a, b), len(a) - 1, len(b) - 1) for a, b in zip(seqs, seqs[1:])]
    lengths = [0] * len(seqs)
    # each run [a, b) is either kept whole or split at its weakest links: decided bottom up
    stack: list[tuple[int, int, bool]] = [(0, len(seqs), False)]
    saved: dict[tuple[int, int], int] = {}
    parts: dict[tuple[int, int], list[tuple[int, int]]] = {}
    while stack:
        a, b, expanded = stack.pop()
        if b - a < 2:
            saved[a, b] = 0
            continue
        weakest = min(links[a : b - 1])
        if not expanded:
            cuts = [k + 1 for k in range(a, b - 1) if links[k] == weakest]
            parts[a, b] = list(zip([a, *cuts], [*cuts, b]))
            stack.append((a, b, True))
            stack.extend((x, y, False) for x, y in parts[a, b])
            continue
        whole = (b - a - 1) * weakest if weakest >= min_tokens else 0
        split = sum(saved[p] for p in parts[a, b])
        saved[a, b] = max(whole, split)
        if whole >= split:
            parts[a, b] = []  # kept whole: one prefix forward, not several
    # hand out the lengths top down
    todo = [(0, len(seqs))]
    while todo:
        a, b = todo.pop()
        if b - a < 2:
            continue
        if parts.get((a, b)):
            todo.extend(parts[a, b])
        else:
            weakest = min(links[a : b - 1])
            if weakest >= min_tokens:
                lengths[a:b] = [weakest] * (b - a)
    out = [0] * len(sequences)
    for pos, i in enumerate(order):
        out[i] = lengths[pos]
    return out


def _common_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for k in range(n):
        if a[k] != b[k]:
            return k
    return n


def cache_argument(model: torch.nn.Module) -> str:
    """The name under which the model's forward takes a KV cache (``cache`` in transformers 5,
    ``past_key_values`` before)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def prefix_cache(
    module: torch.nn.Module, prefix: Sequence[int], device: torch.device, argument: str, keep_arg: str | None
):
    """The KV cache of one prefix (batch of one), from one forward (logits of its last position only)."""
    ids = torch.tensor([list(prefix)], dtype=torch.long, device=device)
    kwargs = {"input_ids": ids, "position_ids": torch.arange(len(prefix), device=device)[None], "use_cache": True}
    if keep_arg is not None:
        kwargs[keep_arg] = 1
    out = module(**kwargs)
    return out[argument] if argument in out else out["past_key_values"]


def repeated(cache, rows: int):
    """A prefix's cache for a batch of ``rows`` sequences, the prefix's own left as it was for the
    next batch (a forward appends to the cache it is given). Each layer's keys and values are
    views of the prefix's, broadcast over the rows: the forward's append is their only copy."""
    out = copy.copy(cache)
    layers = getattr(cache, "layers", None)
    if layers is None or not all(hasattr(layer, "keys") for layer in layers):  # another cache layout
        out = copy.deepcopy(cache)
        out.batch_repeat_interleave(rows)
        return out
    out.layers = []
    for layer in layers:
        view = copy.copy(layer)
        if getattr(layer, "keys", None) is not None and layer.keys.numel():
            view.keys = layer.keys.expand(rows, *layer.keys.shape[1:])
            view.values = layer.values.expand(rows, *layer.values.shape[1:])
        out.layers.append(view)
    return out
