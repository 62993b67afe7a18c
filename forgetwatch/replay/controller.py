"""``replay_weight="auto"``: the replay weight steered toward a forgetting target.

The law is multiplicative: at each evaluation the weight is multiplied by
``2 ** ((forgetting - target) / target)``, that factor held within [1/2, 2]. Above the target
the weight grows, below it shrinks toward zero, on target it stays. Multiplicative because the
right weight's scale is unknown (it depends on the model, the data and the learning rate) and
may be orders of magnitude from where it starts: equal relative errors move it by equal
factors, and the clamp keeps one noisy evaluation from moving it by more than a factor of two.
"""

from __future__ import annotations

import math

# the weight "auto" starts from, and its bounds: declared with the setting they bound
from forgetwatch.config.checks import MAX_WEIGHT, MIN_WEIGHT, START

__all__ = ["MAX_WEIGHT", "MIN_WEIGHT", "START", "next_weight"]


def next_weight(weight: float, forgetting: float, target: float) -> float:
    """The weight after an evaluation that measured ``forgetting`` (unchanged when NaN).

    Example:
        >>> next_weight(1.0, 0.10, 0.05), next_weight(1.0, 0.05, 0.05), next_weight(1.0, 0.0, 0.05)
        (2.0, 1.0, 0.5)
    """
    if forgetting is None or not math.isfinite(forgetting):
        return weight
    exponent = min(1.0, max(-1.0, (forgetting - target) / target))  # a factor within [1/2, 2]
    return min(MAX_WEIGHT, max(MIN_WEIGHT, weight * 2.0**exponent))
