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
