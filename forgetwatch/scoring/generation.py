"""Greedy decoding for generative probes: left-padded batches, stop strings, EOS; and how many
tokens a response may have in the model's context."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import torch

from forgetwatch.common.text import listing
from forgetwatch.scoring.borrow import forward_module, is_fsdp1, unwrap

K = TypeVar("K", bound=Hashable)


class PromptTooLongError(ValueError):
    """A prompt that fills the model's whole context, leaving no room for a response."""


def response_budgets(
    lengths: Mapping[K, int],
    max_length: int,
    max_new_tokens: int,
    setting: str = "max_new_tokens",
    name: Callable[[K], str] = str,
) -> tuple[dict[K, int], str | None]:
    """How many tokens each prompt's response may have, the prompt kept whole: ``max_new_tokens``,
    or what the model's context of ``max_length`` tokens leaves after the prompt. The one rule
    of every generation path.

    Returns the budgets (by the keys of ``lengths``, prompt lengths in tokens) and, when some
    were cut short, a sentence saying so with the numbers (for one warning). A prompt that
    leaves no room at all is refused: :class:`PromptTooLongError` naming it (``name(key)``).
    Cutting the prompt instead would silently change the question: a 7-token prompt cut to
    make room for 256 new tokens in a 128-token context is gone.

    Example:
        >>> response_budgets({"a": 7, "b": 100}, max_length=128, max_new_tokens=64)
        ({'a': 64, 'b': 28}, "the model's context is 128 tokens: 1 of 2 prompt(s) leave less than max_new_tokens=64 for the response, which is cut at what the context leaves (28 tokens)")
    """
    budgets = {k: min(max_new_tokens, max_length - n) for k, n in lengths.items()}
    full = [k for k, b in budgets.items() if b < 1]
    if full:
        # past the context, a prompt may have been read only in part (long questions are cut before tokenizing)
        shown = listing(
            f"{name(k)!r} ({lengths[k] if lengths[k] == max_length else f'more than {max_length}'} tokens)"
            for k in full
        )
        raise PromptTooLongError(
            f"{len(full)} prompt(s) fill the model's whole context of {max_length} tokens, leaving no room for "
            f"a response: {shown}; shorten them or leave those probes out"
        )
    cut = sorted(b for b in budgets.values() if b < max_new_tokens)
    note = None
    if cut:
        span = f"{cut[0]}" if cut[0] == cut[-1] else f"{cut[0]} to {cut[-1]}"
        note = (
            f"the model's context is {max_length} tokens: {len(cut)} of {len(budgets)} prompt(s) leave less "
            f"than {setting}={max_new_tokens} for the response, which is cut at what the context leaves "
            f"({span} tokens)"
        )
    return budgets, note


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


def generate_texts(
    model,
    tokenizer,
    prompts: Sequence[Sequence[int]],
    *,
    device: torch.device,
    pad_id: int,
    max_new_tokens: int,
    stop: Sequence[str],
    synced_gpus: bool = False,
    prefix: Sequence[int] = (),
    cache: tuple[str, Any] | None = None,
) -> list[str]:
    """Greedy continuations of one batch of prompts, each cut at the first stop string.

    ``prefix``: tokens every prompt starts with, left out of ``prompts``, whose KV cache for
    every row is ``cache`` (the forward's argument name, the cache): each row is laid out as
    ``prefix, padding, prompt``, with the padding masked, so that each prompt's tokens have the
    positions they have in the whole prompt.

    Decoding is plain greedy whatever the model's own generation config says: transformers
    fills every option a call leaves unset from ``model.generation_config`` (a repetition
    penalty, a minimum length, suppressed tokens, ...), so a clean config stands in for it
    during the call. Otherwise two checkpoints with different configs would be decoded
    differently and their answers would not be comparable.

    ``synced_gpus``: keep stepping until every rank's batch is done, as a sharded model
    (FSDP, ZeRO-3) needs: each step's forward gathers parameters from all ranks.
    """
    from transformers import GenerationConfig

    start = len(prefix)
    width = start + max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    if start:
        ids[:, :start] = torch.tensor(list(prefix), dtype=torch.long)
        mask[:, :start] = 1
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p) :] = 1
    extra = {cache[0]: cache[1]} if cache is not None else {}
    greedy = GenerationConfig(
        do_sample=False,
        num_beams=1,
        max_new_tokens=max_new_tokens,
        pad_token_id=pad_id,
        eos_token_id=stop_token_ids(model, tokenizer),
        stop_strings=list(stop) or None,
    )
    owner = _generation_config_owner(model)
    saved = owner.generation_config
    owner.generation_config = greedy
    try:
        with generator(model) as module:
            out = module.generate(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                generation_config=greedy,
                tokenizer=tokenizer,
                synced_gpus=synced_gpus,
                **extra,
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
