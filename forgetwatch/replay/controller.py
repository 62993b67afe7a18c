"""``replay_weight="auto"``: the replay weight steered toward a forgetting target.

The law works on ``log2`` of the weight: the right weight's scale is unknown (it depends on the
model, the data and the learning rate) and may be orders of magnitude from where it starts, so
equal relative misses move it by equal factors. At each evaluation, with ``F`` the forgetting
the pool covers and ``T`` the target, it is a velocity-form PI on the relative miss::

    e_k = (F_k - T) / T                          (e_0 := e_1: no kick at the first evaluation)
    s_k = clip(KP * (e_k - e_(k-1)) + KI * e_k, -1, +3)            KP = 1.5, KI = 1
    w   = clamp(w * 2 ** s_k, MIN_WEIGHT, MAX_WEIGHT)

Why this shape:

- Forgetting is cumulative, so it lags the weight: it keeps rising for a while after the weight
  is right, and a law on its level alone overshoots. The proportional term on the *change* of
  the miss answers the lag: forgetting above target but falling fast cancels the push, and
  forgetting rising faster than before pushes harder.
- Up by at most 8 times per evaluation, down by at most half: a run is often too short for
  caution on the way up (the weight needed may be several times the start), while a weight
  too high costs some target-task loss, not correctness, so falling slowly is safe.
- **Reach.** ``drift`` is the pool's own drift from the base (the mean loss rise of its rows,
  nats per token), ``d_max`` its largest so far. When replay has brought its rows back to the
  base (drift at most :data:`REACH_NATS`, after it was over twice that) and forgetting is still
  above target, more weight has nothing left to pull: what the probes lost is not what the
  pool carries. A pool that never drifted (text the base did not know, whose loss replay only
  lowers) says nothing of reach. The weight then does not rise
  (:attr:`Controller.held`; the caller says so once). It may still fall, and rises again once
  the drift is back above the threshold. Without a drift figure (``None``) reach is not judged.
  Absolute, not relative to the drift's peak: where replay does repair, its rows' drift falls
  with the probes' forgetting, and a rule on a share of the peak held the weight short of
  what the target needed (on the simulated plant of the tests).

Example:
    >>> c = Controller(target=0.125)
    >>> c.update(0.25), c.update(0.5), c.update(0.125)   # e = 1: ×2; e = 3: ×2 ** 3 (capped); e = 0: ÷2
    (2.0, 16.0, 8.0)
    >>> c.update(0.5, drift=0.3), c.update(0.5, drift=0.01), c.held   # would rise, but the pool is back at the base
    (64.0, 64.0, True)
    >>> c.state_dict()
    {'weight': 64.0, 'e': 3.0, 'd_max': 0.3, 'held': True, 'reached': True}
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

from forgetwatch.common.text import pct, shorten

# the weight "auto" starts from, and its bounds: declared with the setting they bound
from forgetwatch.config.checks import MAX_WEIGHT, MIN_WEIGHT, START

__all__ = [
    "KI",
    "KP",
    "MAX_WEIGHT",
    "MIN_WEIGHT",
    "REACH_NATS",
    "START",
    "STEP",
    "Controller",
    "next_weight",
    "reach_message",
]

#: Gains of the law on the relative miss: on its change (``KP``) and on its level (``KI``).
KP, KI = 1.5, 1.0
#: Bounds of one evaluation's step in ``log2`` of the weight: down by half, up by 8 times.
STEP = (-1.0, 3.0)
#: Pool drift (nats per token over the base) under which replay holds its rows at the base
#: whatever its peak: a larger weight could not pull them closer. A constant of the law, not a
#: setting, so it lives here rather than with the settings' bounds.
REACH_NATS = 0.02


class Controller:
    """The ``"auto"`` weight, steered toward ``target`` by the law of this module.

    Args:
        target: the forgetting rate to steer to (> 0).
        weight: where the weight starts, within ``[MIN_WEIGHT, MAX_WEIGHT]``.

    Attributes:
        weight: the weight now.
        held: whether the last evaluation would have raised the weight but the pool was already at
            its reach (the weight stayed).
        reached: whether any evaluation so far was held (kept in the state, so that a resumed
            run does not warn again).
        first_hold: whether the last evaluation was the run's first held one: the caller warns
            then (:func:`reach_message`).

    Example:
        >>> c = Controller(0.05, weight=4.0)
        >>> [round(c.update(f), 3) for f in (float("nan"), 0.025, 0.025)]   # no figure; ÷√2; ÷√2
        [4.0, 2.828, 2.0]
    """

    def __init__(self, target: float, weight: float = START):
        if not (_finite(target) and target > 0):
            raise ValueError(f"target must be a finite number > 0, not {target!r}")
        if problem := _weight_problem(weight):
            raise ValueError(f"weight {problem}")
        self.target = float(target)
        self.weight = float(weight)
        self.e: float | None = None  # the last relative miss; None before the first evaluation
        self.d_max: float | None = None  # the largest pool drift measured; None before any
        self.held = False
        self.reached = False
        self.first_hold = False

    def update(self, forgetting: float | None, drift: float | None = None) -> float:
        """The weight after an evaluation that measured ``forgetting`` (the covered figure) and
        the pool's ``drift`` (``None`` or NaN: not measured, reach not judged). Unchanged when
        ``forgetting`` is ``None`` or NaN.

        Example:
            >>> c = Controller(0.05)
            >>> c.update(0.10, drift=0.5), c.update(0.10, drift=0.01), c.held   # back to the base: held
            (2.0, 2.0, True)
        """
        measured = float(drift) if drift is not None and _finite(drift) else None
        if measured is not None:
            self.d_max = measured if self.d_max is None else max(self.d_max, measured)
        self.held = self.first_hold = False
        if forgetting is None or not _finite(forgetting):
            return self.weight
        e = (float(forgetting) - self.target) / self.target
        previous = e if self.e is None else self.e
        step = min(STEP[1], max(STEP[0], KP * (e - previous) + KI * e))
        restored = measured is not None and measured <= REACH_NATS < self.d_max / 2
        if step > 0 and restored:
            step, self.held, self.first_hold = 0.0, True, not self.reached
            self.reached = True
        self.e = e
        self.weight = min(MAX_WEIGHT, max(MIN_WEIGHT, self.weight * 2.0**step))
        return self.weight

    def note(self) -> str:
        """The weight for the console line, and whether it is at its reach.

        Example:
            >>> c = Controller(0.05, weight=4.6); c.held = True; c.note()
            'replay weight 4.6 (auto; at its reach)'
        """
        return f"replay weight {self.weight:.3g} (auto{'; at its reach' if self.held else ''})"

    def state_dict(self) -> dict[str, Any]:
        """What a resume needs, JSON-ready: ``weight``, ``e`` and ``d_max`` (``None`` before the
        first evaluation / drift), ``held`` and ``reached``."""
        return {"weight": self.weight, "e": self.e, "d_max": self.d_max, "held": self.held, "reached": self.reached}

    @staticmethod
    def state_problem(state: Any) -> str | None:
        """Why ``state`` cannot be a controller's (``None`` if it can). Only ``weight`` is
        required: a state without the others (kept before they existed) resumes as at the start.

        Example:
            >>> Controller.state_problem({"weight": 2.0, "e": float("inf")})
            'its e (the last relative miss) is inf, not a finite number or null'
            >>> Controller.state_problem({"weight": 0.0})
            'its weight is 0.0, not a finite number from 0.001 to 100'
        """
        if not isinstance(state, Mapping):
            return f"not a controller state (a {type(state).__name__}, not an object)"
        if problem := _weight_problem(state.get("weight")):
            return f"its weight {problem}"
        for key, what in (("e", "the last relative miss"), ("d_max", "the largest pool drift")):
            value = state.get(key)
            if value is not None and not _finite(value):
                return f"its {key} ({what}) is {shorten(value)}, not a finite number or null"
        for key in ("held", "reached"):
            if not isinstance(state.get(key, False), bool):
                return f"its {key} is {shorten(state.get(key))}, not true or false"
        return None

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Go on from :meth:`state_dict`'s ``state``; a ``ValueError`` says why it cannot.

        Example:
            >>> c = Controller(0.05); c.load_state_dict({"weight": 3.0, "e": 0.5}); round(c.update(0.075), 3)
            4.243
        """
        if problem := self.state_problem(state):
            raise ValueError(f"this controller state cannot be used: {problem}")
        self.weight = float(state["weight"])
        self.e = None if state.get("e") is None else float(state["e"])
        self.d_max = None if state.get("d_max") is None else float(state["d_max"])
        self.held, self.reached = bool(state.get("held", False)), bool(state.get("reached", False))
        self.first_hold = False


def reach_message(forgetting: float, drift: float) -> str:
    """The warning, once per run, at the first evaluation the weight is held at its reach
    (:attr:`Controller.first_hold`), with the figures it measured.

    Example:
        >>> reach_message(0.12, 0.01)
        'replay holds its rows within 0.01 nats/token of the base, yet the forgetting it steers on is 12.0%: a larger weight would not reach it; the pool does not hold what these probes test'
    """
    where = f"within {drift:.2g} nats/token of the base" if drift > 0 else "at the base's loss or below"
    return (
        f"replay holds its rows {where}, yet the forgetting it steers on is {pct(forgetting)}: a larger weight "
        "would not reach it; the pool does not hold what these probes test"
    )


def next_weight(weight: float, forgetting: float, target: float) -> float:
    """The first law (before the :class:`Controller`): the weight times
    ``2 ** clip((forgetting - target) / target, -1, 1)``, unchanged when NaN. Kept because
    histories written with it resume through it.

    Example:
        >>> next_weight(1.0, 0.10, 0.05), next_weight(1.0, 0.05, 0.05), next_weight(1.0, 0.0, 0.05)
        (2.0, 1.0, 0.5)
    """
    if forgetting is None or not math.isfinite(forgetting):
        return weight
    exponent = min(1.0, max(-1.0, (forgetting - target) / target))  # a factor within [1/2, 2]
    return min(MAX_WEIGHT, max(MIN_WEIGHT, weight * 2.0**exponent))


def _finite(x: Any) -> bool:
    """A finite real number (numpy's too), not a bool."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def _weight_problem(weight: Any) -> str | None:
    if _finite(weight) and MIN_WEIGHT <= weight <= MAX_WEIGHT:
        return None
    return f"is {shorten(weight)}, not a finite number from {MIN_WEIGHT:g} to {MAX_WEIGHT:g}"
