"""Borrow a model for evaluation and hand it back exactly as found."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The innermost model under any ``.module`` wrapper: where config and devices are read."""
    while isinstance(getattr(model, "module", None), torch.nn.Module):
        model = model.module
    return model


def forward_module(model: torch.nn.Module) -> torch.nn.Module:
    """The module to run forwards on: through sharding engines (FSDP, DeepSpeed), which gather
    parameters in their forward, but not through DDP, whose forward starts collectives that
    would hang if ranks evaluate unevenly."""
    while isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
        model = model.module
    return model


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model``'s parameters are sharded across ranks and gathered in each forward:
    FSDP (either version) or DeepSpeed ZeRO-3 (whose parameters carry a ``ds_id``)."""
    fsdp_types = tuple(
        t
        for t in (
            _optional("torch.distributed.fsdp", "FullyShardedDataParallel"),
            _optional("torch.distributed.fsdp", "FSDPModule"),
        )
        if t is not None
    )
    if fsdp_types and any(isinstance(m, fsdp_types) for m in model.modules()):
        return True
    return any(hasattr(p, "ds_id") for p in model.parameters())


def is_fsdp1(model: torch.nn.Module) -> bool:
    """Whether ``model`` is an FSDP1 ``FullyShardedDataParallel`` wrapper."""
    wrapper = _optional("torch.distributed.fsdp", "FullyShardedDataParallel")
    return wrapper is not None and isinstance(model, wrapper)


def _optional(module: str, name: str) -> type | None:
    try:
        return getattr(__import__(module, fromlist=[name]), name)
    except (ImportError, AttributeError):
        return None


def capture_rng() -> dict[str, Any]:
    """Every global random state an evaluation could touch."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


@contextlib.contextmanager
def borrowed(model: torch.nn.Module, tokenizer: Any = None) -> Iterator[torch.nn.Module]:
    """Put ``model`` in eval mode without gradients; restore everything afterwards.

    Restored: each module's ``training`` flag (frozen parts may differ from the rest), the
    config's ``use_cache``, the tokenizer's padding side, and the python / numpy / torch /
    CUDA random states. ``no_grad`` rather than ``inference_mode``: buffers a forward may
    update (dynamic RoPE) must stay usable by autograd when training resumes.

    Example:
        >>> with borrowed(model, tokenizer):  # doctest: +SKIP
        ...     logits = model(input_ids).logits
    """
    flags = [(m, m.training) for m in model.modules()]
    config = getattr(unwrap(model), "config", None)
    use_cache = getattr(config, "use_cache", None)
    padding_side = getattr(tokenizer, "padding_side", None)
    rng = capture_rng()
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
        restore_rng(rng)
