"""Choosing probes at random: reproducible for a seed, stratified by category."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence


def sample_indices(categories: Sequence[str], n: int, seed: int = 0, stratify: bool = True) -> list[int]:
    """``n`` of the positions ``0..len(categories)-1``, sorted, chosen at random (the same for
    the same ``seed``). With ``stratify``, each category gets a share proportional to its size,
    and at least one when ``n`` is at least the number of categories.

    Example:
        >>> sample_indices(["a", "a", "a", "b"], 2, seed=0)
        [1, 3]
    """
    rng = random.Random(seed)
    if not stratify:
        return sorted(rng.sample(range(len(categories)), n))
    groups: dict[str, list[int]] = {}
    for i, category in enumerate(categories):
        groups.setdefault(category, []).append(i)
    alloc = allocate({g: len(idx) for g, idx in groups.items()}, n)
    chosen: list[int] = []
    for g in sorted(groups):  # fixed order, so the rng stream is reproducible
        chosen += rng.sample(groups[g], alloc[g])
    return sorted(chosen)


def allocate(sizes: Mapping[str, int], n: int) -> dict[str, int]:
    """Split ``n`` across groups in proportion to ``sizes`` (largest-remainder rounding).

    When ``n`` is at least the number of non-empty groups, each gets at least one.
    Integer arithmetic only, so the result never depends on float rounding.
    """
    total = sum(sizes.values())
    alloc = {g: n * s // total for g, s in sizes.items()}
    by_remainder = sorted(sizes, key=lambda g: (-(n * sizes[g] % total), -sizes[g], g))
    for g in by_remainder[: n - sum(alloc.values())]:
        alloc[g] += 1
    nonempty = [g for g, s in sizes.items() if s > 0]
    if n >= len(nonempty):
        for g in sorted(g for g in nonempty if alloc[g] == 0):
            # Take from the group most over its exact quota; it has >= 2 since n >= groups.
            donor = max(
                (d for d in alloc if alloc[d] > 1), key=lambda d: (alloc[d] * total - n * sizes[d], alloc[d], d)
            )
            alloc[donor] -= 1
            alloc[g] = 1
    return alloc


# -- the probe set ----------------------------------------------------------------------------
