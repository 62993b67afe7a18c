"""The training rows' captured gradients, one vector per row, and their ranking against a probe's gradient."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import torch


class RowGradients:
    """Each training row's gradients: the sum of the unit vectors of its visits, so that a row's score is the sum
    of its visits' cosines with a probe's gradient (a row trained twice counts twice).

    Args:
        dim: numbers per vector (:attr:`HeadGradients.dim`).
        max_rows: the most rows kept; rows first seen past it are counted in :attr:`uncaptured`, never ranked.

    Example:
        >>> store = RowGradients(dim=3)
        >>> store.add(["row/0", "row/1"], torch.eye(3)[:2])
        >>> store.top(torch.tensor([-1.0, 0.0, 0.0]), k=1)
        [('row/0', 1.0)]
    """

    def __init__(self, dim: int, max_rows: int = 100_000):
        self.dim, self.max_rows = dim, max_rows
        self.keys: list[str] = []
        self._index: dict[str, int] = {}
        self._sums = torch.zeros(0, dim)
        self.uncaptured: set[str] = set()

    def add(self, keys: Sequence[str], vectors: torch.Tensor) -> None:
        """Add a batch's unit vectors, one per key (a key twice in a batch: both visits count)."""
        if len(keys) != len(vectors):
            raise ValueError(f"{len(keys)} row keys for {len(vectors)} gradients")
        for key in keys:
            if key not in self._index and key not in self.uncaptured:
                if len(self.keys) < self.max_rows:
                    self._index[key] = len(self.keys)
                    self.keys.append(key)
                else:
                    self.uncaptured.add(key)
        if len(self.keys) > len(self._sums):  # room doubles: a copy now and then, not one per new batch
            grown = torch.zeros(min(max(2 * len(self._sums), len(self.keys)), self.max_rows), self.dim)
            grown[: len(self._sums)] = self._sums
            self._sums = grown
        kept = [i for i, key in enumerate(keys) if key in self._index]
        rows = torch.tensor([self._index[keys[i]] for i in kept], dtype=torch.long)
        self._sums.index_add_(0, rows, vectors[kept].float())

    def harm(self, query: torch.Tensor) -> torch.Tensor:
        """Each kept row's harm to a probe whose loss has gradient ``query``: −Σ_visits cos(query, row gradient). A
        descent step on a row moves the probe's loss by −lr·⟨query, row gradient⟩, so harm > 0 raised it."""
        return -(self._sums[: len(self.keys)] @ torch.nn.functional.normalize(query.float(), dim=0))

    def top(self, query: torch.Tensor, k: int) -> list[tuple[str, float]]:
        """The ``k`` rows that raised the probe's loss most, most harmful first, with their harm."""
        harm = self.harm(query)
        order = torch.argsort(harm, descending=True, stable=True)[:k].tolist()
        return [(self.keys[i], float(harm[i])) for i in order]

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the kept rows to an ``.npz`` (no pickle)."""
        np.savez(path, keys=np.array(self.keys, dtype=str), sums=self._sums[: len(self.keys)].numpy())

    @classmethod
    def load(cls, path: str | os.PathLike[str], max_rows: int = 100_000) -> RowGradients:
        """Read what :meth:`save` wrote."""
        with np.load(path, allow_pickle=False) as data:
            store = cls(int(data["sums"].shape[1]), max_rows)
            store.add(data["keys"].tolist(), torch.from_numpy(data["sums"]))
        return store
