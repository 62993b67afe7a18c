"""From (model, tokenizer, probes) to :class:`~forgetwatch.Answers`."""

from forgetwatch.scoring.scorer import NonFiniteScoresError, Scorer, evaluate

__all__ = ["NonFiniteScoresError", "Scorer", "evaluate"]
