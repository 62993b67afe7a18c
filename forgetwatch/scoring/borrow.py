"""Borrow a model for evaluation and hand it back exactly as found, computing in the weights' own dtype (autocast
off, so answers equal an offline recount) or the training forward's autocast, as recorded with the answers."""

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
    """Through FSDP and DeepSpeed, not DDP (whose forward starts collectives that hang on uneven ranks)."""
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
    """The module to call ``generate`` on; under FSDP1 the inner one, root parameters gathered (it skips the root)."""
    inner = forward_module(model)
    if isinstance(inner, _fsdp_types("FullyShardedDataParallel")):
        with inner.summon_full_params(inner, writeback=False, recurse=False):
            yield inner.module
    else:
        yield inner if hasattr(inner, "generate") else unwrap(model)


@contextlib.contextmanager
def borrowed(model: torch.nn.Module, tokenizer: Any = None) -> Iterator[torch.nn.Module]:
    """Eval mode under ``no_grad`` (buffers stay usable by autograd); training flags, ``use_cache``, padding side and
    random states restored after."""
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


def _autocast_wrapped(module: torch.nn.Module) -> bool:
    """Whether accelerate put an autocast inside ``module``'s forward."""
    return "forward" in vars(module) and "_original_forward" in vars(module)


def compute_precision(model: torch.nn.Module, device: torch.device, mode: str) -> str:
    """What a forward of ``model`` computes in under ``mode``, as recorded with the answers."""
    names = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters() if p.is_floating_point()})
    weights = "+".join(names) or "float32"
    if mode == "weights":
        return weights
    if torch.is_autocast_enabled(device.type):  # the dtype a forward would autocast to now
        autocast = str(torch.get_autocast_dtype(device.type)).removeprefix("torch.")
    elif _autocast_wrapped(forward_module(model)):
        from accelerate.state import AcceleratorState

        state = AcceleratorState._shared_state
        mixed = str(state.get("_mixed_precision", state.get("mixed_precision", "")) or "")
        autocast = {"bf16": "bfloat16", "fp16": "float16"}.get(mixed, mixed or "unknown")
    else:
        return weights
    return f"{autocast} autocast, {weights} weights"


def epsilon(precision: str) -> float:
    """Machine epsilon of the least precise arithmetic named in a recorded ``precision``."""
    named = [getattr(torch, word, None) for word in precision.replace(",", " ").replace("+", " ").split()]
    dtypes = [d for d in named if isinstance(d, torch.dtype) and d.is_floating_point]
    if "unknown" in precision:  # an autocast whose dtype could not be read: assume the coarsest
        dtypes.append(torch.bfloat16)
    return max((torch.finfo(d).eps for d in dtypes), default=torch.finfo(torch.float32).eps)


def is_reduced(precision: str) -> bool:
    """Whether answers computed in ``precision`` round in half precision."""
    return epsilon(precision) > torch.finfo(torch.float32).eps


@contextlib.contextmanager
def scoring_in(model: torch.nn.Module, device: torch.device, mode: str) -> Iterator[None]:
    """Forwards in ``mode``'s precision (``"weights"``: autocast off, accelerate's wrapper set aside meanwhile)."""
    if mode != "weights":
        yield
        return
    module = forward_module(model)
    wrapped = vars(module).get("forward") if _autocast_wrapped(module) else None
    if wrapped is not None:
        module.forward = vars(module)["_original_forward"]
    try:
        with torch.autocast(device.type, enabled=False):
            yield
    finally:
        if wrapped is not None:
            module.forward = wrapped
