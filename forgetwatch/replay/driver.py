"""Replay during a run: before each optimizer step, a batch of pool rows chosen by the forgetting
measured at the last evaluation adds its weighted loss gradient to the trainer's.

Where: transformers clips gradients before ``on_pre_optimizer_step``, so the replay gradient
is added there and, when ``max_grad_norm`` is set, the sum is clipped again: the clip sees the
replay gradient too. Every rank draws the same rows (the draws are seeded), replays its share
of them, and the replay gradient is summed over the ranks (an all-reduce, like DDP's for the
trainer's own): the same on every rank, so parameters stay identical. Under fp16's gradient
scaler the replay loss is backpropagated at the scaler's scale (half-precision gradients would
underflow otherwise), then unscaled and weighted; a replay gradient that overflowed is left out
of that step (the trainer's own is not touched). Sharded models (DeepSpeed ZeRO-3, FSDP) are
refused when training begins: their gradients are not plain tensors here.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ..distributed import Ranks
from ..report import TransitionReport
from ..scoring.borrow import is_sharded
from .base_cache import BaseDistribution, base_distribution
from .penalty import encode_rows, kl_backward, replay_backward
from .controller import START, next_weight
from .pool import ReplayPool
from .sampler import ReplaySampler, category_weights

__all__ = ["Replay"]

logger = logging.getLogger("forgetwatch")


class Replay:
    """The replay of one run: which rows, how much, and what it cost so far.

    Args:
        pool: the rows (already checked disjoint from the probes).
        weight: how much the replay loss counts next to the trainer's (0: nothing runs), or
            ``"auto"``: steered toward ``target`` by :func:`~forgetwatch.replay.controller.next_weight`.
        target, metric: with ``"auto"``, the forgetting rate to steer toward, and which one
            (``"forgetting"`` or ``"forgetting_adjusted"``).
        batch_size: rows replayed per optimizer step.
        seed: the draws' seed.
        max_length: tokens kept of a row.
    """

    def __init__(self, pool: ReplayPool, *, weight: float | str = 1.0, batch_size: int = 8, seed: int = 0,
                 max_length: int = 512, target: float | None = None, metric: str = "forgetting",
                 loss: str = "lm", top_k: int = 32):
        self.auto = weight == "auto"
        self.weight = START if self.auto else float(weight)
        self.pool, self.batch_size, self.max_length = pool, batch_size, max_length
        self.target, self.metric, self.loss, self.top_k = target, metric, loss, top_k
        self.encoded: dict[str, list[int]] = {}  # token ids by row id, once (rows too short dropped)
        self.base: BaseDistribution | None = None  # with "kl": the base model's distribution on the rows
        self.sampler = ReplaySampler(pool, seed)
        self.weights = category_weights(None, pool.categories)
        self._loss_sum, self._steps, self._overflows = 0.0, 0, 0

    def start(self, model: torch.nn.Module, args: Any, tokenizer: Any,
              resumed: Mapping[str, Any] | None = None) -> None:
        """Refuse what replay cannot run under (before any training); tokenize the pool once;
        go on from ``resumed`` (a checkpoint's replay state)."""
        if is_sharded(model) or getattr(args, "deepspeed", None) or getattr(args, "fsdp", None):
            raise ValueError("replay does not run on sharded models (DeepSpeed ZeRO, FSDP) yet: train without "
                             "replay=, or under DDP")
        rows = list(self.pool)
        self.encoded = {r.id: ids for r, ids in zip(rows, encode_rows(tokenizer, rows, self.max_length, keep=True))
                        if len(ids) >= 2}
        if resumed:
            self.sampler.load_state_dict(resumed["sampler"])
            self.weight = float(resumed["weight"])

    def cache_base(self, model: torch.nn.Module, tokenizer: Any, pad_id: int, rows_per_batch: int) -> BaseDistribution:
        """With ``"kl"``: the model's (the base's) distribution on every row, kept for the run."""
        ids = list(self.encoded)
        self.base = base_distribution(model, tokenizer, ids, [self.encoded[i] for i in ids], pad_id, self.top_k,
                                      rows_per_batch)
        return self.base

    def fits(self, base: BaseDistribution) -> bool:
        """Whether a stored base distribution was made for these rows, tokenized alike, with this k."""
        return (base.k == self.top_k and base.ids == list(self.encoded)
                and np.diff(base.offsets).tolist() == [len(self.encoded[i]) - 1 for i in base.ids])

    def reweigh(self, report: TransitionReport, steer: bool = True) -> None:
        """Categories weighted by this evaluation's forgetting, for the draws until the next;
        with ``"auto"`` and ``steer``, the weight steered by it too (a resume restores the
        weight instead)."""
        self.weights = category_weights(report, self.pool.categories)
        if self.auto and steer:
            self.weight = next_weight(self.weight, getattr(report, self.metric), self.target)

    def step(self, model: torch.nn.Module, tokenizer: Any, pad_id: int, max_grad_norm: float,
             rows_per_batch: int, ranks: Ranks, scaled: tuple[Any, Any] | None = None) -> None:
        """Add this optimizer step's replay gradient (then clip the sum again, if clipping).
        ``scaled``: the trainer's enabled gradient scaler and the optimizer it steps (fp16)."""
        if self.weight == 0:
            return
        drawn = [r.id for r in self.sampler.next_batch(self.batch_size, self.weights) if r.id in self.encoded]
        if not drawn:  # every row drawn was too short to teach anything (the same on every rank)
            return
        ids = [self.encoded[i] for i in drawn]
        total = sum(len(x) - 1 for x in ids)  # the mean is over every rank's rows
        params = [p for p in model.parameters() if p.requires_grad]
        multiplier = self.weight
        if scaled is not None:
            _unscale(*scaled)  # the trainer's gradient as the optimizer will take it, if not already
            multiplier = float(scaled[0].get_scale())
        kept = None
        if ranks.size > 1 or scaled is not None:  # set the trainer's gradient aside; the replay's alone
            kept = [p.grad for p in params]
            for p in params:
                p.grad = torch.zeros_like(p)
        mine = slice(ranks.index, None, ranks.size)
        if self.loss == "kl":
            targets = [self.base.row(i) for i in drawn[mine]]
            loss = kl_backward(model, ids[mine], targets, pad_id, multiplier, rows_per_batch, total)
        else:
            loss = replay_backward(model, ids[mine], pad_id, multiplier, rows_per_batch, total)
        if ranks.size > 1:  # summed over the ranks, like DDP's for the trainer's own
            summed = torch.tensor([0.0 if math.isnan(loss) else loss * total], dtype=torch.float64,
                                  device=ranks.device)
            ranks.sum_tensors([p.grad for p in params] + [summed])
            loss = float(summed) / total
        if scaled is not None:
            replayed = [p.grad for p in params]
            for g in replayed:
                g.mul_(self.weight / multiplier)
            if not bool(torch.stack([torch.isfinite(g).all() for g in replayed]).all()):
                for p, g in zip(params, kept):  # this step goes on with the trainer's gradient alone
                    p.grad = g
                self._overflow(multiplier)
                return
        if kept is not None:
            for p, g in zip(params, kept):
                if g is not None:
                    p.grad.add_(g)
        if max_grad_norm and max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], max_grad_norm)
        if math.isfinite(loss):
            self._loss_sum += loss
            self._steps += 1

    def _overflow(self, scale: float) -> None:
        self._overflows += 1
        if self._overflows == 1 or self._overflows % 100 == 0:
            logger.warning("forgetwatch: the replay gradient overflowed at fp16's gradient scale %g and was "
                           "left out of this optimizer step (%d step(s) so far); a smaller replay_weight or a "
                           "smaller initial scale avoids it", scale, self._overflows)

    def figures(self) -> dict[str, float]:
        """The mean replay loss since the last call, and the weight (nothing that does not apply)."""
        out = {"replay/weight": float(self.weight)}
        if self._steps:
            out["replay/loss"] = self._loss_sum / self._steps
        self._loss_sum, self._steps = 0.0, 0
        return out

    def state(self) -> dict[str, Any]:
        """What a resumed run needs (kept in the history record)."""
        return {"sampler": self.sampler.state_dict(), "weight": self.weight}


def _unscale(scaler: Any, optimizer: Any) -> None:
    """Unscale the optimizer's gradients now unless already done this step (transformers does it
    when it clips or measures the gradient norm); the scaler then skips it at its step."""
    try:
        scaler.unscale_(optimizer)
    except RuntimeError as err:
        if "already been called" not in str(err):
            raise
