"""The scoring options that decide a probe set's answers, as stored with them (the scorer's and the command line's)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from forgetwatch.config.settings import Scoring
from forgetwatch.probes import ProbeKind


def scoring_options(
    probes: Iterable[Any],
    scoring: Scoring,
    extract: Callable[[str], str | None] | None = None,
    refusal_detector: Callable[[str], bool] | None = None,
) -> dict[str, Any]:
    """The options that decide the answers of ``probes``, as stored with them (generation's only for generative
    probes, behaviour's only for behaviour probes; the precision is the model's, added by the scorer)."""
    kinds = {p.kind for p in probes}
    s = scoring
    options: dict[str, Any] = {"normalize": s.normalize, "chat_template": s.chat_template}
    if ProbeKind.GENERATIVE in kinds:
        options.update(max_new_tokens=s.max_new_tokens, stop=list(s.stop))
        if extract is not None:
            options["extract"] = getattr(extract, "__qualname__", repr(extract))
    if kinds & {ProbeKind.BEHAVIOUR, ProbeKind.TOOL_CALL}:
        options["behaviour_max_new_tokens"] = s.behaviour_max_new_tokens
        if refusal_detector is not None:
            options["refusal_detector"] = getattr(refusal_detector, "__qualname__", repr(refusal_detector))
    if s.sampled:  # greedy answers carry no sampling options: they are what they always were
        options["sampling"] = {"samples": s.samples, "temperature": s.temperature, "top_p": s.top_p, "seed": s.seed}
    return options
