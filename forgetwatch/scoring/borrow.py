"""Borrow a model for evaluation and hand it back exactly as found."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    while isinstance(getattr(model, "module", None), torch.nn.Module):
        model = model.module
    return model


def forward_module(model: torch.nn.Module) -> torch.nn.Module:
    """The module to run forwards on: through FSDP and DeepSpeed, not through DDP (whose forward starts
    collectives that hang when ranks evaluate unevenly)."""
    while isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
        model = model.module
    return model


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model``'s parameters are sharded across ranks (FSDP, DeepSpeed ZeRO-3)."""
    fsdp = _fsdp_types("FullyShardedDataParallel", "FSDPModule")
    if fsdp and any(isinstance(m, fsdp) for m in model.modules()):
        return True
    return any(hasattr(p, "ds_id") for p in model.parameters())


def _fsdp_types(*names: str) -> tuple[type, ...]:
    try:
        import torch.distributed.fsdp as fsdp
    except ImportError:
        return ()
    return tuple(t for t in (getattr(fsdp, name, None) for name in names) if t is not None)


@contextlib.contextmanager
def generator(model) -> Iterator[torch.nn.Module]:
    """The module whose ``generate`` to call; under FSDP1 the model inside with the root's own parameters gathered
    (``generate`` bypasses the wrapper's forward)."""
    inner = forward_module(model)
    if isinstance(inner, _fsdp_types("FullyShardedDataParallel")):
        with inner.summon_full_params(inner, writeback=False, recurse=False):
            yield inner.module
    else:
        yield inner if hasattr(inner, "generate") else unwrap(model)


@contextlib.contextmanager
def borrowed(model: torch.nn.Module, tokenizer: Any = None) -> Iterator[torch.nn.Module]:
    """Put ``model`` in eval mode without gradients; restore the training flags, ``use_cache``, the padding
    side and the random states afterwards (``no_grad``, not ``inference_mode``: buffers must stay usable by autograd)."""
    flags = [(m, m.training) for m in model.modules()]
    config = getattr(unwrap(model), "config", None)
    use_cache = getattr(config, "use_cache", None)
    padding_side = getattr(tokenizer, "padding_side", None)
    rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    model.eval()
    try:
        with torch.no_grad():
            yield model
    finally:
        for m, training in flags:
            m.training = training
        if config is not None and use_cache is not None:
            config.use_cache = use_cache
        if tokenizer is not None and padding_side is not None:
            tokenizer.padding_side = padding_side
        random.setstate(rng[0])
        np.random.set_state(rng[1])
        torch.set_rng_state(rng[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
