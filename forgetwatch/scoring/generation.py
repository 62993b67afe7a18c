"""Decoding in left-padded batches with stop strings (greedy, or sampled with a seed per response), sharded over ranks
in lockstep, each response within what the model's context leaves."""

from __future__ import annotations

import bisect
import hashlib
import logging
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

import torch

from forgetwatch.common.distributed import Ranks
from forgetwatch.common.text import listing
from forgetwatch.config.settings import Scoring
from forgetwatch.scoring.batching import Caps, group_runs, padded, run_lockstep
from forgetwatch.scoring.borrow import borrowed, generator, is_sharded, unwrap
from forgetwatch.scoring.encoding import model_max_length

K = TypeVar("K", bound=Hashable)

logger = logging.getLogger(__name__)


class Generated(NamedTuple):
    """``text`` cut at the first stop string; ``ids`` (if asked) its tokens before EOS or the fewest covering it."""

    text: str
    ids: tuple[int, ...] | None
    ended: bool


class GenerationPrompt(NamedTuple):
    """A whole prompt's ids, its response budget and stop strings."""

    ids: tuple[int, ...]
    new_tokens: int
    stop: tuple[str, ...] = ()
    skip: int = 0  # first tokens read from a shared prefix's cache
    seed: int | None = None  # the response's seed (None: greedy)


def sample_seed(seed: int, probe_id: str, sample: int) -> int:
    """One response's seed, from the run's seed, probe id and sample number only: the same in any batch, on any rank."""
    digest = hashlib.blake2b(f"{seed}\x1f{probe_id}\x1f{sample}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # torch seeds are below 2**63


def draw_token(logits: torch.Tensor, sampling: Scoring, generator: torch.Generator) -> int:
    """One token drawn from one row's logits (at ``temperature``, within ``top_p``) by the inverse CDF."""
    probs = torch.softmax(logits.detach().to("cpu", torch.float64) / sampling.temperature, dim=-1)
    order = torch.argsort(probs, descending=True, stable=True)
    ranked = probs[order]
    kept = int((torch.cumsum(ranked, 0) < sampling.top_p).sum()) + 1
    cumulative = torch.cumsum(ranked[:kept], 0)
    u = torch.rand((), generator=generator, dtype=torch.float64) * cumulative[-1]
    return int(order[min(int(torch.searchsorted(cumulative, u, right=True)), kept - 1)])


class SeededDraws:
    """Draws each row's next token with the row's own generator, left the only choice for greedy decoding to take."""

    def __init__(self, seeds: Sequence[int], sampling: Scoring):
        self.generators = [torch.Generator().manual_seed(s) for s in seeds]
        self.sampling = sampling

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        chosen = [draw_token(scores[r], self.sampling, g) for r, g in enumerate(self.generators)]
        only = torch.full_like(scores, float("-inf"))
        only[torch.arange(len(chosen)), torch.tensor(chosen, device=scores.device)] = 0.0
        return only


class PromptTooLongError(ValueError):
    """A prompt that fills the model's whole context, leaving no room for a response."""


def response_budgets(
    lengths: Mapping[K, int],
    max_length: int,
    max_new_tokens: int,
    setting: str = "max_new_tokens",
    name: Callable[[K], str] = str,
) -> tuple[dict[K, int], str | None]:
    """Each response's length (within what the context leaves), a warning if some were cut; or a PromptTooLongError."""
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
    if not (cut := sorted(b for b in budgets.values() if b < max_new_tokens)):
        return budgets, None
    span = f"{cut[0]}" if cut[0] == cut[-1] else f"{cut[0]} to {cut[-1]}"
    return budgets, (
        f"the model's context is {max_length} tokens: {len(cut)} of {len(budgets)} prompt(s) leave less "
        f"than {setting}={max_new_tokens} for the response, which is cut at what the context leaves ({span} tokens)"
    )


def stop_token_ids(model, tokenizer) -> list[int]:
    """EOS ids from the model's generation config (some have several) and the tokenizer."""
    gen_eos = getattr(getattr(unwrap(model), "generation_config", None), "eos_token_id", None)
    ids = [*(gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos]), tokenizer.eos_token_id]
    return list(dict.fromkeys(int(x) for x in ids if x is not None))


def answered_row(
    prompt: Sequence[int], answer: Generated, model: Any, tokenizer: Any, max_length: int
) -> tuple[list[int], int]:
    """A prompt and its ``answer`` (EOS if it ended so) cut to ``max_length``, and its first target token."""
    eos = tokenizer.eos_token_id
    if eos is None:
        eos = (stop_token_ids(model, tokenizer) or [None])[0]
    tail = list(answer.ids or ()) + ([eos] if answer.ended and eos is not None else [])
    return (list(prompt) + tail)[:max_length], len(prompt)


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    return text[: min((i for s in stop if (i := text.find(s)) != -1), default=len(text))]


def _generated(
    tokenizer, row: list[int], decoded: str, stop: Sequence[str], eos: set[int], return_ids: bool
) -> Generated:
    text = cut_at_stop(decoded, stop)
    end = next((k for k, t in enumerate(row) if t in eos), None)
    tokens = row if end is None else row[:end]
    stopped = len(text) < len(decoded)  # a stop string came first, whatever followed it

    def covers(k: int) -> bool:
        return tokenizer.decode(tokens[:k], skip_special_tokens=True).startswith(text)

    # the fewest tokens covering text; when the decoding of a part differs from the whole's, all of them
    if return_ids and stopped and covers(len(tokens)):
        tokens = tokens[: bisect.bisect_left(range(len(tokens)), True, key=covers)]
    return Generated(text, tuple(tokens) if return_ids else None, end is not None and not stopped)


def fit_prompts(
    model: torch.nn.Module,
    tokenizer: Any,
    prompts: Mapping[str, Sequence[int]],
    max_new_tokens: int,
    stop: Sequence[str] = (),
) -> list[GenerationPrompt]:
    """``prompts`` (token ids by name) as :class:`GenerationPrompt`, each response within what the context leaves."""
    max_length = model_max_length(getattr(unwrap(model), "config", None), tokenizer)
    budgets, note = response_budgets({k: len(ids) for k, ids in prompts.items()}, max_length, max_new_tokens)
    if note:
        logger.warning("forgetwatch: %s", note)
    return [GenerationPrompt(tuple(ids), budgets[k], tuple(stop)) for k, ids in prompts.items()]


def generation_share(prompts: Sequence[GenerationPrompt], ranks: Ranks) -> tuple[list[int], list[int]]:
    """This rank's prompts (balanced on tokens) and one to fill in with: the same split on every rank."""
    if not prompts:
        return [], []
    costs = [len(p.ids) + p.new_tokens for p in prompts]
    return ranks.my_share(costs), [min(range(len(costs)), key=costs.__getitem__)]


def generate_sharded(
    model: torch.nn.Module,
    tokenizer: Any,
    prompts: Sequence[GenerationPrompt],
    *,
    ranks: Ranks | None = None,
    rows_per_batch: int = 8,
    return_ids: bool = False,
    limits: Callable[[], tuple[int | None, int | None]] | None = None,
    on_out_of_memory: Callable[[int], None] | None = None,
    prefix_cache: Callable[[list[tuple[int, ...]]], dict[str, Any]] | None = None,
    progress: Callable[[int], None] | None = None,
    sampling: Scoring | None = None,
) -> list[Generated]:
    """Continuations of ``prompts``, in order, on every rank, each rank's share in lockstep: greedy, or ``sampling``
    with each prompt's seed; ``limits`` and ``on_out_of_memory`` replace halving ``rows_per_batch``."""
    from transformers import GenerationConfig, LogitsProcessorList

    ranks = ranks or Ranks()
    whole = list(prompts)
    if not whole:
        return []
    device = input_device(unwrap(model))
    pad = pad_id(tokenizer)
    synced = ranks.size > 1 and is_sharded(model)
    eos = stop_token_ids(model, tokenizer)
    owner = unwrap(model)
    owner = owner.get_base_model() if hasattr(owner, "get_base_model") else owner  # what generate() reads
    caps = Caps()
    fixed = {"do_sample": False, "num_beams": 1, "pad_token_id": pad, "eos_token_id": eos}

    def plan(indices: list[int]) -> list[list[int]]:
        alike: dict[tuple[int, tuple[str, ...]], list[int]] = {}
        for i in indices:
            alike.setdefault((whole[i].new_tokens, whole[i].stop), []).append(i)
        rows, tokens = limits() if limits is not None else caps.limits(rows_per_batch)
        batches = []
        for (new_tokens, _), part in alike.items():
            # the response's tokens count toward a token budget
            own = [len(whole[i].ids) - whole[i].skip + new_tokens for i in part]
            runs = [whole[i].ids[: whole[i].skip] for i in part]
            batches += [[part[j] for j in idx] for idx in group_runs(own, list(map(len, runs)), runs, rows, tokens)]
        return batches

    def generate(chunk: list[int]) -> list[Generated]:
        # each row's prefix (read from the cache) and the rest of its prompt left-padded apart
        rows = [whole[i] for i in chunk]
        prefixes = [p.ids[: p.skip] for p in rows]
        parts = [padded(prefixes, pad, left=True), padded([p.ids[p.skip :] for p in rows], pad, left=True)]
        ids, mask = (torch.cat(t, 1).to(device) for t in zip(*parts))
        width = ids.shape[1]
        extra = prefix_cache(prefixes) if any(prefixes) else {}
        greedy = GenerationConfig(**fixed, max_new_tokens=rows[0].new_tokens, stop_strings=list(rows[0].stop) or None)
        if sampling is not None:  # each row's token drawn with its own seed, then taken greedily
            extra = {**extra, "logits_processor": LogitsProcessorList([SeededDraws([p.seed for p in rows], sampling)])}
        saved = owner.generation_config  # the greedy config stands in for the model's own during the call
        owner.generation_config = greedy
        try:
            with generator(model) as module:
                inputs = {"input_ids": ids, "attention_mask": mask, "tokenizer": tokenizer, "synced_gpus": synced}
                out = module.generate(**inputs, generation_config=greedy, **extra)
        finally:
            owner.generation_config = saved
        new = out[:, width:].tolist()
        texts = tokenizer.batch_decode(new, skip_special_tokens=True)
        return [_generated(tokenizer, row, text, rows[0].stop, set(eos), return_ids) for row, text in zip(new, texts)]

    mine, filler = generation_share(whole, ranks)
    done: dict[str, list[Any]] = {}
    with borrowed(model, tokenizer):
        for part, out in run_lockstep(
            plan(mine),
            generate,
            replan=plan,
            items_of=list,
            filler=filler,
            on_out_of_memory=on_out_of_memory or caps.halve,
            ranks=ranks,
        ):
            done.update((str(i), list(g)) for i, g in zip(part, out))
            if progress is not None:
                progress(len(part))
    gathered = {int(i): g for shard in ranks.gather_json(done) for i, g in shard.items()}
    answers = [gathered[i] for i in range(len(whole))]
    return [Generated(text, None if ids is None else tuple(ids), ended) for text, ids, ended in answers]


def input_device(model: torch.nn.Module) -> torch.device:
    try:
        return model.get_input_embeddings().weight.device
    except (AttributeError, NotImplementedError):
        return next(model.parameters()).device


def pad_id(tokenizer: Any) -> int:
    """The id batches are padded with: the tokenizer's pad token, else EOS, else 0."""
    return next((int(c) for c in (tokenizer.pad_token_id, tokenizer.eos_token_id) if c is not None), 0)
