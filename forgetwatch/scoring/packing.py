"""Whether a model may be scored with packed rows: known blockers (ALiBi, recurrent layers, virtual tokens, kernels
without a custom mask) first, then a one-time check of packed against plain scores on a few short probes."""

from __future__ import annotations

import itertools
import logging
import traceback
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from forgetwatch.common.text import first_line
from forgetwatch.scoring.batching import is_out_of_memory
from forgetwatch.scoring.borrow import epsilon, is_sharded, unwrap
from forgetwatch.scoring.choices import Batch, Row, collate, needs_truncation, packed_row, plain_rows
from forgetwatch.scoring.encoding import EncodedChoices

logger = logging.getLogger(__name__)
_MODULE_CALL = torch.nn.Module._call_impl.__code__  # every module's forward runs inside it

ALIBI_MODEL_TYPES = frozenset({"bloom", "mpt", "baichuan", "jais"})
ATTENTION_LAYER_TYPES = frozenset({"full_attention", "sliding_attention", "chunked_attention", "attention"})
RECURRENT_CONFIG_KEYS = (
    "attn_layer_period",
    "mamba_d_state",
    "ssm_state_size",
    "state_size",
    "hybrid_override_pattern",
    "layers_block_type",
    "linear_num_value_heads",
)
#: The check's probes (context tokens after one shared prefix, choice lengths): choices of one token and several (one
#: could see another's), contexts of two lengths (batches are padded), behind a prefix read from a KV cache.
CHECK_SHAPES = ((12, (1, 3, 5)), (20, (4, 2)))
CHECK_PREFIX = 16
MIN_TOLERANCE = 1e-4  # per token, in nats: far below any leak through the mask
EPS_FACTOR = 8  # per token, in units of the weights' machine epsilon (bf16: 0.0625 nats)


def packing_blocker(model, config) -> str | None:
    """Why this model cannot be scored packed, or ``None`` if it may be (subject to the check)."""
    impl = getattr(config, "_attn_implementation", None)
    if impl not in ("eager", "sdpa", None):
        return f"attention implementation {impl!r} takes no custom mask"
    if getattr(config, "alibi", False) or getattr(config, "model_type", None) in ALIBI_MODEL_TYPES:
        return "ALiBi position biases depend on the sequence layout"
    layer_types = getattr(config, "layer_types", None) or ()
    if any(t not in ATTENTION_LAYER_TYPES for t in layer_types) or any(
        getattr(config, key, None) is not None for key in RECURRENT_CONFIG_KEYS
    ):
        return "recurrent layers see every earlier token, whatever the mask"
    peft = getattr(model, "active_peft_config", None)
    if getattr(peft, "is_prompt_learning", False):
        return "prompt-learning adapters add virtual tokens outside the mask"
    return None


def check_probes(encoded: Iterable[EncodedChoices], max_length: int) -> list[tuple[int, EncodedChoices]]:
    """:data:`CHECK_SHAPES` filled with ``encoded``'s tokens (none if the context cannot hold them)."""
    pool = itertools.chain.from_iterable(itertools.chain(e.context, *e.continuations) for e in encoded)
    need = CHECK_PREFIX + sum(n + sum(lengths) for n, lengths in CHECK_SHAPES)
    tokens = itertools.islice(itertools.cycle(pool), need)

    def take(n: int) -> tuple[int, ...]:
        return tuple(itertools.islice(tokens, n))

    prefix, keys = take(CHECK_PREFIX), itertools.accumulate(len(lengths) for _, lengths in CHECK_SHAPES)
    shapes = zip(itertools.chain([0], keys), CHECK_SHAPES)
    probes = [(key, EncodedChoices(prefix + take(n), tuple(map(take, lengths)))) for key, (n, lengths) in shapes]
    return [] if any(needs_truncation(enc, max_length) for _, enc in probes) else probes


def decide(run: Any, asked: bool) -> tuple[bool, bool]:
    """May ``run``'s model score choices packed, and (``asked``) read shared prefixes from a cache? Ranks agree."""
    reads = [run.tokens.reads[i] for i in run.tokens.choice_probes]
    sharded = run.ranks.size > 1 and is_sharded(run.model)
    reason = prefix_reason = packing_blocker(unwrap(run.model), run.config)
    if reason is None and reads:
        if probes := check_probes(reads, run.max_length):
            reason, prefix_reason = _problem(probes, run, asked and not sharded)
        else:
            reason = prefix_reason = f"its context of {run.max_length} tokens is too short to check packing on"
    agreed = run.ranks.agree_min([int(reason is None), int(reason is None and prefix_reason is None)])
    packing, cached = map(bool, agreed)
    if reads and not packing:
        why = reason or "another rank found packing inexact"
        logger.warning("scoring each choice as its own sequence, which is slower: %s", why)
    elif asked and sharded:
        logger.warning("scoring each probe whole: parameters sharded over ranks need equal forwards")
    elif asked and not cached:
        why = prefix_reason or "another rank found a cached prefix inexact"
        logger.warning("computing shared prompt prefixes again for every probe, which is slower: %s", why)
    return packing, asked and cached and not sharded


def _problem(probes: Sequence[tuple[int, EncodedChoices]], run: Any, prefixes: bool) -> tuple[str | None, str | None]:
    """Why packing (and a cached prefix) is inexact on ``probes``, or None; of errors only the model's own count."""

    def chunks(rows: list[Row]) -> list[Batch]:  # together, as scoring batches them
        size = run.facts.row_cap or len(rows)
        return [collate(rows[i : i + size], run.pad_id) for i in range(0, len(rows), size)]

    def sums(rows: list[Row]) -> np.ndarray:  # every rank reads the same rows, in lockstep
        logprobs = np.concatenate([lp for _, lp in run.lockstep(chunks(rows), chunks, chunks(rows[:1])[0])])
        return np.bincount(np.concatenate([r.keys for r in rows]), weights=logprobs, minlength=len(tokens))

    tokens = np.array([len(c) for _, enc in probes for c in enc.continuations])  # the keys, in order
    plain = [r for key, enc in probes for r in plain_rows(enc, key, run.max_length)]
    together = sums(plain)
    if not np.isfinite(together).all():  # NaN says nothing of packing; the scorer refuses the model
        return None, None
    noise = float(np.max(np.abs(together - sum(sums([r]) for r in plain)) / tokens))
    tolerance = max(MIN_TOLERANCE, 4 * noise, EPS_FACTOR * epsilon(run.computes_in))

    def differs(rows: list[Row], scored: str, what: str) -> str | None:
        try:
            error = float(np.max(np.abs(sums(rows) - together) / tokens))
        except (RuntimeError, ValueError, TypeError, IndexError) as err:
            distributed = isinstance(err, getattr(torch.distributed, "DistError", ()))
            in_model = any(frame.f_code is _MODULE_CALL for frame, _ in traceback.walk_tb(err.__traceback__))
            if is_out_of_memory(err) or distributed or not in_model:
                raise
            return f"its forward rejects {what} ({first_line(err)})"
        if error <= tolerance:
            return None
        return f"{scored} scores differ from plain ones by {error:.3g} nats per token (tolerance {tolerance:.3g})"

    packing = differs([packed_row(enc, key) for key, enc in probes], "packed", "a custom attention mask")
    if packing is not None or not prefixes:
        return packing, None
    # both behind one prefix (its cache's views), then behind prefixes of two lengths in one
    # batch (copied into a cache, the shorter left-padded), as scoring reads them
    shared = [packed_row(enc, key, CHECK_PREFIX) for key, enc in probes]
    mixed = [packed_row(enc, key, CHECK_PREFIX + 8 * i) for i, (key, enc) in enumerate(probes)]
    what = "a prefix read from a KV cache"
    return None, differs(shared, "prefix-cached", what) or differs(mixed, "prefix-cached", what)
