"""ProbeSet: an ordered, validated set of probes with unique ids, and the ways to load,
select, save and fingerprint one."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, overload

from forgetwatch.common.files import atomic_write, content_hash, json_line
from forgetwatch.probes.presets import read_dataset
from forgetwatch.probes.rows import RowCollector
from forgetwatch.probes.sampling import sample_indices
from forgetwatch.probes.schema import Probe, is_int


class ProbeSet(Sequence[Probe]):
    """An ordered, validated set of probes with unique ids.

    Example:
        >>> probes = ProbeSet.from_jsonl("probes.jsonl")  # doctest: +SKIP
    """

    def __init__(self, probes: Iterable[Probe], source: str = "<records>"):
        self._probes = tuple(probes)
        self.source = source
        self._index = {p.id: i for i, p in enumerate(self._probes)}
        self._content_hash: Any = None
        if len(self._index) != len(self._probes):
            raise ValueError(f"{source}: probe ids must be unique")

    # -- loading ------------------------------------------------------------------------------

    @classmethod
    def from_jsonl(cls, path: str | os.PathLike[str]) -> ProbeSet:
        """Load and validate a JSONL probe file; every bad row is reported in one ProbeError.

        Example:
            >>> probes = ProbeSet.from_jsonl("probes.jsonl")  # doctest: +SKIP
        """
        return cls(RowCollector(str(path), "line").read_jsonl(path, "probe file"), str(path))

    @classmethod
    def from_records(cls, records: Iterable[Mapping[str, Any]], source: str = "<records>") -> ProbeSet:
        """Build from dicts in the probe-file schema; errors name 1-based record numbers.

        Example:
            >>> ProbeSet.from_records([{"id": "q1", "question": "2+2=", "answer": "4"}]).ids
            ['q1']
        """
        return cls(RowCollector(source, "record").read_records(records), source)

    @classmethod
    def from_hf(
        cls,
        dataset: Iterable[Mapping[str, Any]],
        preset: str | None = None,
        *,
        columns: Mapping[str, Any] | None = None,
        category: str | None = None,
        limit: int | None = None,
        source: str | None = None,
    ) -> ProbeSet:
        """Build from a ``datasets.Dataset`` (or any iterable of dict rows).

        ``preset`` ("mmlu", "arc", "hellaswag", "gsm8k") reproduces lm-evaluation-harness's
        zero-shot prompts; "ifeval" makes behaviour probes of google/IFEval's rows (an
        ``ifeval`` check: ``pip install 'forgetwatch[ifeval]'``) and "harmful" of HarmBench-style
        rows (``Behavior``, ``SemanticCategory``: must be refused); ``columns`` maps probe fields to column names or callables(row);
        with neither, rows must already follow the probe schema. ``category`` overrides every
        row's category, ``limit`` keeps the first N rows. Errors name 0-based dataset rows.

        Example:
            >>> probes = ProbeSet.from_hf(load_dataset("cais/mmlu", "all", split="test"), "mmlu")  # doctest: +SKIP
        """
        probes, name = read_dataset(dataset, preset, columns=columns, category=category, limit=limit, source=source)
        return cls(probes, name)

    # -- sequence protocol ----------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._probes)

    @overload
    def __getitem__(self, i: int) -> Probe: ...
    @overload
    def __getitem__(self, i: slice) -> ProbeSet: ...
    def __getitem__(self, i):
        if isinstance(i, slice):
            return ProbeSet(self._probes[i], self.source)
        return self._probes[i]

    def __iter__(self) -> Iterator[Probe]:
        return iter(self._probes)

    def __repr__(self) -> str:
        return f"ProbeSet({len(self)} probes from {self.source!r})"

    @property
    def ids(self) -> list[str]:
        return [p.id for p in self._probes]

    @property
    def categories(self) -> list[str]:
        """The distinct categories, sorted.

        Example:
            >>> probes.categories  # doctest: +SKIP
            ['arc', 'gsm8k']
        """
        return sorted({p.category for p in self._probes})

    # -- selection ------------------------------------------------------------------------------

    def subset(self, selector: Iterable[str] | Callable[[Probe], bool]) -> ProbeSet:
        """The probes whose id is in ``selector`` (or for which it returns True), in original order.

        A single string counts as one id. Unknown ids raise KeyError.

        Example:
            >>> math = probes.subset(lambda p: p.category == "math")  # doctest: +SKIP
        """
        if callable(selector):
            return ProbeSet([p for p in self._probes if selector(p)], self.source)
        wanted = {selector} if isinstance(selector, str) else set(selector)
        unknown = sorted(wanted - self._index.keys())
        if unknown:
            shown = ", ".join(repr(u) for u in unknown[:5]) + (" ..." if len(unknown) > 5 else "")
            raise KeyError(f"{len(unknown)} id(s) not in {self.source}: {shown}")
        return ProbeSet([p for p in self._probes if p.id in wanted], self.source)

    def sample(self, n: int, seed: int = 0, stratify: bool = True) -> ProbeSet:
        """``n`` probes chosen at random (deterministic for ``seed``), in original order.

        With ``stratify``, categories get shares proportional to their size (largest-remainder
        rounding), and each gets at least one when ``n`` is at least the number of categories.

        Example:
            >>> quick = probes.sample(200, seed=1)  # doctest: +SKIP
        """
        if not is_int(n) or n < 0:
            raise ValueError(f"n must be a non-negative integer, got {n!r}")
        if n > len(self):
            raise ValueError(f"cannot sample {n} probes from {len(self)}; use n <= {len(self)}")
        if n == len(self):
            return ProbeSet(self._probes, self.source)
        chosen = sample_indices([p.category for p in self._probes], n, seed, stratify)
        return ProbeSet([self._probes[i] for i in chosen], self.source)

    # -- saving ---------------------------------------------------------------------------------

    def to_records(self) -> list[dict[str, Any]]:
        """One dict per probe in the probe-file schema, meta keys included (inverse of from_records).

        Example:
            >>> ProbeSet.from_records([{"id": "q1", "question": "2+2=", "answer": "4"}]).to_records()
            [{'id': 'q1', 'question': '2+2=', 'category': 'all', 'answer': '4'}]
        """
        records = []
        for p in self._probes:
            record = p.content()
            for key, value in p.meta.items():
                record.setdefault(key, copy.deepcopy(value))
            records.append(record)
        return records

    def to_jsonl(self, path: str | os.PathLike[str]) -> Path:
        """Write the probes as a UTF-8 JSONL probe file, atomically, as strict JSON (a NaN in a
        probe built in code is written as null).

        Example:
            >>> probes.to_jsonl("probes.jsonl")  # doctest: +SKIP
        """
        lines = [json_line(r) for r in self.to_records()]
        with atomic_write(path) as f:
            f.writelines(lines)
        return Path(path)

    def fingerprint(self, scoring: Mapping[str, Any] | None = None) -> str:
        """A stable hash of the probes' content, and of ``scoring`` options when given.

        Example:
            >>> probes.fingerprint()  # doctest: +SKIP
            '3f9c0a51d2e84b17'
        """
        if self._content_hash is None:  # probes are immutable: hash their content once
            self._content_hash = content_hash(p.content() for p in self._probes)
        h = self._content_hash.copy()
        if scoring:
            h.update(json.dumps(dict(scoring), sort_keys=True, default=str).encode())
        return h.hexdigest()[:16]


#: What accepts probes: a :class:`ProbeSet`, a probe file's path, or a list of probe rows.
ProbesLike = ProbeSet | str | os.PathLike[str] | Sequence[Mapping[str, Any]]


def as_probe_set(probes: ProbesLike, source: str = "<records>") -> ProbeSet:
    """``probes`` as a :class:`ProbeSet`: loaded from a file, or validated from rows (their
    errors name ``source``).

    Example:
        >>> as_probe_set([{"id": "q1", "question": "2+2=", "answer": "4"}]).ids
        ['q1']
    """
    if isinstance(probes, ProbeSet):
        return probes
    if isinstance(probes, (str, os.PathLike)):
        return ProbeSet.from_jsonl(probes)
    if isinstance(probes, Sequence) and all(isinstance(row, Mapping) for row in probes):
        return ProbeSet.from_records(probes, source=source)
    raise TypeError(
        f"probes must be a ProbeSet, a probe file path or a list of probe rows (dicts), got "
        f"{type(probes).__name__}; see ProbeSet.from_records / ProbeSet.from_hf"
    )
