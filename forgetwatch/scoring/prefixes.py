"""Shared prompt prefixes (a few-shot block, a system prompt) go through the model once per evaluation; the
probes behind one read its keys and values from the cache, at the same positions, so with the same answers."""

from __future__ import annotations

import copy
import inspect
import os
from collections.abc import Sequence
from typing import Any

import torch

from forgetwatch.scoring.batching import padded
from forgetwatch.scoring.borrow import forward_module, unwrap

#: A prefix shorter than this is not worth a forward of its own.
MIN_PREFIX_TOKENS = 16


def shared_prefix_lengths(sequences: Sequence[Sequence[int]], min_tokens: int = MIN_PREFIX_TOKENS) -> list[int]:
    """Each sequence's first tokens shared with others as one prefix (0: none; never its last), most tokens saved."""
    order = sorted(range(len(sequences)), key=lambda i: tuple(sequences[i]))
    seqs = [sequences[i] for i in order]
    # what adjacent sequences could share: their common prefix, each keeping its last token
    links = [min(len(os.path.commonprefix([a, b])), len(a) - 1, len(b) - 1) for a, b in zip(seqs, seqs[1:])]
    # each run [a, b) is either kept whole (one prefix) or split at its weakest links: decided bottom up, each run's
    # tokens saved and its (a, b, prefix length) pieces kept
    stack: list[tuple[int, int, bool]] = [(0, len(seqs), False)]
    best: dict[tuple[int, int], tuple[int, list[tuple[int, int, int]]]] = {}
    parts: dict[tuple[int, int], list[tuple[int, int]]] = {}
    while stack:
        a, b, expanded = stack.pop()
        if b - a < 2:
            best[a, b] = (0, [])
            continue
        weakest = min(links[a : b - 1])
        if not expanded:
            cuts = [k + 1 for k in range(a, b - 1) if links[k] == weakest]
            parts[a, b] = list(zip([a, *cuts], [*cuts, b]))
            stack.append((a, b, True))
            stack.extend((x, y, False) for x, y in parts[a, b])
            continue
        whole, pieces = ((b - a - 1) * weakest, [(a, b, weakest)]) if weakest >= min_tokens else (0, [])
        split = sum(best[p][0] for p in parts[a, b])
        # kept whole on a tie: one prefix forward, not several
        best[a, b] = (whole, pieces) if whole >= split else (split, [x for p in parts[a, b] for x in best[p][1]])
    out = [0] * len(sequences)
    for a, b, length in best[0, len(seqs)][1]:
        for pos in range(a, b):
            out[order[pos]] = length
    return out


class PrefixStore:
    """KV caches of the prefixes batches read, each computed once and kept while read, left-padded per batch."""

    def __init__(self, model: torch.nn.Module, device: torch.device, pad_id: int):
        self.module, self.device, self.pad_id = forward_module(model), device, pad_id
        base = unwrap(model)
        base = base.get_base_model() if hasattr(base, "get_base_model") else base
        params = inspect.signature(base.forward).parameters
        # the names the forward takes a KV cache under, and the count of last positions to keep logits of
        self.argument = "cache" if "cache" in params else "past_key_values"
        self.keep_arg = next((name for name in ("logits_to_keep", "num_logits_to_keep") if name in params), None)
        self.kept: dict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = {}  # per layer: keys, values
        self.template = None  # a cache of the model's own kind, copied for each batch

    def for_rows(self, prefixes: Sequence[tuple[int, ...]]) -> dict[str, Any]:
        """The forward's cache argument: a cache holding each row's prefix, left-padded."""
        wanted = dict.fromkeys(p for p in prefixes if p)
        self.kept = {p: kv for p, kv in self.kept.items() if p in wanted}  # free what no row reads now
        missing = [p for p in wanted if p not in self.kept]
        if missing:
            self._compute(missing)
        return {self.argument: self._assemble(prefixes)}

    def _compute(self, prefixes: list[tuple[int, ...]]) -> None:
        ids, mask = padded(prefixes, self.pad_id, left=True)
        width = ids.shape[1]
        positions = (mask.cumsum(1) - 1).clamp(min=0)
        kwargs = {"input_ids": ids, "attention_mask": mask, "position_ids": positions}
        kwargs = {name: t.to(self.device) for name, t in kwargs.items()} | {"use_cache": True}
        if self.keep_arg is not None:
            kwargs[self.keep_arg] = 1
        out = self.module(**kwargs)
        cache = out[self.argument] if self.argument in out else out["past_key_values"]
        layers = getattr(cache, "layers", None)
        if layers is None or not all(hasattr(layer, "keys") for layer in layers):
            raise TypeError(f"a {type(cache).__name__} holds no keys and values per layer to share")
        self.template = cache
        for i, p in enumerate(prefixes):  # each row's own positions, without the padding
            self.kept[p] = [
                (layer.keys[i : i + 1, :, width - len(p) :], layer.values[i : i + 1, :, width - len(p) :])
                for layer in layers
            ]

    def _assemble(self, prefixes: Sequence[tuple[int, ...]]):
        width, rows = max(map(len, prefixes)), len(prefixes)
        alone = self.kept[prefixes[0]] if len(set(prefixes)) == 1 else None  # one prefix: views of its cache, no copy
        at = {p: [r for r, q in enumerate(prefixes) if q == p] for p in dict.fromkeys(prefixes) if p}
        out = copy.copy(self.template)
        out.layers = []
        for k, layer in enumerate(self.template.layers):
            view = copy.copy(layer)
            for j, name in enumerate(("keys", "values")):
                if alone is not None:
                    setattr(view, name, alone[k][j].expand(rows, *alone[k][j].shape[1:]))
                    continue
                some = next(iter(self.kept.values()))[k][j]
                whole = some.new_zeros(rows, some.shape[1], width, some.shape[3])
                for p, where in at.items():
                    whole[where, :, width - len(p) :] = self.kept[p][k][j]
                setattr(view, name, whole)
            out.layers.append(view)
        return out


def prefix_lengths_mask(lengths: Sequence[int], width: int) -> torch.Tensor:
    """Which of ``width`` cached prefix positions each row attends to: its own last ``lengths[row]``."""
    return torch.arange(width)[None, :] >= width - torch.tensor(list(lengths))[:, None]
