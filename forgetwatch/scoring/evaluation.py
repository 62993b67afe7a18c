"""``evaluate()``: score a model in one call, reusing a cached :class:`Scorer` (its tokenized
probes) across calls with the same tokenizer, probes and options."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from forgetwatch.config.options import BatchSize
from forgetwatch.config.settings import Scoring
from forgetwatch.probes import ProbeSet
from forgetwatch.results.answers import Answers
from forgetwatch.scoring.scorer import Scorer

__all__ = ["evaluate"]

# The last few scorers, so repeated calls skip tokenizing. A scorer keeps what it learns
# about each model (plans, out-of-memory caps) apart, so sharing one across models is safe.
_SCORERS: dict[tuple, Scorer] = {}
_MAX_SCORERS = 8


def evaluate(
    model: torch.nn.Module,
    tokenizer: Any,
    probes: ProbeSet,
    *,
    batch_size: BatchSize = Scoring.batch_size,
    normalize: str | None = Scoring.normalize,
    chat_template: bool = Scoring.chat_template,
    max_new_tokens: int = Scoring.max_new_tokens,
    stop: Sequence[str] = Scoring.stop,
    extract: Callable[[str], str | None] | None = None,
    behaviour_max_new_tokens: int = Scoring.behaviour_max_new_tokens,
    refusal_detector: Callable[[str], bool] | None = None,
    shared_prefixes: bool = Scoring.shared_prefixes,
    precision: str = Scoring.precision,
    show_progress: bool = True,
    distributed: bool = False,
) -> Answers:
    """Score ``model`` on ``probes``: one :class:`~forgetwatch.Answers`, aligned to the probes.

    Multiple choice is lm-eval-harness ``acc`` (``normalize="chars"``: ``acc_norm``);
    generative probes are decoded greedily and their answer extracted (by the probe's
    ``extract`` mode, or by ``extract=callable``, whose text is compared with the probe's answer
    as written); behaviour probes (rows with ``check``) generate a response that passes when
    every check holds. Tokenization is cached
    across calls with the same tokenizer and probe set. The model and tokenizer are handed
    back exactly as found (mode, cache flag, padding side, random states). With
    ``distributed=True``, every process of a ``torch.distributed`` run calls it together and
    each scores a share of the probes (any model: plain, DDP, FSDP, DeepSpeed ZeRO-3); all of
    them get all the answers.

    Args:
        model: what to score.
        tokenizer: the model's tokenizer.
        probes: the probe set.
        batch_size: as :class:`~forgetwatch.config.settings.Scoring` describes it (default: its own).
        normalize: as :class:`~forgetwatch.config.settings.Scoring` describes it (default: its own).
        chat_template: as :class:`~forgetwatch.config.settings.Scoring` describes it (default: its own).
        max_new_tokens: as :class:`~forgetwatch.config.settings.Scoring` describes it (default: its own).
        stop: as :class:`~forgetwatch.config.settings.Scoring` describes it (default: its own).
        extract: as for :class:`~forgetwatch.scoring.scorer.Scorer` (default ``None``: each
            probe's own ``extract`` mode).
        behaviour_max_new_tokens: as :class:`~forgetwatch.config.settings.Scoring` describes it (default: its own).
        refusal_detector: as for :class:`~forgetwatch.scoring.scorer.Scorer` (default ``None``:
            the phrase detector).
        shared_prefixes: as :class:`~forgetwatch.config.settings.Scoring` describes it (default: its own).
        precision: as :class:`~forgetwatch.config.settings.Scoring` describes it (default: its own).
        show_progress: a progress bar (default ``True``).
        distributed: share the probes out over the ranks of ``torch.distributed`` (default
            ``False``: this process scores them all).

    Example:
        >>> probes = ProbeSet.from_jsonl("probes.jsonl")                   # doctest: +SKIP
        >>> answers = evaluate(model, tokenizer, probes, batch_size=32)   # doctest: +SKIP
        >>> answers.accuracy                                               # doctest: +SKIP
        0.62
    """
    stop = (stop,) if isinstance(stop, str) else tuple(stop)
    key = (
        id(tokenizer),
        probes.fingerprint(),
        normalize,
        chat_template,
        max_new_tokens,
        stop,
        extract,
        behaviour_max_new_tokens,
        refusal_detector,
        shared_prefixes,
        precision,
    )
    scorer = _SCORERS.pop(key, None)
    if scorer is None or scorer.tokenizer is not tokenizer:
        scorer = Scorer(
            tokenizer,
            probes,
            normalize=normalize,
            chat_template=chat_template,
            max_new_tokens=max_new_tokens,
            stop=stop,
            extract=extract,
            behaviour_max_new_tokens=behaviour_max_new_tokens,
            refusal_detector=refusal_detector,
            shared_prefixes=shared_prefixes,
            precision=precision,
        )
    _SCORERS[key] = scorer  # most recently used last
    while len(_SCORERS) > _MAX_SCORERS:
        _SCORERS.pop(next(iter(_SCORERS)))
    return scorer(model, batch_size=batch_size, show_progress=show_progress, distributed=distributed)
