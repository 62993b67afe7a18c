"""ProbeSet: an ordered, validated set of probes with unique ids; load, select, save, fingerprint."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import islice
from pathlib import Path
from typing import Any, overload

from forgetwatch.common.files import atomic_write, content_hash, json_line
from forgetwatch.common.text import listing
from forgetwatch.probes.lm_eval_tasks import LmEvalProbes, load_lm_eval_probes
from forgetwatch.probes.presets import PRESETS, RowProblem, map_columns
from forgetwatch.probes.schema import GROUP_KEY, PROBE_FIELDS, Probe, RowCollector, check_category, is_int


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
        """Build from a ``datasets.Dataset`` (or any iterable of dict rows); errors name 0-based dataset rows.

        Args:
            preset: "mmlu", "arc", "hellaswag", "gsm8k" (lm-eval's zero-shot prompts), "ifeval" or "harmful" (behaviour
                probes); with neither ``preset`` nor ``columns``, rows must follow the probe schema.
            columns: probe field -> column name or ``callable(row)``.
            category: overrides every row's category; ``limit``: the first N rows.

        Example:
            >>> probes = ProbeSet.from_hf(load_dataset("cais/mmlu", "all", split="test"), "mmlu")  # doctest: +SKIP
        """
        if isinstance(dataset, Mapping):  # e.g. a DatasetDict: iterating it yields split names
            raise TypeError(f"from_hf needs rows, got a mapping of {list(dataset)[:5]}; pick a split: dataset['test']")
        if preset is not None and columns is not None:
            raise ValueError("give either preset= or columns=, not both")
        if preset is not None and preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; choose one of {list(PRESETS)} or pass columns=")
        if columns is not None:
            if unknown := sorted(set(columns) - set(PROBE_FIELDS)):
                raise ValueError(f"columns= has unknown probe field(s) {unknown}; use some of {list(PROBE_FIELDS)}")
            if bad := [k for k, v in columns.items() if not (isinstance(v, str) or callable(v))]:
                raise ValueError(f"columns= values must be a column name or a callable(row); not so for {bad}")
        if category is not None and (message := check_category(category)):
            raise ValueError(f"category= {message}")
        if limit is not None and (not is_int(limit) or limit < 0):
            raise ValueError(f"limit= must be a non-negative integer, got {limit!r}")
        info = getattr(dataset, "info", None)
        name = getattr(info, "dataset_name", None) or getattr(info, "builder_name", None)
        split = getattr(dataset, "split", None)
        source = source or (f"{name}[{split}]" if name and split else str(name) if name else "<dataset>")
        rows = RowCollector(source, "dataset row")
        for index, row in enumerate(dataset if limit is None else islice(dataset, limit)):
            if not isinstance(row, Mapping):
                rows.add(index, row)  # reports the type problem
                continue
            try:
                if preset is not None:
                    record = PRESETS[preset](row, index)
                elif columns is not None:
                    record = map_columns(row, index, columns)
                else:  # Arrow pads keys a row lacks with None: absent
                    record = {k: v for k, v in row.items() if v is not None}
            except RowProblem as problem:
                field, message = problem.args
                rows.problem(index, field, f"{message} (preset {preset!r})" if preset else message)
                continue
            if category is not None:
                record["category"] = category
            rows.add(index, record)
        return cls(rows.finish(), source)

    @classmethod
    def from_lm_eval(
        cls,
        tasks: str | Sequence[str],
        *,
        num_fewshot: int | None = None,
        limit: int | float | None = None,
        include_path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
        include_defaults: bool = True,
        task_manager: Any = None,
        fewshot_seed: int = 1234,
        apply_chat_template: bool = False,
        tokenizer: Any = None,
        system_instruction: str | None = None,
        fewshot_as_multiturn: bool = True,
        metric: str | Mapping[str, str] | None = None,
        filter: str | Mapping[str, str] | None = None,
    ) -> ProbeSet:
        """Probes built by lm-eval's own task objects (``pip install 'forgetwatch[lm-eval]'``), right exactly when its
        per-sample metric is 1: one per document, id ``"<task>/<doc_id>"``, category its task. Building the tasks runs
        their folder's code, as lm-eval does: name only task folders you trust. ``apply_chat_template``,
        ``system_instruction``, ``fewshot_as_multiturn`` and ``fewshot_seed`` are as in ``lm_eval.simple_evaluate``.

        Args:
            tasks: task, group or tag names (or task YAML paths), as for ``lm_eval --tasks``.
            num_fewshot: few-shot examples per prompt (``None``: each task's own).
            limit: the first ``limit`` documents of each task (a float below 1: that share).
            include_path: a folder (or several) of your task YAMLs; ``include_defaults``: also lm-eval's own tasks.
            task_manager: an ``lm_eval.tasks.TaskManager`` to use instead of a new one.
            tokenizer: the tokenizer whose chat template renders the prompts (with ``apply_chat_template``).
            metric: what decides right and wrong (one name, or one per task; default ``acc`` or ``exact_match``).
            filter: which filter pipeline's output counts (default the task's first).

        Example:
            >>> probes = ProbeSet.from_lm_eval(["arc_easy", "mmlu"], num_fewshot=5, limit=20)  # doctest: +SKIP
        """
        options = {k: v for k, v in locals().items() if k not in ("cls", "tasks")}  # the keywords above, as given
        names = [tasks] if isinstance(tasks, str) else list(tasks)
        return cls(load_lm_eval_probes(names, **options), "lm-eval: " + ", ".join(map(str, names)))

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
        """The distinct categories, sorted."""
        return sorted({p.category for p in self._probes})

    def with_groups(self, category_map: Mapping[str, str]) -> ProbeSet:
        """These probes, those of each category ``category_map`` names keeping its group.

        Example:
            >>> probes = ProbeSet.from_records([{"id": "q1", "question": "2+2=", "answer": "4", "category": "sums"}])
            >>> [p.category_group for p in probes.with_groups({"sums": "arithmetic"})]
            ['arithmetic']
        """
        if not category_map:
            return self
        grouped = [
            dataclasses.replace(p, meta={**p.meta, GROUP_KEY: category_map[p.category]})
            if p.category in category_map
            else p
            for p in self._probes
        ]
        return ProbeSet(grouped, self.source)

    def subset(self, selector: Iterable[str] | Callable[[Probe], bool]) -> ProbeSet:
        """The probes whose id is in ``selector`` (one string is one id; unknown ids: ``KeyError``) or for which
        it returns True, in original order.

        Example:
            >>> math = probes.subset(lambda p: p.category == "math")  # doctest: +SKIP
        """
        if callable(selector):
            return ProbeSet([p for p in self._probes if selector(p)], self.source)
        wanted = {selector} if isinstance(selector, str) else set(selector)
        if unknown := sorted(wanted - self._index.keys()):
            raise KeyError(f"{len(unknown)} id(s) not in {self.source}: {listing(map(repr, unknown))}")
        return ProbeSet([p for p in self._probes if p.id in wanted], self.source)

    def sample(self, n: int, seed: int = 0, stratify: bool = True) -> ProbeSet:
        """``n`` probes chosen at random (the same for ``seed``), in original order; with ``stratify``, each
        category gets a share proportional to its size, and at least one when ``n`` allows.

        Example:
            >>> quick = probes.sample(200, seed=1)  # doctest: +SKIP
        """
        if not is_int(n) or n < 0:
            raise ValueError(f"n must be a non-negative integer, got {n!r}")
        if n > len(self):
            raise ValueError(f"cannot sample {n} probes from {len(self)}; use n <= {len(self)}")
        rng = random.Random(seed)
        groups: dict[str, list[int]] = {}
        for i, p in enumerate(self._probes):
            groups.setdefault(p.category if stratify else "", []).append(i)
        alloc = _allocate({g: len(idx) for g, idx in groups.items()}, n)
        chosen = [i for g in sorted(groups) for i in rng.sample(groups[g], alloc[g])]  # fixed order: reproducible
        return ProbeSet([self._probes[i] for i in sorted(chosen)], self.source)

    def to_records(self) -> list[dict[str, Any]]:
        """One dict per probe in the probe-file schema, meta keys included.

        Example:
            >>> ProbeSet.from_records([{"id": "q1", "question": "2+2=", "answer": "4"}]).to_records()
            [{'id': 'q1', 'question': '2+2=', 'category': 'all', 'answer': '4'}]
        """
        rows = [p.content() for p in self._probes]
        return [r | {k: copy.deepcopy(v) for k, v in p.meta.items() if k not in r} for p, r in zip(self, rows)]

    def to_jsonl(self, path: str | os.PathLike[str]) -> Path:
        """Write the probes as a JSONL probe file, atomically, as strict JSON.

        Example:
            >>> probes.to_jsonl("probes.jsonl")  # doctest: +SKIP
        """
        lines = [json_line(r) for r in self.to_records()]
        with atomic_write(path) as f:
            f.writelines(lines)
        return Path(path)

    def fingerprint(self, scoring: Mapping[str, Any] | None = None) -> str:
        """A stable hash of the probes' content, and of ``scoring`` options when given."""
        if self._content_hash is None:  # probes are immutable: hash their content once
            self._content_hash = content_hash(p.content() for p in self._probes)
        h = self._content_hash.copy()
        if scoring:
            h.update(json.dumps(dict(scoring), sort_keys=True, default=str).encode())
        return h.hexdigest()[:16]


#: A :class:`ProbeSet`, a probe file's path, a list of probe rows, or lm-eval tasks as a config names them.
ProbesLike = ProbeSet | str | os.PathLike[str] | Sequence[Mapping[str, Any]] | LmEvalProbes


def as_probe_set(probes: ProbesLike, source: str = "<records>") -> ProbeSet:
    """``probes`` as a :class:`ProbeSet`: loaded from a file, or validated from rows (errors name ``source``)."""
    if isinstance(probes, ProbeSet):
        return probes
    if isinstance(probes, LmEvalProbes):
        return ProbeSet.from_lm_eval(list(probes.tasks), **probes.options())
    if isinstance(probes, (str, os.PathLike)):
        return ProbeSet.from_jsonl(probes)
    if isinstance(probes, Sequence) and all(isinstance(row, Mapping) for row in probes):
        return ProbeSet.from_records(probes, source=source)
    raise TypeError(
        f"probes must be a ProbeSet, a probe file path or a list of probe rows (dicts), got "
        f"{type(probes).__name__}; see ProbeSet.from_records / ProbeSet.from_hf"
    )


def _allocate(sizes: Mapping[str, int], n: int) -> dict[str, int]:
    """``n`` split across groups in proportion to ``sizes`` (largest remainder), one each where ``n`` allows."""
    total = sum(sizes.values())
    alloc = {g: n * s // total for g, s in sizes.items()}
    by_remainder = sorted(sizes, key=lambda g: (-(n * sizes[g] % total), -sizes[g], g))
    for g in by_remainder[: n - sum(alloc.values())]:
        alloc[g] += 1
    if n >= len(sizes):  # every group is non-empty
        for g in sorted(g for g in sizes if alloc[g] == 0):
            # Take from the group most over its exact quota; it has >= 2 since n >= groups.
            donor = max(
                (d for d in alloc if alloc[d] > 1), key=lambda d: (alloc[d] * total - n * sizes[d], alloc[d], d)
            )
            alloc[donor] -= 1
            alloc[g] = 1
    return alloc
