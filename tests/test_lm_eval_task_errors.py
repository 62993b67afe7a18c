"""Broken lm-eval task folders: each is one error before any model work, naming the file, the
line or document and the field, and what to do; found from the task folder alone (lm-eval's own
~15,000 tasks are never indexed after a local failure); one line on the command line. And task
code (``!function`` modules) runs only when the tasks are built, never when a run is read."""

from __future__ import annotations

import json
import re
import sys

import pytest

from forgetwatch import ProbeSet, Watch
from forgetwatch.cli import main
from forgetwatch.probes.lm_eval_tasks import LmEvalTaskError

pytest.importorskip("lm_eval")
lm_eval_tasks = pytest.importorskip("lm_eval.tasks")

TASK = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: choices
doc_to_target: answer
metric_list:
  - metric: acc
"""
ROWS = [{"question": f"Is {i} even?", "choices": ["yes", "no"], "answer": i % 2} for i in range(4)]

MARKED_TASK = """task: fw_marked
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: !function utils.question
doc_to_choice: choices
doc_to_target: answer
metric_list:
  - metric: acc
"""

MARKED_UTILS = """from pathlib import Path

HERE = Path(__file__).parent
if (HERE / "armed").exists():
    raise RuntimeError("task code imported")
(HERE / "imported").write_text("yes")


def question(doc):
    return doc["question"]
"""


def task_folder(root, rows=ROWS, data=None, extra=""):
    """A folder with one multiple-choice task, ``fw_t``, over ``data`` (JSONL of ``rows``)."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) if data is None else data)
    (root / "fw_t.yaml").write_text(TASK.format(name="fw_t", data=path) + extra)
    return root


def groups_that_include_each_other(root):
    task_folder(root)
    (root / "ga.yaml").write_text("group: ga\ntask:\n  - fw_t\n  - gb\n")
    (root / "gb.yaml").write_text("group: gb\ntask:\n  - group: inner\n    task: [ga]\n")
    return root


def raising_task_code(root):
    """A task whose ``!function`` module raises when it is imported."""
    task_folder(root)
    (root / "fw_marked.yaml").write_text(MARKED_TASK.format(data=root / "data.jsonl"))
    (root / "utils.py").write_text(MARKED_UTILS)
    (root / "armed").write_text("yes")
    return root


def bad(row):
    return ROWS[:2] + [{**ROWS[2], **row}] + ROWS[3:]


RAISING_UTILS = """def question(doc):
    return doc["question"] + doc["hint"]


def target(doc):
    return doc["answer"] + len(doc["hint"])
"""


def raising_on_a_document(root, field, function, doc):
    """``fw_t`` with ``field`` given by ``!function utils.<function>``, which raises a ``TypeError`` on ``doc``."""
    task_folder(root, rows=[{**r, "hint": None if i == doc else ""} for i, r in enumerate(ROWS)])
    old = {"doc_to_text": 'doc_to_text: "{{question}}"', "doc_to_target": "doc_to_target: answer"}[field]
    (root / "fw_t.yaml").write_text(
        (root / "fw_t.yaml").read_text().replace(old, f"{field}: !function utils.{function}")
    )
    (root / "utils.py").write_text(RAISING_UTILS)
    return root


def generated_task(root, rows):
    """``fw_t`` as a generated task whose reference is its choice at the ``answer`` index."""
    task_folder(root, rows=rows)
    text = (root / "fw_t.yaml").read_text().replace("multiple_choice", "generate_until")
    (root / "fw_t.yaml").write_text(text.replace("metric: acc", "metric: exact_match"))
    return root


# case: (how the folder is built, the task named, options, the names the error must carry: file, document, field, value)
CASES = {
    "empty data file": (lambda d: task_folder(d, data=""), "fw_t", {}, r"data\.jsonl"),
    "truncated JSON line": (
        lambda d: task_folder(d, data=json.dumps(ROWS[0]) + "\n" + json.dumps(ROWS[1])[:-9] + "\n"),
        "fw_t",
        {},
        r"data\.jsonl: line 2\b",
    ),
    "no choices": (
        lambda d: task_folder(d, rows=bad({"choices": []})),
        "fw_t",
        {},
        r"fw_t\.yaml.*document 2.*'doc_to_choice'.*'choices'",
    ),
    "answer index out of range": (
        lambda d: task_folder(d, rows=bad({"answer": 2})),
        "fw_t",
        {},
        r"fw_t\.yaml.*document 2.*'doc_to_target'.*'answer'.*\b2\b",
    ),
    "answer index out of range in a few-shot example": (
        lambda d: task_folder(d, rows=bad({"answer": -1})),
        "fw_t",
        {"limit": 2, "num_fewshot": 1},
        r"fw_t\.yaml.*few-shot.*document 2.*'doc_to_target'.*-1",
    ),
    "gold answer not among the choices": (
        lambda d: task_folder(d, rows=bad({"answer": "maybe"})),
        "fw_t",
        {},
        r"document 2.*'doc_to_target'.*'maybe'.*\['yes', 'no'\]",
    ),
    "no choices in the first document": (  # lm-eval itself tries the first document as it loads the task
        lambda d: task_folder(d, rows=[{**ROWS[0], "choices": []}, *ROWS[1:]]),
        "fw_t",
        {},
        r"fw_t\.yaml.*document 0.*'doc_to_choice'",
    ),
    "answer index out of range in the first document": (
        lambda d: task_folder(d, rows=[{**ROWS[0], "answer": 2}, *ROWS[1:]]),
        "fw_t",
        {},
        r"fw_t\.yaml.*document 0.*'doc_to_target'.*\b2\b",
    ),
    "a template function that raises on a document": (
        lambda d: raising_on_a_document(d, "doc_to_text", "question", doc=2),
        "fw_t",
        {},
        r"fw_t\.yaml.*document 2.*'doc_to_text'.*utils\.question.*TypeError",
    ),
    "a gold function that raises on the first document": (
        lambda d: raising_on_a_document(d, "doc_to_target", "target", doc=0),
        "fw_t",
        {},
        r"fw_t\.yaml.*document 0.*'doc_to_target'.*utils\.target.*TypeError",
    ),
    "no choices in a generated task": (
        lambda d: generated_task(d, bad({"choices": []})),
        "fw_t",
        {},
        r"fw_t\.yaml.*document 2.*'doc_to_choice'.*'choices'",
    ),
    "groups that include each other": (
        groups_that_include_each_other,
        "ga",
        {},
        r"ga \(.*ga\.yaml\) -> gb \(.*gb\.yaml\) -> gb::inner -> ga",
    ),
    "task code that raises": (
        raising_task_code,
        "fw_marked",
        {},
        r"'fw_marked'.*fw_marked\.yaml.*RuntimeError: task code imported",
    ),
    "YAML syntax error": (
        lambda d: task_folder(d, extra="metric_list: [\n  - bad: : x\n"),
        "fw_t",
        {},
        r"fw_t\.yaml: line 14\b",
    ),
}


class IndexedEverything(Exception):
    """lm-eval's own tasks were about to be indexed (a minute, and the wrong cause after)."""


@pytest.fixture
def indexed(monkeypatch):
    """The task folders each lm-eval ``TaskManager`` is built over; indexing lm-eval's own tasks
    raises :class:`IndexedEverything` instead."""
    built: list = []

    class Recording(lm_eval_tasks.TaskManager):
        def __init__(self, *args, include_path=None, include_defaults=True, **kwargs):
            built.append(include_path)
            if include_defaults:
                raise IndexedEverything(include_path)
            super().__init__(*args, include_path=include_path, include_defaults=False, **kwargs)

    monkeypatch.setattr(lm_eval_tasks, "TaskManager", Recording)
    return built


@pytest.mark.parametrize("case", list(CASES))
def test_a_broken_task_folder_is_one_error_naming_where_from_the_folder_alone(tmp_path, indexed, case):
    build, task, options, names = CASES[case]
    folder = build(tmp_path / "tasks")
    with pytest.raises(LmEvalTaskError, match=names) as caught:
        ProbeSet.from_lm_eval(task, include_path=folder, **options)  # include_defaults=True, the default
    assert indexed == [[str(folder)]], "only the task folder is indexed"
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("case", list(CASES))
def test_the_command_line_says_what_is_wrong_with_a_task_folder_in_one_line(tmp_path, indexed, capsys, case):
    build, task, options, names = CASES[case]
    folder = build(tmp_path / "tasks")
    args = ["evaluate", "--model", str(tmp_path / "no-model"), "--out", str(tmp_path / "a.json")]
    args += ["--lm-eval-tasks", task, "--include-path", str(folder)]
    args += [f"--{k.replace('_', '-')}={v}" for k, v in options.items()]
    assert main(args) == 2
    err = capsys.readouterr().err
    [line] = [line for line in err.splitlines() if "forgetwatch" in line]  # datasets' progress bars aside
    assert line.startswith("forgetwatch: error: ") and re.search(names, line) and "Traceback" not in err, err
    assert indexed == [[str(folder)]]


def test_a_local_group_of_lm_eval_s_own_tasks_still_indexes_them(tmp_path, indexed):
    folder = task_folder(tmp_path / "tasks")
    (folder / "mine.yaml").write_text("group: mine\ntask:\n  - fw_t\n  - arc_easy\n")
    with pytest.raises(IndexedEverything):
        ProbeSet.from_lm_eval("mine", include_path=folder)
    with pytest.raises(LmEvalTaskError, match=r"'mine'.*'arc_easy'"):  # the group, and what it includes
        ProbeSet.from_lm_eval("mine", include_path=folder, include_defaults=False)


def test_a_yaml_error_elsewhere_in_the_folder_does_not_stop_its_good_tasks(tmp_path, indexed):
    folder = task_folder(tmp_path / "tasks")
    (folder / "other.yaml").write_text("task: [\n")
    assert len(ProbeSet.from_lm_eval("fw_t", include_path=folder)) == 4


def test_reading_a_run_never_imports_task_code(toy, tmp_path, capsys):
    """Naming a task folder runs its ``!function`` modules (lm-eval's own behaviour); nothing
    that reads what a run wrote does: ``report``, ``compare`` on its files, a resume, indexing."""
    folder = tmp_path / "tasks"
    folder.mkdir()
    rows = [r for r in toy.world.probe_records() if r.get("choices")][:6]
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "fw_marked.yaml").write_text(MARKED_TASK.format(data=folder / "data.jsonl"))
    (folder / "utils.py").write_text(MARKED_UTILS)

    probes = ProbeSet.from_lm_eval("fw_marked", include_path=folder, include_defaults=False)
    assert (folder / "imported").exists()  # the tasks the user names: their code runs
    run = tmp_path / "run"
    watch = Watch(probes, output_dir=run, eval_steps=2)
    watch.start(toy.base, toy.tokenizer)
    watch.evaluate(toy.tuned, 2)
    kept = watch.state_dict()
    watch.finish(toy.tuned, 2)
    base = [
        "evaluate",
        "--model",
        toy.base_dir,
        "--probes",
        str(run / "probes.jsonl"),
        "--out",
        str(tmp_path / "b.json"),
    ]
    assert main([*base, "--no-progress"]) == 0

    # from here on, importing utils.py again raises (and lm-eval's module cache is forgotten)
    (folder / "imported").unlink()
    (folder / "armed").write_text("yes")
    cached = [m for m in sys.modules if m.endswith("utils") and str(folder) in m]
    assert cached
    for name in cached:
        del sys.modules[name]

    assert main(["report", str(run), "--out", str(tmp_path / "report.html")]) == 0
    compare = ["compare", "--base", str(tmp_path / "b.json"), "--model", toy.tuned_dir]
    assert main(compare + ["--probes", str(run / "probes.jsonl"), "--no-progress"]) == 0
    resumed = Watch(probes, output_dir=run, eval_steps=2)
    resumed.load_state_dict(kept)
    resumed.start(toy.tuned, toy.tokenizer)
    resumed.evaluate(toy.tuned, 4)
    resumed.finish(toy.tuned, 4)
    lm_eval_tasks.TaskManager(include_path=str(folder), include_defaults=False)
    with pytest.raises(LmEvalTaskError, match="'fw_unknown'"):
        ProbeSet.from_lm_eval("fw_unknown", include_path=folder, include_defaults=False)
    assert not (folder / "imported").exists()
    capsys.readouterr()
