"""A simulated plant for ``replay_weight="auto"``: how covered forgetting answers the replay
weight, observed through binomial probes, and how far the pool's own rows drift from the base.

Between evaluations the covered forgetting moves by
``F ← F + a (1 − F) h − b F (1 − h)``, where ``h = 1 / (1 + w / w_star)`` is how much of the
training's pull replay leaves (``w_star``: the weight at which replay bites halfway, a scale the
controller does not know); ``a`` is how fast training forgets, ``b`` how fast replay repairs.
The probes see ``F`` through ``n`` Bernoulli draws (seeded). The pool drifts by ``c · h`` nats
per token: replay holds its own rows the closer, the larger the weight.

``transfer=False`` is a pool that does not hold what the probes test: the probes forget as if
there were no replay at all, while the pool's drift still answers the weight.
"""

from __future__ import annotations

import random


class Plant:
    def __init__(
        self,
        w_star: float,
        *,
        a: float = 0.08,
        b: float = 0.3,
        c: float = 0.5,
        n: int = 200,
        seed: int = 0,
        transfer: bool = True,
    ):
        self.w_star, self.a, self.b, self.c, self.n, self.transfer = w_star, a, b, c, n, transfer
        self.rng = random.Random(seed)
        self.forgetting = 0.0

    def bite(self, weight: float) -> float:
        """``h``: the share of training's pull that replay at ``weight`` leaves."""
        return 1.0 / (1.0 + weight / self.w_star)

    def drift(self, weight: float) -> float:
        """The pool's mean loss increase over the base at ``weight`` (nats per token)."""
        return self.c * self.bite(weight)

    def step(self, weight: float) -> tuple[float, float]:
        """Train until the next evaluation at ``weight``: ``(observed forgetting, pool drift)``."""
        h = self.bite(weight) if self.transfer else 1.0
        f = self.forgetting
        self.forgetting = f + self.a * (1 - f) * h - self.b * f * (1 - h)
        observed = sum(self.rng.random() < self.forgetting for _ in range(self.n)) / self.n
        return observed, self.drift(weight)

    def w_eff(self, target: float) -> float:
        """The weight whose steady state is ``target``: ``a h (1 − T) = b T (1 − h)``."""
        h = target * self.b / (self.a * (1 - target) + target * self.b)
        return self.w_star * (1 / h - 1)
