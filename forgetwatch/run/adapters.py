"""The base model inside a PEFT model: the same network with its adapters switched off.

With LoRA and other additive adapters the base weights are frozen, so disabling the adapters
gives back the model before training exactly, at any step: the base answers can be scored
again when training resumes instead of being kept from step 0.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch

from forgetwatch.scoring.borrow import unwrap

logger = logging.getLogger(__name__)


def peft_model(model: torch.nn.Module):
    """The PEFT model inside any wrapper (DDP, FSDP, DeepSpeed), or ``None``."""
    inner = unwrap(model)
    return inner if hasattr(inner, "disable_adapter") and hasattr(inner, "peft_config") else None


@contextlib.contextmanager
def adapters_disabled(model: torch.nn.Module) -> Iterator[None]:
    """Run the block with the model's PEFT adapters disabled.

    Example:
        >>> with adapters_disabled(model):              # doctest: +SKIP
        ...     base = evaluate(model, tokenizer, probes)
    """
    peft = peft_model(model)
    if peft is None:
        raise ValueError(
            f"base='adapter_disabled' needs a PEFT model (peft.get_peft_model, or peft_config= "
            f"in a TRL trainer), but the model is a {type(unwrap(model)).__name__} without "
            "adapters; leave base unset to snapshot the model before training instead"
        )
    if getattr(peft, "is_prompt_learning", False):
        raise ValueError(
            "base='adapter_disabled' needs additive adapters such as LoRA; prompt-learning "
            "adapters (prefix or prompt tuning) cannot be disabled in place"
        )
    _warn_if_base_weights_train(peft)
    with peft.disable_adapter():
        yield


def _warn_if_base_weights_train(peft) -> None:
    """Disabled adapters give the original model only if nothing else trains."""
    adapters = tuple(f".{name}." for name in peft.peft_config)
    training = [n for n, p in peft.named_parameters() if p.requires_grad and not any(a in n for a in adapters)]
    if training:
        logger.warning(
            "forgetwatch: base='adapter_disabled', but %d parameter(s) outside the adapters are "
            "trained (e.g. %s): with the adapters disabled the model is no longer the one "
            "before training",
            len(training),
            training[0],
        )
