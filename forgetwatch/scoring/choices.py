"""Multiple-choice log-likelihoods, each context through the model once: a *packed* row holds a context and every
choice behind a block mask; a *plain* row is lm-eval's (context, choice) layout, for what cannot be packed."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from forgetwatch.scoring.encoding import EncodedChoices
from forgetwatch.scoring.prefixes import prefix_lengths_mask

PAD_SEG = -2  # padding
CONTEXT_SEG = -1  # shared context (and everything in a plain row)


@dataclass
class Row:
    tokens: np.ndarray  # input ids
    segments: np.ndarray  # PAD_SEG / CONTEXT_SEG / choice index
    positions: np.ndarray  # position ids
    scored: np.ndarray  # row positions whose next-token log-prob is read
    targets: np.ndarray  # the token read at each scored position
    keys: np.ndarray  # flat (probe, choice) index each read adds to
    packed: bool
    prefix: tuple[int, ...] = ()  # the shared prefix before the row, read from a KV cache

    def __len__(self) -> int:
        return len(self.tokens)


def packed_row(enc: EncodedChoices, first_key: int, skip: int = 0) -> Row:
    """One probe's packed row; its first ``skip`` context tokens are a shared prefix read from a cache."""
    ctx = np.asarray(enc.context[skip:], dtype=np.int64)
    c = len(ctx)
    tokens, segments, positions = [ctx], [np.full(c, CONTEXT_SEG)], [np.arange(skip, skip + c)]
    scored, targets, keys = [], [], []
    start = c
    for j, cont in enumerate(enc.continuations):
        cont = np.asarray(cont, dtype=np.int64)
        n = len(cont) - 1  # the last token is only ever a target
        tokens.append(cont[:-1])
        segments.append(np.full(n, j))
        positions.append(np.arange(skip + c, skip + c + n))
        scored.append(np.concatenate([[c - 1], np.arange(start, start + n)]))
        targets.append(cont)
        keys.append(np.full(len(cont), first_key + j))
        start += n
    arrays = map(np.concatenate, (tokens, segments, positions, scored, targets, keys))
    return Row(*arrays, packed=True, prefix=tuple(enc.context[:skip]))


def plain_rows(enc: EncodedChoices, first_key: int, max_length: int) -> list[Row]:
    rows = []
    for j, cont in enumerate(enc.continuations):
        if len(cont) > max_length:
            raise ValueError(f"a choice of {len(cont)} tokens exceeds the model's length {max_length}")
        full = np.asarray(enc.context + cont, dtype=np.int64)
        inp = full[-(max_length + 1) :][:-1]
        n = len(inp)
        scored, targets = np.arange(n - len(cont), n), np.asarray(cont, dtype=np.int64)
        rows.append(
            Row(inp, np.full(n, CONTEXT_SEG), np.arange(n), scored, targets, np.full(len(cont), first_key + j), False)
        )
    return rows


def needs_truncation(enc: EncodedChoices, max_length: int) -> bool:
    return any(len(enc.context) + len(c) > max_length + 1 for c in enc.continuations)


@dataclass
class Batch:
    """Left-padded rows on the CPU, ready to move to the model's device."""

    input_ids: torch.Tensor
    segments: torch.Tensor
    position_ids: torch.Tensor
    row_index: torch.Tensor  # per read: batch row
    keep_index: torch.Tensor  # per read: index into the kept positions
    targets: torch.Tensor
    keep: int
    keys: np.ndarray
    packed: bool
    rows: list[Row]

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def prefixes(self) -> list[tuple[int, ...]]:
        """Each row's prefix, read from a KV cache (``()``: none)."""
        return [r.prefix for r in self.rows]


def collate(rows: list[Row], pad_id: int) -> Batch:
    """Pad rows into one batch: packed rows on the left, plain rows on the right (as lm-eval)."""
    width = max(len(r) for r in rows)
    packed = rows[0].packed
    offsets = [width - len(r) if packed else 0 for r in rows]
    # logits are needed from the earliest scored position of any row to the end
    keep = max(width - off - int(r.scored.min()) for r, off in zip(rows, offsets))
    ids, seg, pos = (np.full((len(rows), width), fill, dtype=np.int64) for fill in (pad_id, PAD_SEG, 0))
    row_index, keep_index = [], []
    for i, (r, off) in enumerate(zip(rows, offsets)):
        at = slice(off, off + len(r))
        ids[i, at], seg[i, at], pos[i, at] = r.tokens, r.segments, r.positions
        row_index.append(np.full(len(r.scored), i))
        keep_index.append(off + r.scored - (width - keep))
    arrays = (ids, seg, pos, *(np.concatenate(a) for a in (row_index, keep_index, [r.targets for r in rows])))
    return Batch(*map(torch.from_numpy, arrays), keep, np.concatenate([r.keys for r in rows]), packed, rows)


def forward_logprobs(
    model,
    batch: Batch,
    device: torch.device,
    additive_mask: bool,
    keep_arg: str | None,
    cache: dict[str, object] | None = None,
) -> np.ndarray:
    """Log-probability of every read target (fp32 log-softmax), in ``batch.keys`` order; ``cache``: rows' prefixes."""
    seg, ids, pos = (t.to(device, non_blocking=True) for t in (batch.segments, batch.input_ids, batch.position_ids))
    kwargs = {"input_ids": ids, "position_ids": pos, "use_cache": cache is not None, **(cache or {})}
    if batch.packed:
        # 4D: causal, no padding, a choice sees only the context and itself, every row its own cached prefix
        b, width = seg.shape
        q, k = seg[:, :, None], seg[:, None, :]
        causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
        allowed = causal & (k != PAD_SEG) & ((k == CONTEXT_SEG) | (k == q))
        allowed |= torch.eye(width, dtype=torch.bool, device=device)  # a padding query sees itself: no empty softmax
        if cache is not None:
            lengths = [len(p) for p in batch.prefixes]
            prefix = prefix_lengths_mask(lengths, max(lengths)).to(device)
            allowed = torch.cat([prefix[:, None, :].expand(b, width, prefix.shape[1]), allowed], dim=-1)
        mask = allowed
        if additive_mask:  # eager attention adds a float32 mask
            mask = torch.zeros(allowed.shape, dtype=torch.float32, device=device)
            mask.masked_fill_(~allowed, torch.finfo(torch.float32).min)
        kwargs["attention_mask"] = mask[:, None]
    else:
        kwargs["attention_mask"] = (seg != PAD_SEG).long()
    if keep_arg is not None:
        kwargs[keep_arg] = batch.keep
    logits = model(**kwargs).logits[:, -batch.keep :].float()
    # a model split across devices returns logits on its last device
    r, k = batch.row_index.to(logits.device), batch.keep_index.to(logits.device)
    picked = logits[r, k, batch.targets.to(logits.device)] - torch.logsumexp(logits, dim=-1)[r, k]
    return picked.double().cpu().numpy()
