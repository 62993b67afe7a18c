"""Greedy decoding for generative probes: left-padded batches, stop strings, EOS."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

from .borrow import forward_module, is_fsdp1, unwrap


def stop_token_ids(model, tokenizer) -> list[int]:
    """EOS ids from the model's generation config (some models have several) and the tokenizer."""
    ids: list[int] = []
    gen_eos = getattr(getattr(unwrap(model), "generation_config", None), "eos_token_id", None)
    for x in (gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos]) + [tokenizer.eos_token_id]:
        if x is not None and x not in ids:
            ids.append(int(x))
    return ids


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """The text before the first occurrence of any stop string."""
    cut = len(text)
    for s in stop:
        i = text.find(s)
        if i != -1:
            cut = min(cut, i)
    return text[:cut]


def generate_texts(model, tokenizer, prompts: Sequence[Sequence[int]], *, device: torch.device,
                   pad_id: int, max_new_tokens: int, stop: Sequence[str], synced_gpus: bool = False) -> list[str]:
    """Greedy continuations of one batch of prompts, each cut at the first stop string.

    Decoding is plain greedy whatever the model's own generation config says: transformers
    fills every option a call leaves unset from ``model.generation_config`` (a repetition
    penalty, a minimum length, suppressed tokens, ...), so a clean config stands in for it
    during the call. Otherwise two checkpoints with different configs would be decoded
    differently and their answers would not be comparable.

    ``synced_gpus``: keep stepping until every rank's batch is done, as a sharded model
    (FSDP, ZeRO-3) needs: each step's forward gathers parameters from all ranks.
    """
    from transformers import GenerationConfig

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p):] = 1
    greedy = GenerationConfig(
        do_sample=False, num_beams=1, max_new_tokens=max_new_tokens, pad_token_id=pad_id,
        eos_token_id=stop_token_ids(model, tokenizer), stop_strings=list(stop) or None,
    )
    owner = _generation_config_owner(model)
    saved = owner.generation_config
    owner.generation_config = greedy
    try:
        with generator(model) as module:
            out = module.generate(
                input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=greedy,
                tokenizer=tokenizer, synced_gpus=synced_gpus,
            )
    finally:
        owner.generation_config = saved
    texts = tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    return [cut_at_stop(t, stop) for t in texts]


@contextlib.contextmanager
def generator(model) -> Iterator[torch.nn.Module]:
    """The module whose ``generate`` to call, ready for the call.

    Under DDP, which has no ``generate``: the model inside. Under FSDP1: the model inside
    too, with the root module's own parameters (embeddings, final norm) gathered read-only,
    since the wrapper gathers them only in its forward, which ``generate`` bypasses (the
    wrapped layers still gather their own). Otherwise the model itself: FSDP2 and DeepSpeed
    gather parameters in each submodule's forward.
    """
    inner = forward_module(model)
    if is_fsdp1(inner):
        with inner.summon_full_params(inner, writeback=False, recurse=False):
            yield inner.module
    else:
        yield inner if hasattr(inner, "generate") else unwrap(model)


def _generation_config_owner(model):
    """The model whose ``generation_config`` ``generate`` reads (under PEFT: the base model)."""
    inner = unwrap(model)
    return inner.get_base_model() if hasattr(inner, "get_base_model") else inner
