"""When to re-evaluate during training: every N steps, or within a share of wall time.

Both answer ``due(step)`` on every optimizer step, so that must cost next to nothing: a
modulo for the fixed interval, one integer comparison for the budget (the clock is read only
at the steps it planned to look at).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from forgetwatch.common.text import pct

Agree = Callable[[list[int]], list[int]]


class EverySteps:
    """Evaluate every ``n`` optimizer steps.

    It also says what that costs (:meth:`pace`): the training time per step is read from the
    clock at each evaluation's end and the next one's start, never on the steps between.

    Example:
        >>> s = EverySteps(50)
        >>> s.due(100), s.due(101)
        (True, False)
    """

    def __init__(self, n: int, max_overhead: float = 0.05, clock: Callable[[], float] = time.perf_counter):
        if n < 1:
            raise ValueError(f"eval_steps must be at least 1, got {n}")
        self.n, self.max_overhead, self.clock = n, max_overhead, clock
        self._since: tuple[float, int] | None = None  # when and at which step monitoring last ended
        self._other, self._warned = 0.0, False

    def start(self, step: int, spent: float = 0.0, cost: float | None = None) -> None:
        self._since, self._other, self._warned = (self.clock(), step), 0.0, False

    def due(self, step: int) -> bool:
        return step % self.n == 0

    def spent(self, seconds: float) -> None:
        """Monitoring outside an evaluation (a checkpoint's copy): not training time."""
        self._other += seconds

    def evaluated(self, step: int, seconds: float) -> None:
        self._since, self._other = (self.clock(), step), 0.0

    def pace(self, step: int, began: float, cost: float) -> tuple[str | None, str | None]:
        """For an evaluation at ``step`` that began at ``began`` and took ``cost`` seconds: what
        it cost in training steps (for the console line), and, the first time the interval
        spends more than ``max_overhead`` of wall time, a warning saying how often the budget
        would evaluate; ``None`` for what cannot be measured (no training step since the last).

        Example:
            >>> s = EverySteps(8, clock=lambda: 100.0)
            >>> s.start(0)                              # training begins at t=100 s
            >>> s.pace(8, 116.0, 12.0)[0]               # 8 steps took 16 s
            'evaluation 12.0 s = 6.0 training steps'
        """
        if self._since is None or step <= self._since[1] or began - self._since[0] - self._other <= 0:
            return None, None
        per_step = (began - self._since[0] - self._other) / (step - self._since[1])
        note = f"evaluation {duration(cost)} = {cost / per_step:.1f} training steps"
        share = cost / (cost + self.n * per_step)
        if self._warned or share <= self.max_overhead:
            return note, None
        self._warned = True
        every = math.ceil(cost * (1 - self.max_overhead) / self.max_overhead / per_step)
        return note, (
            f"eval_steps={self.n} spends {pct(share)} of wall time on monitoring (an evaluation "
            f"{duration(cost)}, {self.n} training steps {duration(self.n * per_step)}); the budget "
            f"(max_overhead={self.max_overhead}, without eval_steps) would evaluate about every {every} steps"
        )


def duration(x: float) -> str:
    """A duration for a console line.

    Example:
        >>> duration(12.34), duration(0.0452)
        ('12.3 s', '45 ms')
    """
    return f"{x:.1f} s" if x >= 1 else f"{x * 1000:.0f} ms"


class Budget:
    """Evaluate as often as keeps monitoring within ``max_overhead`` of wall time.

    Monitoring time counts everything the run spent before training (``spent`` at start: the
    base snapshot, its noise check, train KL's base, files), every evaluation, and any other
    monitoring (:meth:`spent`); the rest of the wall time is training. An evaluation is due
    once training has run long enough that one more, costing what the last one did, keeps the
    share within budget: ``train >= (spent + cost * (1 + reserve)) * (1 - max_overhead) /
    max_overhead``, where ``reserve`` holds back the cost of evaluations the schedule does not
    pace (the one at the end of training), so the whole run stays within budget; and once the
    training since the last evaluation alone pays for one (``cost * (1 - max_overhead) /
    max_overhead``), so a long pause (a checkpoint, a trainer evaluation) does not release a
    burst of them. Before the first evaluation, ``cost`` is what the run expects one to cost
    (given at start); if that is not known, the first evaluation comes at once and measures
    it. Between checks the next one is planned in steps, from the measured step time, at most
    doubling the steps seen so far while that estimate is young.

    In a distributed run every rank must evaluate at the same steps, but their clocks differ:
    ``agree`` makes each check's outcome rank 0's (see :mod:`forgetwatch.common.distributed`).
    Checks fall on the same steps everywhere, so it is called in step on every rank.

    Example:
        >>> clock = iter([100.0, 110.0]).__next__
        >>> b = Budget(0.5, clock=clock)
        >>> b.start(step=0, spent=5.0, cost=4.0)   # at t=100 s, after 5 s of start-up
        >>> b.due(1)                               # at t=110 s: 10 s of training >= (5 + 4) * 1
        True
    """

    def __init__(
        self,
        max_overhead: float = 0.05,
        clock: Callable[[], float] = time.perf_counter,
        reserve: int = 0,
        agree: Agree = list,
    ):
        if not 0 < max_overhead < 1:
            raise ValueError(f"max_overhead must be between 0 and 1, got {max_overhead}")
        self.max_overhead = max_overhead
        self.reserve = reserve
        self.clock = clock
        self.agree = agree
        self._t0: float | None = None

    def start(self, step: int, spent: float = 0.0, cost: float | None = None) -> None:
        """Training starts (or resumes) at ``step``; ``spent`` seconds went to monitoring
        before it, and an evaluation will cost about ``cost`` seconds (``None``: unknown)."""
        self._t0 = self.clock()
        self._step0 = step
        self._spent = spent  # all monitoring time, for the budget
        self._spent_since_start = 0.0  # monitoring after t0, not training time
        self._trained_at_last = 0.0  # training time when the last evaluation ended
        self._cost = cost
        self._next = step + 1
        #: at the last check that found none due, the step the next evaluation would come at
        #: if steps keep their pace (``None`` before such a check)
        self.projected: int | None = None

    def due(self, step: int) -> bool:
        if self._t0 is None:  # used without start(): training began before this step
            self.start(step - 1)
        if step < self._next:
            return False
        due, self._next = self.agree(self._decide(step))
        return bool(due)

    def _decide(self, step: int) -> list[int]:
        """``[due, next check step]`` by this rank's clock."""
        if self._cost is None:
            return [1, step + 1]
        train = self._trained()
        ratio = (1 - self.max_overhead) / self.max_overhead
        wanted = max(
            (self._spent + self._cost * (1 + self.reserve)) * ratio, self._trained_at_last + self._cost * ratio
        )
        if train >= wanted:
            return [1, step + 1]
        steps = max(1, step - self._step0)
        per_step = max(train / steps, 1e-9)
        wait = math.ceil((wanted - train) / per_step)
        self.projected = step + wait
        return [0, step + max(1, min(wait, steps))]

    def _trained(self) -> float:
        return self.clock() - self._t0 - self._spent_since_start

    def spent(self, seconds: float) -> None:
        """``seconds`` of monitoring outside an evaluation (a checkpoint's copy of the files)."""
        if self._t0 is None:  # not started: nothing to pay for yet
            return
        self._spent += seconds
        self._spent_since_start += seconds

    def evaluated(self, step: int, seconds: float) -> None:
        """An evaluation at ``step`` took ``seconds`` (any evaluation: scheduled or not)."""
        self._spent += seconds
        self._spent_since_start += seconds
        self._cost = seconds
        self._trained_at_last = self._trained()
        self._next = step + 1

    @property
    def next_check(self) -> int:
        """The step at which ``due`` next looks at the clock."""
        return self._next
