"""The base model: keys that say which model a snapshot is of (reused only for it), and a PEFT model's
base as the same network with its adapters off."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
from collections.abc import Iterator
from typing import Any

import torch

from forgetwatch.common.distributed import Ranks
from forgetwatch.scoring.borrow import unwrap

logger = logging.getLogger(__name__)

# config fields that change without the model changing: where it was loaded from, how its weights were stored (a
# GGUF's quantization_config), the dtype it was loaded in, what saving it records, flags trainers toggle, labels
VOLATILE_CONFIG = frozenset(
    "_name_or_path _model_name_or_path _commit_hash quantization_config transformers_version architectures dtype "
    "torch_dtype use_cache id2label label2id problem_type".split()
)


def model_key(model: torch.nn.Module) -> str:
    """What the model is: its architecture, sizes and vocabulary, from its configuration. Token ids (TRL sets
    ``pad_token_id`` from the tokenizer) and generation settings are left out: they change without the model
    changing."""
    config = getattr(unwrap(model), "config", None)
    described = _architecture(config.to_dict()) if hasattr(config, "to_dict") else {}
    text = json.dumps(described, sort_keys=True, default=lambda o: type(o).__name__)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _architecture(described: dict[str, Any]) -> dict[str, Any]:
    """``described`` (a config's dict) without what does not make the model, in nested configs too."""
    return {
        key: _architecture(value) if isinstance(value, dict) else value
        for key, value in described.items()
        if key not in _not_architecture() and not key.endswith(("_token_id", "_token_ids"))
    }


@functools.cache
def _not_architecture() -> frozenset[str]:
    from transformers import GenerationConfig

    return VOLATILE_CONFIG.union(GenerationConfig().to_dict())  # generation settings, as transformers names them


def weights_key(model: torch.nn.Module, ranks: Ranks | None = None) -> str:
    """A cheap signature of the weights: a few strided values of every parameter. Sharded parameters (ZeRO-3's
    ``ds_tensor``, FSDP's ``DTensor``) are hashed per rank and joined (all ranks call it together)."""
    h = hashlib.sha256()
    sharded = False
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            h.update(name.encode())
            local = p.ds_tensor if hasattr(p, "ds_tensor") else p.to_local() if hasattr(p, "to_local") else p
            sharded |= local is not p
            if local.is_meta or not local.numel():
                continue
            flat = local.detach().reshape(-1)
            sample = flat[:: max(1, flat.numel() // 16)][:16].float().cpu()
            h.update(sample.numpy().tobytes())
    digest = h.hexdigest()
    if sharded and ranks is not None and ranks.size > 1:  # each rank saw only its shards
        digest = hashlib.sha256("".join(ranks.gather_json(digest)).encode()).hexdigest()
    return digest[:16]


@contextlib.contextmanager
def adapters_disabled(model: torch.nn.Module) -> Iterator[None]:
    """Run the block with the model's PEFT adapters disabled: with additive adapters such as LoRA the model
    before training, exactly, at any step."""
    peft = unwrap(model)
    if not (hasattr(peft, "disable_adapter") and hasattr(peft, "peft_config")):
        raise ValueError(
            f"base='adapter_disabled' needs a PEFT model (peft.get_peft_model, or peft_config= "
            f"in a TRL trainer), but the model is a {type(peft).__name__} without "
            "adapters; leave base unset to snapshot the model before training instead"
        )
    if getattr(peft, "is_prompt_learning", False):
        raise ValueError(
            "base='adapter_disabled' needs additive adapters such as LoRA; prompt-learning "
            "adapters (prefix or prompt tuning) cannot be disabled in place"
        )
    adapters = tuple(f".{name}." for name in peft.peft_config)
    training = [n for n, p in peft.named_parameters() if p.requires_grad and not any(a in n for a in adapters)]
    if training:  # disabled adapters give the original model only if nothing else trains
        logger.warning(
            "forgetwatch: base='adapter_disabled', but %d parameter(s) outside the adapters are "
            "trained (e.g. %s): with the adapters disabled the model is no longer the one "
            "before training",
            len(training),
            training[0],
        )
    with peft.disable_adapter():
        yield
