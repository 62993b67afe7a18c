"""Probes built and judged by lm-eval-harness's own task objects, as ``lm_eval.simple_evaluate`` does; what cannot be
scored per sample, or what lm-eval would fail on, is refused at load naming the task, file and field."""

from __future__ import annotations

import contextlib
import difflib
import functools
import itertools
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError

from forgetwatch.common.problems import InputError, Problem, Problems
from forgetwatch.common.text import first_line, shorten, suggestion
from forgetwatch.probes.schema import Probe, is_int

#: Multiple-choice metrics that depend on the choices' log-likelihoods alone.
CHOICE_METRICS = ("acc", "acc_norm", "acc_bytes")
KINDS = ("multiple_choice", "generate_until")  # the output types forgetwatch scores


class LmEvalTaskError(InputError):
    """An lm-eval task that cannot be loaded or scored per sample, and why."""

    noun = "field"


@dataclass(frozen=True, eq=False)
class LmEvalJudge:
    """One document's verdict by its task's ``process_results`` (on the choices' log-likelihoods, or on the
    filtered generation): ``metric`` 1 is right."""

    task: Any  # lm_eval.api.task.Task
    doc: Mapping[str, Any]
    doc_id: int
    metric: str
    filter: str
    max_new_tokens: int | None = None
    stop: tuple[str, ...] | None = None
    choices: tuple[str, ...] = ()  # multiple choice: the document's choices, as the task gave them

    @property
    def label(self) -> str:
        return f"{self.metric},{self.filter}"  # as lm-eval's results name it

    def describe(self) -> dict[str, Any]:
        task = self.task
        return dict(lm_eval_task=task.task_name, version=str(task.VERSION), metric=self.metric, filter=self.filter)

    def choose(self, logprobs: Any) -> tuple[bool, int]:
        lls = np.asarray(logprobs, dtype=float)
        # the choice lm-eval's metric picks, for display (ties go to the lowest index, as np.argmax)
        scores = lls
        if self.metric != "acc":
            size = (lambda c: len(c.encode("utf-8"))) if self.metric == "acc_bytes" else len
            scores = lls / np.array([float(size(c)) for c in self.choices])
        # is_greedy is never read by the metrics allowed for choices (CHOICE_METRICS)
        results = self.task.process_results(self.doc, [(float(x), False) for x in lls])
        return _right(results, self), int(np.argmax(scores))

    def read(self, text: str) -> tuple[bool, str]:
        from lm_eval.api.instance import Instance

        inst = Instance("generate_until", self.doc, ("", {}), 0, (self.task.task_name, self.doc_id, 1))
        inst.resps.append(text)
        for ensemble in self.task._filters:  # the task's filter pipelines; one of them counts
            if ensemble.name == self.filter:
                ensemble.apply([inst])
        answer = inst.filtered_resps[self.filter]
        return _right(self.task.process_results(self.doc, [answer]), self), str(answer)


def _right(results: Mapping[str, Any], judge: LmEvalJudge) -> bool:
    value = results[judge.metric]
    if isinstance(value, (bool, np.bool_)) or value in (0, 1):
        return bool(value == 1)
    raise ValueError(
        f"lm-eval task {judge.task.task_name!r}, document {judge.doc_id}: metric {judge.metric!r} gave "
        f"{value!r}, not right (1) or wrong (0); choose a per-sample 0/1 metric with metric="
    )


def load_lm_eval_probes(names: list[str], **options: Any) -> list[Probe]:
    """The probes of lm-eval tasks ``names``; ``options``: those of :meth:`forgetwatch.ProbeSet.from_lm_eval`."""
    o = SimpleNamespace(**options)
    try:
        from lm_eval.evaluator_utils import get_sample_size
    except ImportError as err:
        raise ImportError("ProbeSet.from_lm_eval needs lm-eval-harness: pip install 'forgetwatch[lm-eval]'") from err
    if not names:
        raise LmEvalTaskError("no lm-eval task given; name at least one, e.g. ['arc_easy']")
    if o.apply_chat_template and not getattr(o.tokenizer, "chat_template", None):
        raise LmEvalTaskError("apply_chat_template=True needs the tokenizer, with a chat template: pass tokenizer=")
    loaded = _load_tasks(o.task_manager, names, o.include_path, o.include_defaults)
    groups = _groups_of(loaded.get("group_map", {}))
    chat = None
    if o.apply_chat_template:  # lm-eval's own chat formatting (HFLM.apply_chat_template) on this tokenizer
        from lm_eval.models.huggingface import HFLM

        lm = SimpleNamespace(tokenizer=o.tokenizer, chat_template_args={})
        chat = functools.partial(HFLM.apply_chat_template, lm)

    scored = {}
    for name, task in loaded["tasks"].items():
        shots = task.get_config("num_fewshot")  # set as simple_evaluate does: a task's explicit 0 is kept
        if o.num_fewshot is not None and shots != 0 or shots is None:
            task.set_config(key="num_fewshot", value=o.num_fewshot or 0)
        scored[name] = _scorable(task, name, _per_task(o.metric, name), _per_task(o.filter, name))
    if refused := [how for how in scored.values() if isinstance(how, str)]:
        raise LmEvalTaskError("cannot score these lm-eval tasks per sample:\n  " + "\n  ".join(refused))

    probes: list[Probe] = []
    for name, task in loaded["tasks"].items():
        where = _named(name, (task.config.metadata or {}).get("config_source"))
        sets: list[tuple[str, list[Any], bool]] = []
        try:
            limit = get_sample_size(task, o.limit)
            # the documents scored, then the few-shot examples their prompts show
            sets = [(where, [doc for _, doc in task.doc_iterator(limit=limit)], True)]
            if (task.get_config("num_fewshot") or 0) > 0 and getattr(task, "sampler", None) is not None:
                sets.append((f"{where}, few-shot examples", task.sampler.fewshot_docs(), False))
            _check_documents(task, sets)
            task.set_fewshot_seed(seed=o.fewshot_seed)  # the sampler's draws depend on its state: seed each build
            task.build_all_requests(
                limit=limit,
                system_instruction=o.system_instruction,
                apply_chat_template=o.apply_chat_template,
                fewshot_as_multiturn=o.fewshot_as_multiturn,
                chat_template=chat,
            )
        except LmEvalTaskError:
            raise
        except Exception as err:  # the task's templates or code on its documents
            _check_documents(task, sets, text=True)  # the document and field that raise, where one does
            raise LmEvalTaskError(f"{where} could not build its prompts: {_cause(err)}") from err
        meta = {"lm_eval": {"task": name, "groups": groups.get(name, [])}}
        requests = sorted(task.instances, key=lambda i: (i.doc_id, i.idx))
        for doc_id, instances in itertools.groupby(requests, key=lambda i: i.doc_id):
            probes.append(_probe(task, name, doc_id, list(instances), *scored[name], meta))
    return probes


def _load_tasks(task_manager: Any, names: list[str], include_path: Any, include_defaults: bool) -> dict[str, Any]:
    """lm-eval's ``TaskManager.load`` of ``names``, indexing ``include_path`` alone when it holds them (minutes less)."""
    if task_manager is None:
        from lm_eval.tasks import TaskManager

        given = [include_path] if isinstance(include_path, (str, os.PathLike)) else include_path
        paths = [str(p) for p in given] if given else None
        task_manager = TaskManager(include_path=paths, include_defaults=include_defaults and not paths)
        if paths and _walk(task_manager.task_index, names)[0]:
            _check_yaml_files(paths)  # lm-eval's index skips a file it cannot read without a word
            if include_defaults:  # e.g. a local group of lm-eval's own tasks
                task_manager = TaskManager(include_path=paths, include_defaults=True)
    missing, tasks = _walk(task_manager.task_index, names)
    for group, name in missing:
        close = difflib.get_close_matches(name, sorted(task_manager.task_index), n=5)
        what = f"lm-eval group {group!r} includes {name!r}, which is no task, group or tag" if group else ""
        raise LmEvalTaskError(
            (what or f"no lm-eval task, group or tag is named {name!r}")
            + ("" if getattr(task_manager, "include_path", None) is None else ", include_path searched too")
            + (f"; close names: {', '.join(close)}" if close else "")
        )
    try:
        return dict(task_manager.load(names))
    except Exception as err:  # the task's data, templates or code
        raise LmEvalTaskError(_load_failure(task_manager, tasks, err)) from err


def _walk(index: Mapping[str, Any], names: Iterable[str]) -> tuple[list[tuple[str | None, str]], dict[str, tuple]]:
    """The ``(group, name)`` pairs the index lacks, and each task's ``(yaml_path, cfg)``; refuses cyclic groups."""
    from lm_eval.tasks._yaml_loader import load_yaml

    missing: list[tuple[str | None, str]] = []
    tasks: dict[str, tuple] = {}
    done: set[str] = set()

    def visit(name: str, group: str | None, path: list[str]) -> None:
        entry = index.get(name)
        if entry is None and group is None and str(name).endswith((".yaml", ".yml")) and os.path.isfile(name):
            try:
                tasks[name] = (None, load_yaml(Path(name), resolve_func=False))
            except Exception:  # noqa: BLE001 - lm-eval's own load says why
                tasks[name] = (None, None)
        elif entry is None:
            missing.append((group, name))
        elif entry.kind.name == "TAG":
            for task in [n for n, e in index.items() if name in e.tags]:
                visit(task, group, path)
        elif entry.kind.name != "GROUP":
            tasks[name] = (entry.yaml_path, entry.cfg)
        elif name in path:
            shown = [f"{n} ({index[n].yaml_path})" if n in index else n for n in path[path.index(name) :]]
            raise LmEvalTaskError(
                f"lm-eval groups include each other: {' -> '.join(shown)} -> {name}; a group cannot "
                "contain itself: remove one of these from the other's task list"
            )
        elif name not in done:
            members((entry.cfg or {}).get("task"), name, [*path, name])
            done.add(name)

    def members(items: Any, group: str, path: list[str]) -> None:
        for item in items if isinstance(items, list) else []:
            item = {"task": item} if isinstance(item, str) else item
            subgroup, task = (item.get("group"), item.get("task")) if isinstance(item, Mapping) else (None, None)
            if isinstance(subgroup, str) and subgroup not in index:  # a group defined inline
                members(task, f"{group}::{subgroup}", [*path, f"{group}::{subgroup}"])
            elif isinstance(subgroup, str):
                visit(subgroup, group, path)
            elif isinstance(task, str) and (task in index or "dataset_path" not in item):
                visit(task, group, path)  # else a task defined inline

    for name in names:
        visit(name, None, [])
    return missing, tasks


def _check_yaml_files(paths: Iterable[str]) -> None:
    """Each task file in ``paths`` lm-eval cannot read, refused naming its file and line (nothing imported)."""
    from lm_eval.tasks._yaml_loader import load_yaml

    found = Problems("lm-eval task folder")
    for path in sorted(p for root in paths for p in Path(root).glob("**/*.yaml")):
        if {"__pycache__", ".ipynb_checkpoints"} & set(path.parts):  # as lm-eval's index
            continue
        try:
            load_yaml(path, resolve_func=False)
        except Exception as err:  # not YAML (a yaml.MarkedYAMLError); an include missing or circular; not a mapping
            mark = getattr(err, "problem_mark", None)
            why = f"not YAML: {err.problem}" if mark else first_line(err)
            where = (mark.name, mark.line + 1) if mark else (str(path), None)
            found.extend([Problem(*where, None, f"{why}; lm-eval skips this file: fix it")])
    found.raise_if_any(LmEvalTaskError)


def _named(name: str, source: Any) -> str:
    return f"lm-eval task {name!r}" + (f" ({source})" if source and source != "inline" else "")


def _cause(err: BaseException) -> str:
    root = err
    while root.__cause__ is not None:
        root = root.__cause__
    text = f"{type(err).__name__}: {first_line(err)}" if str(err).strip() else type(err).__name__
    return text if root is err else f"{text} ({type(root).__name__}: {first_line(root)})"


def _load_failure(task_manager: Any, tasks: Mapping[str, tuple], err: Exception) -> str:
    """Why the tasks failed to load: an empty or non-JSON local data file, else the first task that fails alone."""
    for name, (path, cfg) in tasks.items():
        files = ((cfg or {}).get("dataset_kwargs") or {}).get("data_files")
        for group in files.values() if isinstance(files, Mapping) else [files]:
            for file in map(Path, group if isinstance(group, list) else [group] if group else []):
                if not file.is_file() or file.suffix != ".jsonl" and file.stat().st_size:
                    continue
                with file.open(encoding="utf-8", errors="replace") as lines:
                    numbered = [(n, line) for n, line in enumerate(lines, 1) if line.strip()]
                problem = "no documents: the file is empty" if not numbered else None
                for number, line in numbered:
                    try:
                        json.loads(line)
                    except json.JSONDecodeError as bad:
                        problem = f"line {number}: not JSON ({bad.msg} at column {bad.colno}); fix or remove the line"
                        break
                if problem:
                    return f"{_named(name, path)} could not load its data: {file}: {problem}"
    for name, (path, _) in tasks.items():
        try:
            task_manager.load([name])
        except Exception as alone:  # noqa: BLE001 - the task's data, templates or code
            if path is not None and (problem := _first_document_problem(path)):
                return Problem(_named(name, path), 0, *problem).render("document", LmEvalTaskError.noun)
            return f"{_named(name, path)} could not be loaded: {_cause(alone)}"
    return f"lm-eval's tasks could not be loaded: {_cause(err)}"


def _first_document_problem(path: Any) -> tuple[str, str] | None:
    """What is wrong with the first document of the task in ``path`` (lm-eval tries it as it builds a task), or None."""
    from lm_eval.api.task import ConfigurableTask
    from lm_eval.tasks._yaml_loader import load_yaml

    class AsFarAsItGets(ConfigurableTask):
        def __init__(self, config: dict[str, Any]):
            with contextlib.suppress(Exception):
                super().__init__(config=config)

    try:  # as lm-eval's task factory builds it
        config = {k: v for k, v in load_yaml(Path(path), resolve_func=True).items() if k not in ("tag", "group")}
        task = AsFarAsItGets(config)
        docs = getattr(task, "task_docs", None)
        return _document_problem(task, docs[0], scored=True, text=True) if docs is not None and len(docs) else None
    except Exception:  # noqa: BLE001 - only a diagnosis: the failure itself is reported either way
        return None


def _groups_of(group_map: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """Each task's groups, innermost first (lm-eval keeps a subtask's group only in the map)."""
    parent = {child: group for group, children in group_map.items() for child in children}
    out: dict[str, list[str]] = {}
    for child in parent:
        chain, node = [], child
        while node in parent and parent[node] not in chain:
            node = parent[node]
            chain.append(node)
        out[child] = chain
    return out


def _per_task(option: str | Mapping[str, str] | None, name: str) -> str | None:
    return option.get(name) if isinstance(option, Mapping) else option


def _scorable(task: Any, name: str, metric: str | None, filter_name: str | None) -> tuple[str, str] | str:
    """(metric, filter) this task is scored by, or why it cannot be scored per sample."""
    from lm_eval.api.metrics import mean
    from lm_eval.models.utils import normalize_gen_kwargs

    kind, repeats = task.OUTPUT_TYPE, task.config.repeats or 1
    gen = normalize_gen_kwargs(dict(task.config.generation_kwargs or {})) if kind == "generate_until" else {}
    aggregations = task.aggregation()
    allowed = CHOICE_METRICS if kind == "multiple_choice" else tuple(aggregations)
    per_sample = [m for m in aggregations if aggregations[m] is mean and m in allowed]
    preferred = "acc" if kind == "multiple_choice" else "exact_match"
    metric = metric or (preferred if preferred in per_sample else next(iter(per_sample), None))
    filters, listed = [ensemble.name for ensemble in task._filters], ", ".join(per_sample)
    refusals = [  # the first that holds is the reason
        (getattr(task, "MULTIMODAL", False), "multimodal tasks are not scored by forgetwatch"),
        (kind == "loglikelihood_rolling", "a perplexity task (loglikelihood_rolling) has no right or wrong answer"),
        (kind not in KINDS, f"output_type {kind!r} is not scored by forgetwatch ({' and '.join(KINDS)} are)"),
        (repeats > 1, f"repeats={repeats} samples each answer several times; forgetwatch generates once"),
        (gen.get("do_sample"), "it samples (do_sample or temperature > 0); forgetwatch decodes greedily"),
        (metric is None, f"none of its metrics ({', '.join(aggregations)}) is a per-sample mean forgetwatch can use"),
        (metric not in per_sample, f"metric {metric!r} is none of its per-sample metrics ({listed or 'none'})"),
        (filter_name not in (None, *filters), f"no filter named {filter_name!r}; it has {', '.join(filters)}"),
    ]
    why = next((why for refused, why in refusals if refused), None)
    return f"{name}: {why}" if why else (metric, filter_name or filters[0])


def _check_documents(task: Any, sets: list[tuple[str, list[Any], bool]], text: bool = False) -> None:
    """Refuses a document lm-eval would fail on (see :func:`_document_problem`), naming the document and field."""
    for source, docs, scored in sets:
        found = Problems(source, unit="document")
        for doc_id, doc in enumerate(docs):
            if problem := _document_problem(task, doc, scored, text):
                found.add(doc_id, *problem)
        found.raise_if_any(LmEvalTaskError)


def _document_problem(task: Any, doc: Any, scored: bool, text: bool) -> tuple[str, str] | None:
    """``(field, why)`` of a template raising on ``doc``, no choices, or a gold answer none of them; or ``None``."""
    field = "doc_to_text"
    try:
        if text:
            task.doc_to_text(doc)
        field = "doc_to_target"
        target = task.doc_to_target(doc)
        # a generated task's reference is read from its choices where its target is an index (see _probe)
        if task.OUTPUT_TYPE != "multiple_choice" and (task.config.doc_to_choice is None or not is_int(target)):
            return None
        field = "doc_to_choice"
        choices = task.doc_to_choice(doc)
    except Exception as err:  # noqa: BLE001 - the task's template or code on this document
        return field, f"{_shown(task, field)} raised {_cause(err)}; fix the document or the task"
    if not choices:
        return field, f"{_shown(task, field)} gave no choices; give every document at least one"
    for gold in target if isinstance(target, list) else [target]:
        if is_int(gold) and not 0 <= gold < len(choices):
            wrong = f"{gold}, not the index of one of its {len(choices)} choices; fix the document"
        elif not is_int(gold) and scored and gold not in choices:
            wrong = (
                f"{shorten(gold)}, which is not one of its choices {shorten(list(choices))}; the gold answer "
                "must be one of them exactly: fix the document"
            )
        else:
            continue
        return "doc_to_target", f"{_shown(task, 'doc_to_target')} gave {wrong}"
    return None


def _shown(task: Any, field: str) -> str:
    """A field's template, or its function as the YAML names it (lm-eval names a task's module by its file's path)."""
    value = getattr(task.config, field)
    if callable(value):
        return f"!function {os.path.basename(getattr(value, '__module__', ''))}.{getattr(value, '__qualname__', '')}"
    return shorten(value)


def _probe(task: Any, name: str, doc_id: int, instances: list[Any], metric: str, filter_name: str, meta: dict) -> Probe:
    doc = instances[0].doc
    context = instances[0].args[0]
    pid = f"{name}/{doc_id}"
    if task.OUTPUT_TYPE == "generate_until":
        from lm_eval.models.utils import normalize_gen_kwargs

        gen = normalize_gen_kwargs(dict(instances[0].args[1]))  # lm-eval's default max_gen_toks
        stop = tuple(u for u in gen["until"] if u)  # lm-eval skips empty stop strings
        judge = LmEvalJudge(task, doc, doc_id, metric, filter_name, int(gen["max_gen_toks"]), stop)
        target = task.doc_to_target(doc)
        if task.config.doc_to_choice is not None and isinstance(target, int):
            target = task.doc_to_choice(doc)[target]
        reference = str(target[0] if isinstance(target, list) and target else target)
        delimiter = task.config.target_delimiter if not reference[:1].isspace() else ""
        return Probe(pid, context, reference, category=name, meta=meta, delimiter=delimiter, judge=judge)
    choices = list(task.doc_to_choice(doc))
    continuations = [inst.args[1] for inst in instances]
    delimiter = continuations[0][: len(continuations[0]) - len(choices[0])]
    if len({inst.args[0] for inst in instances}) > 1 or continuations != [delimiter + c for c in choices]:
        raise LmEvalTaskError(
            f"{name}, document {doc_id}: its requests are not one context, then each choice after one delimiter "
            "(as multiple_input tasks such as winogrande): forgetwatch scores one context per document"
        )
    gold = task.doc_to_target(doc)
    if isinstance(gold, list):
        gold = gold[0]
    if isinstance(gold, str):
        gold = choices.index(gold)  # one of them: _check_documents
    judge = LmEvalJudge(task, doc, doc_id, metric, filter_name, choices=tuple(choices))
    return Probe(pid, context, int(gold), tuple(choices), name, meta=meta, delimiter=delimiter, judge=judge)


_Count = Field(ge=0, description="a whole number >= 0")
_Text = Annotated[StrictStr, Field(pattern=r"\S")]


class LmEvalProbes(BaseModel):
    """lm-eval tasks as a config names them (``probes: {lm_eval: [...], num_fewshot: 5}``); each field's
    description is what an error says it expects."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tasks: tuple[_Text, ...] = Field(
        alias="lm_eval", min_length=1, description="a task name or a list of them, e.g. [arc_easy, mmlu]"
    )
    num_fewshot: Annotated[StrictInt, _Count] | None = Field(None, description=_Count.description)
    limit: Annotated[StrictInt, Field(ge=1)] | Annotated[StrictFloat, Field(gt=0, lt=1)] | None = Field(
        None, description="a number of documents per task (>= 1), or a share below 1"
    )
    include_path: _Text | None = Field(None, description="a folder of task YAMLs")
    include_defaults: StrictBool = Field(True, description="true or false")
    fewshot_seed: Annotated[StrictInt, _Count] = 1234
    system_instruction: StrictStr | None = Field(None, description="a string")
    metric: StrictStr | None = Field(None, description="a metric name, e.g. acc_norm")
    filter: StrictStr | None = Field(None, description="a filter name, e.g. strict-match")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> LmEvalProbes:
        """From a config's mapping; a ``ValueError`` names the first key that is wrong."""
        keys = ("lm_eval", *(name for name in cls.model_fields if name != "tasks"))
        if (unknown := next((str(k) for k in data if k not in keys), None)) is not None:
            in_code = "; build chat-template probes in code: ProbeSet.from_lm_eval(..., apply_chat_template=True)"
            raise ValueError(
                f"key 'probes.{unknown}' is not an lm_eval option{suggestion(unknown, keys)}; use "
                f"{', '.join(keys)}{in_code if unknown in ('apply_chat_template', 'tokenizer') else ''}"
            )
        tasks = data.get("lm_eval")
        try:
            return cls.model_validate({**data, "lm_eval": [tasks] if isinstance(tasks, str) else tasks})
        except ValidationError as err:
            key = str(err.errors()[0]["loc"][0])
            expected = cls.model_fields["tasks" if key == "lm_eval" else key].description
            raise ValueError(f"key 'probes.{key}': expected {expected}, got {data.get(key)!r}") from None

    def options(self) -> dict[str, Any]:
        """The keyword arguments of :meth:`forgetwatch.ProbeSet.from_lm_eval` besides the tasks."""
        return self.model_dump(exclude={"tasks"})
