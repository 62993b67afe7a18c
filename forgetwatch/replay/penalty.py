"""The replay gradient: ``weight`` times the rows' mean loss, backpropagated one micro-batch at a time."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from forgetwatch.replay.rows import ReplayRow
from forgetwatch.scoring.batching import group, padded
from forgetwatch.scoring.next_tokens import aligned_targets, kl_to_base, target_mask


def encode_rows(tokenizer: Any, rows: Sequence[ReplayRow], max_length: int) -> list[list[int]]:
    """Token ids of each row's text (chats through the chat template), cut to ``max_length``."""
    if not rows:  # a tokenizer refuses an empty batch
        return []
    texts = [row.render(tokenizer) for row in rows]
    return list(
        map(list, tokenizer(texts, add_special_tokens=True, truncation=True, max_length=max_length)["input_ids"])
    )


def target_count(token_ids: Sequence[Sequence[int]], starts: Sequence[int] | None = None) -> int:
    """How many tokens ``token_ids`` predict: each row from its ``starts`` entry on (1 when not given)."""
    return sum(len(x) - s for x, s in zip(token_ids, starts or [1] * len(token_ids)))


def replay_backward(
    model: torch.nn.Module,
    token_ids: Sequence[Sequence[int]],
    pad_id: int,
    weight: float,
    rows_per_batch: int = 8,
    total: int | None = None,
    starts: Sequence[int] | None = None,
    targets: Sequence[tuple[Any, Any, Any]] | None = None,
) -> float:
    """Add ``weight`` × the gradient of the mean loss (next-token, or KL(base ‖ current) to ``targets``) over the rows'
    target tokens (from ``starts``; ``total`` over every rank) to ``.grad``; the mean, ``nan`` if nothing ran."""
    if weight == 0 or not token_ids:
        return float("nan")
    device = next(model.parameters()).device
    if total is None:
        total = target_count(token_ids, starts)
    summed = 0.0
    for idx in group([len(x) for x in token_ids], rows_per_batch, None):
        ids, mask = (t.to(device) for t in padded([token_ids[i] for i in idx], pad_id))
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        if targets is None:
            flat = logits.reshape(-1, logits.shape[-1])
            loss = torch.nn.functional.cross_entropy(flat, ids[:, 1:].reshape(-1), reduction="none").view(len(idx), -1)
        else:
            firsts = [0 if starts is None else starts[i] - 1 for i in idx]
            loss = kl_to_base(
                logits, *aligned_targets([targets[i] for i in idx], firsts, ids.shape[1] - 1, logits.device)
            )
        loss = (loss * target_mask(mask, idx, starts)).sum()
        (weight * loss / total).backward()
        summed += float(loss.detach())
        del logits, loss
    return summed / total
