"""What a model is, for a base snapshot to be reused only for it: its configuration's key and its weights' key
(where the snapshot is found: :func:`forgetwatch.results.run_files.stored_base`)."""

from __future__ import annotations

import hashlib
import json

import torch

from forgetwatch.common.distributed import Ranks

# config fields that change without the model changing: where it was loaded from (a GGUF's
# general.name included), how its weights were stored (a GGUF file's quantization_config: its
# converted checkpoint is the same model), the dtype it was loaded in, what saving it records
# (library version, class name), flags trainers toggle
VOLATILE_CONFIG = (
    "_name_or_path",
    "_model_name_or_path",
    "_commit_hash",
    "quantization_config",
    "transformers_version",
    "architectures",
    "dtype",
    "torch_dtype",
    "use_cache",
)


def model_key(model: torch.nn.Module) -> str:
    """What the model is: its architecture and configuration (the same after training steps)."""
    from forgetwatch.scoring.borrow import unwrap

    config = getattr(unwrap(model), "config", None)
    described = config.to_dict() if hasattr(config, "to_dict") else {}
    for volatile in VOLATILE_CONFIG:
        described.pop(volatile, None)
    text = json.dumps(described, sort_keys=True, default=lambda o: type(o).__name__)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _held_here(p: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """The values of ``p`` this process holds, and whether they are only its shard: DeepSpeed
    ZeRO-3 keeps a partition in ``ds_tensor`` (the parameter itself is an empty placeholder),
    FSDP a ``DTensor`` shard."""
    if hasattr(p, "ds_tensor"):
        return p.ds_tensor, True
    if hasattr(p, "to_local"):
        return p.to_local(), True
    return p, False


def weights_key(model: torch.nn.Module, ranks: Ranks | None = None) -> str:
    """A cheap signature of the weights: a few strided values of every parameter.

    Catches a snapshot cached for other weights under the same name and configuration (a
    re-trained base saved to the same path) without reading every parameter. When parameters
    are sharded (ZeRO-3, FSDP), each rank hashes its own shards and the key joins every rank's
    part, so it stands for the whole model (and for the same number of ranks: a cache made on
    another world size is recomputed, never wrongly reused). All ranks of ``ranks`` must call
    it together. Meta tensors count by name only.

    Example:
        >>> weights_key(torch.nn.Linear(2, 2)) != weights_key(torch.nn.Linear(2, 2))
        True
    """
    h = hashlib.sha256()
    sharded = False
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            h.update(name.encode())
            local, is_shard = _held_here(p)
            sharded |= is_shard
            if local.is_meta or not local.numel():
                continue
            flat = local.detach().reshape(-1)
            sample = flat[:: max(1, flat.numel() // 16)][:16].float().cpu()
            h.update(sample.numpy().tobytes())
    digest = h.hexdigest()
    ranks = ranks or Ranks.alone()
    if sharded and ranks.size > 1:  # each rank saw only its shards
        digest = hashlib.sha256("".join(ranks.gather_json(digest)).encode()).hexdigest()
    return digest[:16]
