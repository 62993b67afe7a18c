"""The arithmetic answers are computed in, chosen and recorded.

A trainer in mixed precision keeps float32 weights but runs every forward under bf16 or fp16
autocast — accelerate puts the autocast inside the model's own ``forward`` — so a monitor that
simply calls the model scores in reduced precision, and its answers differ from an offline
recount of the same weights (on SmolLM2-135M, log-probabilities up to 0.29 nats apart, enough
to flip near-tie answers). forgetwatch therefore scores in the weights' own dtype by default
(``precision="weights"``: autocast off, accelerate's wrapper set aside while it scores), so its
answers equal lm-eval's or ``forgetwatch compare``'s on the same weights; ``precision="autocast"``
scores the way the training forward computes (faster on GPUs, noisier).

What was used is recorded with the answers (``scoring["precision"]``, e.g. ``"float32"`` or
``"bfloat16 autocast, float32 weights"``), so answers computed in another precision are never
compared with them unnoticed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from forgetwatch.scoring.borrow import forward_module


def weight_dtypes(model: torch.nn.Module) -> str:
    """The floating dtypes of ``model``'s parameters, joined by ``+`` (``"float32"``,
    ``"bfloat16+float32"`` for float32 adapters on a bf16 model)."""
    names = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters() if p.is_floating_point()})
    return "+".join(names) or "float32"


def _autocast_wrapped(module: torch.nn.Module) -> bool:
    """Whether accelerate put an autocast inside ``module``'s forward (mixed precision)."""
    return "forward" in vars(module) and "_original_forward" in vars(module)


def _autocast_dtype(module: torch.nn.Module, device: torch.device) -> str | None:
    """The dtype a forward of ``module`` would autocast to now, or ``None``: autocast in effect
    around the call, else accelerate's mixed precision when it wrapped the forward."""
    if torch.is_autocast_enabled(device.type):
        return str(torch.get_autocast_dtype(device.type)).removeprefix("torch.")
    if _autocast_wrapped(module):
        from accelerate.state import AcceleratorState

        state = AcceleratorState._shared_state
        mixed = str(state.get("_mixed_precision", state.get("mixed_precision", "")) or "")
        return {"bf16": "bfloat16", "fp16": "float16"}.get(mixed, mixed or "unknown")
    return None


def compute_precision(model: torch.nn.Module, device: torch.device, mode: str) -> str:
    """What a forward of ``model`` computes in under ``mode`` (a ``precision`` value), as
    recorded with the answers.

    Example:
        >>> compute_precision(torch.nn.Linear(2, 2), torch.device("cpu"), "weights")
        'float32'
    """
    weights = weight_dtypes(model)
    autocast = None if mode == "weights" else _autocast_dtype(forward_module(model), device)
    return weights if autocast is None else f"{autocast} autocast, {weights} weights"


def epsilon(precision: str) -> float:
    """Machine epsilon of the least precise arithmetic named in ``precision`` (a recorded
    value): a trainer in bf16 mixed precision keeps float32 weights but computes in bf16.

    Example:
        >>> epsilon("bfloat16 autocast, float32 weights") == torch.finfo(torch.bfloat16).eps
        True
    """
    named = [getattr(torch, word, None) for word in precision.replace(",", " ").replace("+", " ").split()]
    dtypes = [d for d in named if isinstance(d, torch.dtype) and d.is_floating_point]
    if "unknown" in precision:  # an autocast whose dtype could not be read: assume the coarsest
        dtypes.append(torch.bfloat16)
    return max((torch.finfo(d).eps for d in dtypes), default=torch.finfo(torch.float32).eps)


def is_reduced(precision: str) -> bool:
    """Whether answers computed in ``precision`` (a recorded value) round in half precision.

    Example:
        >>> is_reduced("float32"), is_reduced("bfloat16 autocast, float32 weights")
        (False, True)
    """
    return epsilon(precision) > torch.finfo(torch.float32).eps


@contextlib.contextmanager
def scoring_in(model: torch.nn.Module, device: torch.device, mode: str) -> Iterator[None]:
    """Run the forwards inside in ``mode``'s precision: for ``"weights"``, autocast off and
    accelerate's autocast wrapper set aside (put back on the way out, however it ends);
    ``"autocast"`` changes nothing."""
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
