"""Rules of the scoring options that the settings, the scorer and the command line share."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from forgetwatch.probes import ProbeKind

#: ``normalize`` values: ``None`` is lm-eval ``acc``, ``"chars"`` is ``acc_norm``.
NORMALIZE_MODES: tuple[str | None, ...] = (None, "chars")
#: ``precision`` values: the weights' own dtype (autocast off), or as the training forward computes
PRECISIONS = ("weights", "autocast")

BatchSize = int | str  # a positive int, or "auto"

#: The largest count or size any setting may be: what a 64-bit integer (numpy, torch, the files) holds.
MAX_INT = 2**63 - 1
#: Most tokens a generation may ask for: more than any model's context.
MAX_NEW_TOKENS = 1 << 20


def scoring_options(
    probes: Iterable[Any],
    *,
    normalize: str | None,
    chat_template: bool,
    max_new_tokens: int,
    stop: Sequence[str],
    behaviour_max_new_tokens: int,
    extract: Callable[[str], str | None] | None = None,
    refusal_detector: Callable[[str], bool] | None = None,
    samples: int = 1,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
) -> dict[str, Any]:
    """The options that decide the answers of ``probes``, as stored with them (generation's only for generative
    probes, behaviour's only for behaviour probes)."""
    kinds = {p.kind for p in probes}
    options: dict[str, Any] = {"normalize": normalize, "chat_template": chat_template}
    if ProbeKind.GENERATIVE in kinds:
        options.update(max_new_tokens=max_new_tokens, stop=list(stop))
        if extract is not None:
            options["extract"] = getattr(extract, "__qualname__", repr(extract))
    if kinds & {ProbeKind.BEHAVIOUR, ProbeKind.TOOL_CALL}:
        options["behaviour_max_new_tokens"] = behaviour_max_new_tokens
        if refusal_detector is not None:
            options["refusal_detector"] = getattr(refusal_detector, "__qualname__", repr(refusal_detector))
    if temperature > 0:  # greedy answers carry no sampling options: they are what they always were
        options["sampling"] = {"samples": samples, "temperature": temperature, "top_p": top_p, "seed": seed}
    return options
