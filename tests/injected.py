"""A model wrapper that runs out of memory on demand (for the scorer's back-off tests)."""

from __future__ import annotations

import torch


class OutOfMemoryAbove(torch.nn.Module):
    """Raises CUDA's out-of-memory error for batches of more than ``limit`` rows."""

    def __init__(self, model, limit):
        super().__init__()
        self.module, self.limit, self.sizes = model, limit, []

    def forward(self, **kwargs):
        rows = kwargs["input_ids"].shape[0]
        self.sizes.append(rows)
        if rows > self.limit:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
        return self.module(**kwargs)


class BatchShapeNoise(torch.nn.Module):
    """Perturbs the logits by an amount that depends on the batch's shape, as half-precision
    kernels on a GPU do: the same weights, other batches, slightly other numbers."""

    def __init__(self, model, scale):
        super().__init__()
        self.module, self.scale = model, scale

    def forward(self, **kwargs):
        out = self.module(**kwargs)
        rows, width = kwargs["input_ids"].shape
        generator = torch.Generator().manual_seed(rows * 1000 + width)
        noise = torch.randn(out.logits.shape[-1], generator=generator) * self.scale
        out.logits = out.logits + noise.to(out.logits.dtype)
        return out
