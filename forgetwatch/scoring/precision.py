"""The arithmetic answers are computed in: the weights' own dtype by default (autocast off, so answers equal an
offline recount), or the training forward's autocast; what was used is recorded with the answers."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from forgetwatch.scoring.borrow import forward_module


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
    """Run the forwards inside in ``mode``'s precision (``"weights"``: autocast off, accelerate's wrapper set
    aside until the end)."""
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
