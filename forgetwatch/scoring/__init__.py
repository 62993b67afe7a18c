"""From (model, tokenizer, probes) to :class:`~forgetwatch.Answers`.

:mod:`.scorer` holds :class:`Scorer` (tokenize once, score as often as the weights change);
:mod:`.evaluation` the one-call :func:`evaluate`; the rest are its parts: :mod:`.encoding`
(lm-eval's tokenization), :mod:`.batching` (length-sorted batches, lockstep across ranks),
:mod:`.choices` and :mod:`.packing` (multiple-choice forwards), :mod:`.generation`
(generative probes), :mod:`.kinds` (each kind of probe's answer from what was measured: one
table), :mod:`.borrow` (handing the model back as found).
"""

from forgetwatch.scoring.evaluation import evaluate
from forgetwatch.scoring.scorer import NonFiniteScoresError, Scorer

__all__ = ["NonFiniteScoresError", "Scorer", "evaluate"]
