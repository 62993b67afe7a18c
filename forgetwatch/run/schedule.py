"""When to re-evaluate during training: every N steps, or within a share of wall time. ``due(step)`` runs on
every optimizer step, so it costs a modulo or one integer comparison (the clock is read only at planned steps)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from forgetwatch.common.text import pct


class EverySteps:
    """Evaluate every ``n`` optimizer steps, and say what that costs (:meth:`pace`)."""

    def __init__(self, n: int, max_overhead: float = 0.05, clock: Callable[[], float] = time.perf_counter):
        self.n, self.max_overhead, self.clock = n, max_overhead, clock
        self._since: tuple[float, int] | None = None  # when and at which step monitoring last ended
        self._warned = False

    def start(self, step: int, spent: float = 0.0, cost: float | None = None) -> None:
        self._since, self._warned = (self.clock(), step), False

    def due(self, step: int) -> bool:
        return step % self.n == 0

    def state_dict(self) -> dict[str, float | int | None]:
        return {"warned": int(self._warned)}

    def load_state_dict(self, state: dict[str, float | int | None]) -> None:
        self._warned = bool(state.get("warned"))

    def evaluated(self, step: int, seconds: float) -> None:
        self._since = (self.clock(), step)

    def pace(self, step: int, began: float, cost: float) -> tuple[str | None, str | None]:
        """An evaluation's cost in training steps, and, once, a warning when the interval spends more than
        ``max_overhead``."""
        if self._since is None or step <= self._since[1] or began - self._since[0] <= 0:
            return None, None
        per_step = (began - self._since[0]) / (step - self._since[1])
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
    return f"{x:.1f} s" if x >= 1 else f"{x * 1000:.0f} ms"


class Budget:
    """Evaluate as often as keeps monitoring within ``max_overhead`` of wall time (``reserve``: evaluations it does not
    pace, such as the final one; ``agree``: rank 0's outcome). See docs/trainer.md."""

    def __init__(
        self,
        max_overhead: float = 0.05,
        clock: Callable[[], float] = time.perf_counter,
        reserve: int = 0,
        agree: Callable[[list[int]], list[int]] = list,
    ):
        self.max_overhead, self.reserve, self.clock, self.agree = max_overhead, reserve, clock, agree
        self._zero: float | None = None  # the clock's reading, less the monitoring time, when training began

    def start(self, step: int, spent: float = 0.0, cost: float | None = None) -> None:
        """Training starts at ``step`` after ``spent`` seconds of monitoring; an evaluation costs about ``cost``."""
        self._spent = spent  # all monitoring time; training time is the clock less both
        self._zero = self.clock() - spent
        self._step0, self._cost, self._next = step, cost, step + 1
        self._trained_at_last = 0.0  # training time when the last evaluation ended
        self.projected: int | None = None  # at the last check that found none due, the next evaluation's step

    def due(self, step: int) -> bool:
        if self._zero is None:  # used without start(): training began before this step
            self.start(step - 1)
        if step < self._next:
            return False
        due, self._next = self.agree(self._decide(step))
        return bool(due)

    def _decide(self, step: int) -> list[int]:
        # [due, next check step] by this rank's clock
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
        return self.clock() - self._zero - self._spent

    def state_dict(self) -> dict[str, float | int | None]:
        """Where the budget stands (JSON-ready): a resumed run goes on with the same decisions."""
        if self._zero is None:
            return {}
        keys = ("spent", "cost", "next", "trained_at_last", "step0")
        return {"trained": self._trained(), **{k: getattr(self, f"_{k}") for k in keys}}

    def load_state_dict(self, state: dict[str, float | int | None]) -> None:
        """Go on from :meth:`state_dict` after :meth:`start` (whose start-up monitoring counts too)."""
        if not state:
            return
        self._spent += state["spent"]
        self._cost, self._next, self._step0 = state["cost"], int(state["next"]), int(state["step0"])
        self._trained_at_last = state["trained_at_last"]
        self._zero = self.clock() - self._spent - state["trained"]

    def evaluated(self, step: int, seconds: float) -> None:
        self._spent += seconds
        self._cost = seconds
        self._trained_at_last = self._trained()
        self._next = step + 1
