"""The replay penalty's gradient: replay rows forwarded in micro-batches, ``weight`` times their
mean next-token loss backpropagated onto the gradients already there (the trainer's own),
before the optimizer applies them.

Only one micro-batch's logits live at a time: each micro-batch's share of the mean is
backpropagated at once. Padding never counts. A row learns from its token ``start`` on (its
``starts`` entry; 1, every token but the first, unless given): a synthetic row's prompt is
context, its answer the target. With ``weight == 0`` nothing runs at all, so
the run (its random numbers included) is the run without replay.

Example:
    >>> ids = encode_rows(tokenizer, pool.rows[:8], max_length=256)          # doctest: +SKIP
    >>> loss = replay_backward(model, ids, pad_id=0, weight=0.5, rows_per_batch=4)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from forgetwatch.replay.rows import ReplayRow
from forgetwatch.scoring.batching import group
from forgetwatch.scoring.next_tokens import aligned_targets, kl_to_base, right_padded, target_mask

__all__ = ["encode_rows", "kl_backward", "replay_backward", "target_count"]


def encode_rows(tokenizer: Any, rows: Sequence[ReplayRow], max_length: int, keep: bool = False) -> list[list[int]]:
    """Token ids of each row's text (chats through the chat template), cut to ``max_length``;
    rows shorter than two tokens teach nothing and are dropped (``keep``: kept, one list a row)."""
    texts = [row.render(tokenizer) for row in rows]
    if not texts:  # a tokenizer refuses an empty batch
        return []
    ids = tokenizer(texts, add_special_tokens=True, truncation=True, max_length=max_length)["input_ids"]
    return [list(x) for x in ids if keep or len(x) >= 2]


def target_count(token_ids: Sequence[Sequence[int]], starts: Sequence[int] | None = None) -> int:
    """How many tokens ``token_ids`` predict: each row from its ``starts`` entry on (1 when not given).

    Example:
        >>> target_count([[5, 6, 7], [5, 6, 7, 8]], starts=[1, 3])
        3
    """
    return sum(len(x) - (1 if starts is None else s) for x, s in zip(token_ids, starts or [1] * len(token_ids)))


def _weighted_backward(
    model: torch.nn.Module,
    token_ids: Sequence[Sequence[int]],
    pad_id: int,
    weight: float,
    rows_per_batch: int,
    total: int | None,
    position_loss: Callable[[torch.Tensor, torch.Tensor, list[int]], torch.Tensor],
    starts: Sequence[int] | None = None,
) -> float:
    """Forward ``token_ids`` in micro-batches; backpropagate ``weight`` × the mean over all
    target positions of ``position_loss(logits, ids, rows)`` (rows × positions, fp32); the mean.

    Only one micro-batch's logits live at a time, and padding never counts."""
    if weight == 0 or not token_ids:
        return float("nan")
    device = next(model.parameters()).device
    if total is None:
        total = target_count(token_ids, starts)
    summed = 0.0
    for idx in group([len(x) for x in token_ids], rows_per_batch, None):
        ids, mask = (t.to(device) for t in right_padded([token_ids[i] for i in idx], pad_id))
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        loss = (position_loss(logits, ids, idx) * target_mask(mask, idx, starts)).sum()
        (weight * loss / total).backward()
        summed += float(loss.detach())
        del logits, loss
    return summed / total


def replay_backward(
    model: torch.nn.Module,
    token_ids: Sequence[Sequence[int]],
    pad_id: int,
    weight: float,
    rows_per_batch: int = 8,
    total: int | None = None,
    starts: Sequence[int] | None = None,
) -> float:
    """Add ``weight`` × the gradient of the mean next-token loss over all of ``token_ids``'
    target tokens to the parameters' ``.grad``; return that mean loss (``nan`` when nothing
    ran). ``total``: the tokens the mean is over, when these rows are one rank's share of more;
    ``starts``: each row's first target token (default 1). The model is used as found (train
    mode: dropout as in training)."""

    def nll(logits: torch.Tensor, ids: torch.Tensor, rows: list[int]) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none"
        ).view(ids.shape[0], -1)

    return _weighted_backward(model, token_ids, pad_id, weight, rows_per_batch, total, nll, starts)


def kl_backward(
    model: torch.nn.Module,
    token_ids: Sequence[Sequence[int]],
    targets: Sequence[tuple[Any, Any, Any]],
    pad_id: int,
    weight: float,
    rows_per_batch: int = 8,
    total: int | None = None,
    starts: Sequence[int] | None = None,
) -> float:
    """Like :func:`replay_backward`, for the mean over target positions of KL(base ‖ current):
    each row's ``targets`` are the base's top-k token ids and log-probabilities per target
    position and the log of its mass outside them (:class:`~forgetwatch.scoring.next_tokens.BaseDistribution`);
    the current model's mass outside the same k tokens stands for its tail."""

    def kl(logits: torch.Tensor, ids: torch.Tensor, rows: list[int]) -> torch.Tensor:
        firsts = [0 if starts is None else starts[i] - 1 for i in rows]
        base = aligned_targets([targets[i] for i in rows], firsts, ids.shape[1] - 1, logits.device)
        return kl_to_base(logits, *base)

    return _weighted_backward(model, token_ids, pad_id, weight, rows_per_batch, total, kl, starts)
