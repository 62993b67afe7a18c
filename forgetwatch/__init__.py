"""forgetwatch: watch an LLM forget while it is being post-trained.

Example:
    >>> from forgetwatch import ProbeSet, evaluate, compare     # doctest: +SKIP
    >>> probes = ProbeSet.from_jsonl("probes.jsonl")            # doctest: +SKIP
    >>> base = evaluate(base_model, tokenizer, probes)          # doctest: +SKIP
    >>> print(compare(base, evaluate(tuned_model, tokenizer, probes)).summary())  # doctest: +SKIP
"""

from .answers import Answers, AnswersMismatchError
from .metrics import compare
from .probes import Probe, ProbeError, ProbeSet
from .report import TransitionReport
from .scoring import Scorer, evaluate

__version__ = "0.1.0"

__all__ = [
    "Answers",
    "AnswersMismatchError",
    "Probe",
    "ProbeError",
    "ProbeSet",
    "Scorer",
    "TransitionReport",
    "__version__",
    "compare",
    "evaluate",
]
