"""How the responses drift from the base's before any check fails: length ratios (of sums), mean words, and the
share of responses with bullets, tables, emoji, hedging or a refusal. Pure functions."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from forgetwatch.behaviour import style

#: Share-of-responses features (``refusals`` comes from the refusal detector).
FEATURES: dict[str, Callable[[str], bool]] = {
    "bullets": lambda r: style.bullet_lines(r) > 0,
    "tables": style.has_table,
    "emoji": style.has_emoji,
    "hedging": style.hedges,
}
#: Every share-of-responses figure, in the order people read them.
SHARES = ("refusals", "hedging", "bullets", "tables", "emoji")

Measures = dict[str, np.ndarray]


def measure(
    responses: Sequence[str | None],
    refusal_detector: Callable[[str], bool] | None = None,
    count_tokens: Callable[[list[str]], list[int]] | None = None,
) -> Measures:
    """Each response's words, tokens (with ``count_tokens``) and features, aligned with ``responses`` (NaN: none)."""
    present = [i for i, r in enumerate(responses) if r is not None]
    texts = [responses[i] for i in present]
    features = {**FEATURES, "refusals": refusal_detector or style.looks_like_refusal}
    values = {"words": [style.word_count(t) for t in texts], **{k: [f(t) for t in texts] for k, f in features.items()}}
    if count_tokens is not None:
        values["tokens"] = list(count_tokens(texts)) if texts else []
    out = {}
    for key, column in values.items():
        out[key] = np.full(len(responses), np.nan)
        out[key][present] = column
    return out


def behaviour_figures(base: Measures, current: Measures, idx: np.ndarray) -> dict[str, float]:
    """The drift figures of the responses at ``idx`` both sides have (empty when none)."""
    both = idx[~np.isnan(base["words"][idx]) & ~np.isnan(current["words"][idx])]
    if not len(both):
        return {}
    out: dict[str, float] = {}
    for key, name in (("words", "length_ratio_words"), ("tokens", "length_ratio_tokens")):
        if key in base and key in current and base[key][both].sum() > 0:
            out[name] = float(current[key][both].sum() / base[key][both].sum())
    out["words"], out["words_base"] = float(current["words"][both].mean()), float(base["words"][both].mean())
    for name in SHARES:
        out[name], out[f"{name}_base"] = float(current[name][both].mean()), float(base[name][both].mean())
    return out


def token_counter(tokenizer: Any) -> Callable[[list[str]], list[int]]:
    """``count_tokens`` for :func:`measure`: each text's length in ``tokenizer``'s tokens."""
    return lambda texts: [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
