"""Whether a model may be scored with packed rows: known blockers first, then a one-time check.

Packing relies on attention being the only way tokens see each other, steered by the mask
and the position ids. Models with position biases computed from the sequence layout (ALiBi),
recurrent layers (state-space / linear attention, which also see padding), or virtual prompt
tokens break that, as do attention kernels that take no custom mask. Those are refused up
front; for everything else, packed scores are compared once with plain ones, against the noise
that batching alone causes, on a few short probes made of the probes' own tokens: what leaks
through a mask leaks at any length, so the check costs a few forwards of a few dozen tokens,
however long the probes' contexts (a 5-shot MMLU prompt holds hundreds of tokens).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import torch

from forgetwatch.common.text import first_line
from forgetwatch.scoring.choices import Row, needs_truncation, packed_row, plain_rows
from forgetwatch.scoring.encoding import EncodedChoices

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
#: The check's probes, each (its context's tokens after the shared prefix, its choices' lengths):
#: choices of one token and of several (a choice token could see another choice's), contexts of
#: two lengths (batches are padded), all behind one prefix (read from a KV cache, for two rows).
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
    """The probes packing is checked on, as ``(first key, encoding)`` pairs: :data:`CHECK_SHAPES`
    filled with ``encoded``'s tokens in order (contexts, then choices, repeated if too few);
    none if the model's context cannot hold them.

    Example:
        >>> [len(e.context) for _, e in check_probes([EncodedChoices((1, 2, 3), ((4, 5),))], 2048)]
        [28, 36]
    """
    pool = itertools.chain.from_iterable(itertools.chain(e.context, *e.continuations) for e in encoded)
    need = CHECK_PREFIX + sum(n + sum(lengths) for n, lengths in CHECK_SHAPES)
    tokens = itertools.islice(itertools.cycle(pool), need)

    def take(n: int) -> tuple[int, ...]:
        return tuple(itertools.islice(tokens, n))

    prefix = take(CHECK_PREFIX)
    probes, key = [], 0
    for n, lengths in CHECK_SHAPES:
        probes.append((key, EncodedChoices(prefix + take(n), tuple(take(k) for k in lengths))))
        key += len(lengths)
    return [] if any(needs_truncation(enc, max_length) for _, enc in probes) else probes


def packing_problem(
    probes: Sequence[tuple[int, EncodedChoices]],
    score: Callable[[list[Row]], np.ndarray],
    max_length: int,
    eps: float,
    prefixes: bool = False,
) -> tuple[str | None, str | None]:
    """Compare packed with plain scores on ``probes`` (:func:`check_probes`): why this model may
    not be scored packed, or ``None``; and, with ``prefixes``, why it may not read a prefix from
    a KV cache (the context's first :data:`CHECK_PREFIX` tokens, behind which the rest is scored
    packed; then prefixes of two lengths in one batch), or ``None``.

    ``score(rows)`` returns summed log-probabilities per flat choice key for one batch. Plain
    rows are scored first, outside any error handling: a failure there is not about packing
    and is raised. Only a failure of the packed forward, with the same code path having just
    worked on plain rows, means the model rejects a custom attention mask. Per choice token,
    the tolerance is the largest of: four times the difference batching alone makes (plain
    rows scored together vs one by one), :data:`EPS_FACTOR` times ``eps`` (the machine epsilon
    of the precision the forward runs in: another layout rounds differently in half
    precision), and :data:`MIN_TOLERANCE`.
    """
    from forgetwatch.scoring.batching import is_out_of_memory

    packed = [packed_row(enc, key) for key, enc in probes]
    plain = [r for key, enc in probes for r in plain_rows(enc, key, max_length)]
    together = score(plain)
    tokens = np.zeros_like(together)
    for key, enc in probes:
        for j, cont in enumerate(enc.continuations):
            tokens[key + j] = len(cont)
    used = tokens > 0
    if not np.isfinite(together[used]).all():  # NaN says nothing of packing; the scorer refuses the model
        return None, None
    alone = sum(score([r]) for r in plain)
    noise = float(np.max(np.abs(together - alone)[used] / tokens[used]))
    tolerance = max(MIN_TOLERANCE, 4 * noise, EPS_FACTOR * eps)

    def differs(rows: list[Row], scored: str, what: str) -> str | None:
        try:
            scores = score(rows)
        except (RuntimeError, ValueError, TypeError, IndexError) as err:
            if is_out_of_memory(err) or _is_distributed_error(err) or not _raised_in_forward(err):
                raise
            return f"its forward rejects {what} ({first_line(err)})"
        read = np.zeros_like(used)
        read[np.concatenate([r.keys for r in rows])] = True
        error = float(np.max(np.abs(scores - together)[read] / tokens[read]))
        if error <= tolerance:
            return None
        return f"{scored} scores differ from plain ones by {error:.3g} nats per token (tolerance {tolerance:.3g})"

    packing = differs(packed, "packed", "a custom attention mask")
    if packing is not None or not prefixes:
        return packing, None
    # both behind one prefix (its cache's views), then behind prefixes of two lengths in one
    # batch (copied into a cache, the shorter left-padded), as scoring reads them
    shared = [packed_row(enc, key, CHECK_PREFIX) for key, enc in probes]
    mixed = [packed_row(enc, key, CHECK_PREFIX + 8 * i) for i, (key, enc) in enumerate(probes)]
    what = "a prefix read from a KV cache"
    return None, differs(shared, "prefix-cached", what) or differs(mixed, "prefix-cached", what)


def _raised_in_forward(err: BaseException) -> bool:
    """Whether ``err`` was raised inside a module's forward (the model's code), not by our own
    collating, batching or summing around it: only the model may turn packing down."""
    tb = err.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is _MODULE_CALL:
            return True
        tb = tb.tb_next
    return False


def _is_distributed_error(err: BaseException) -> bool:
    dist_error = getattr(torch.distributed, "DistError", None)
    return dist_error is not None and isinstance(err, dist_error)
