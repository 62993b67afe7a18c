"""ProbeSet.from_lm_eval: probes built by lm-eval's own task objects, right exactly when
``simple_evaluate(..., log_samples=True)`` says so, per sample, on local task YAMLs whose data
are JSONL files written here (a 5-shot multiple-choice task, a generative task with regex
filters, a group, a chat template)."""

from __future__ import annotations

import json
import logging
import random

import numpy as np
import pytest
import torch

from forgetwatch import ProbeSet, Scorer, Scoring
from forgetwatch.cli import main
from forgetwatch.config import ConfigError, ForgetWatchConfig
from forgetwatch.probes import as_probe_set
from forgetwatch.sinks.logged import lm_eval_lines

pytest.importorskip("lm_eval")

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

TASKS = {
    # 5-shot from a separate split with first_n: every document shares one few-shot block
    "fw_cap.yaml": """task: fw_cap
dataset_path: json
dataset_kwargs:
  data_files:
    train: {dir}/cap_train.jsonl
    test: {dir}/cap_test.jsonl
training_split: train
test_split: test
fewshot_split: train
fewshot_config:
  sampler: first_n
description: "Facts about capitals.\\n\\n"
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: choices
doc_to_target: answer
metric_list:
  - metric: acc
  - metric: acc_norm
""",
    "fw_col.yaml": """task: fw_col
dataset_path: json
dataset_kwargs:
  data_files:
    test: {dir}/col_test.jsonl
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: choices
doc_to_target: answer
metric_list:
  - metric: acc
""",
    "fw_group.yaml": """group: fw_group
task:
  - fw_cap
  - group: fw_inner
    task:
      - fw_col
    aggregate_metric_list:
      - metric: acc
aggregate_metric_list:
  - metric: acc
    weight_by_size: true
""",
    # generative, 5-shot, two regex filter pipelines and exact_match with arguments
    "fw_riv.yaml": """task: fw_riv
dataset_path: json
dataset_kwargs:
  data_files:
    train: {dir}/riv_train.jsonl
    test: {dir}/riv_test.jsonl
test_split: test
fewshot_split: train
fewshot_config:
  sampler: first_n
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}} rivers."
fewshot_delimiter: "\\n"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 8
  do_sample: false
filter_list:
  - name: strict
    filter:
      - function: regex
        regex_pattern: "(\\\\d+) rivers"
      - function: take_first
  - name: flex
    filter:
      - function: regex
        regex_pattern: "(\\\\d+)"
        group_select: -1
      - function: take_first
metric_list:
  - metric: exact_match
    ignore_case: true
    regexes_to_ignore: [" rivers\\\\.$"]
""",
    # what forgetwatch cannot score per sample
    "x_rolling.yaml": """task: x_rolling
dataset_path: json
dataset_kwargs:
  data_files:
    test: {dir}/riv_test.jsonl
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{question}}}}"
metric_list:
  - metric: word_perplexity
""",
    "x_sample.yaml": """task: x_sample
include: fw_riv.yaml
generation_kwargs:
  until: ["\\n"]
  temperature: 0.7
""",
    "x_f1.yaml": """task: x_f1
include: fw_col.yaml
metric_list:
  - metric: f1
""",
}


@pytest.fixture(scope="module")
def task_dir(toy, tmp_path_factory):
    """The toy world's facts as lm-eval tasks: 40 test documents and 8 few-shot ones per kind."""
    root = tmp_path_factory.mktemp("lm_eval_tasks")
    records = toy.world.probe_records()
    for kind, short in (("capitals", "cap"), ("colors", "col"), ("rivers", "riv")):
        rows = [r for r in records if r["category"] == kind]
        for split, part in (("test", rows[:40]), ("train", rows[40:])):
            (root / f"{short}_{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    for name, text in TASKS.items():
        (root / name).write_text(text.format(dir=root))
    return root


@pytest.fixture
def kept_rng():
    """simple_evaluate seeds Python's, numpy's and torch's global generators: put them back."""
    states = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    yield
    random.setstate(states[0])
    np.random.set_state(states[1])
    torch.random.set_rng_state(states[2])


def lm_eval_run(model, tokenizer, task_dir, tasks, **options):
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    logging.getLogger("lm-eval").setLevel(logging.ERROR)
    return simple_evaluate(
        model=HFLM(pretrained=model, tokenizer=tokenizer, batch_size=8),
        tasks=tasks,
        log_samples=True,
        bootstrap_iters=0,
        verbosity="ERROR",
        task_manager=TaskManager(include_path=str(task_dir), include_defaults=False),
        **options,
    )


def compare(reference, answers, probes, metric_of):
    """Per task: (documents where forgetwatch's verdict equals lm-eval's, documents, lm-eval's rights).
    ``metric_of(task)`` is the (metric, filter) the probes were built with."""
    correct = dict(zip(answers.ids, answers.correct))
    prompts = {p.id: p.question for p in probes}
    out = {}
    for task, samples in reference["samples"].items():
        metric, filter_name = metric_of(task)
        same = right = n = 0
        for s in samples:
            if s["filter"] != filter_name:
                continue
            pid = f"{task}/{s['doc_id']}"
            assert prompts[pid] == s["arguments"][0][0]  # the very prompt lm-eval scored
            lm_eval_right = bool(float(s[metric]) == 1.0)
            same += bool(correct[pid]) == lm_eval_right
            right += lm_eval_right
            n += 1
        out[task] = (same, n, right)
    return out


def assert_agrees(table):
    for task, (same, n, right) in table.items():
        assert n == 40, task
        assert same == n, f"{task}: forgetwatch and lm-eval agree on {same} of {n} documents"
        # a check where every document, or none, is right proves nothing
        assert 0 < right < n, f"{task}: lm-eval counts {right} of {n} right, so agreement would be void"


def test_five_shot_choices_generation_and_a_group_agree_per_sample(toy, task_dir, kept_rng):
    tasks = ["fw_group", "fw_riv"]
    reference = lm_eval_run(toy.base, toy.tokenizer, task_dir, tasks, num_fewshot=5)
    probes = ProbeSet.from_lm_eval(tasks, num_fewshot=5, include_path=task_dir, include_defaults=False)
    assert probes.categories == ["fw_cap", "fw_col", "fw_riv"]  # a group's subtasks keep their names
    assert probes[probes.ids.index("fw_col/0")].meta["lm_eval"]["groups"] == [
        "fw_group::fw_inner",
        "fw_group",
    ]
    # logged by their innermost group; a task outside any group is a group of its own
    groups = {p.category: p.category_group for p in probes}
    assert groups == {"fw_cap": "fw_group", "fw_col": "fw_group::fw_inner", "fw_riv": "fw_riv"}
    answers = Scorer(toy.tokenizer, probes)(toy.base, show_progress=False)
    table = compare(
        reference, answers, probes, lambda t: ("exact_match", "strict") if t == "fw_riv" else ("acc", "none")
    )
    assert_agrees(table)
    # each task's accuracy is lm-eval's number for it
    for task in tasks[1:] + ["fw_cap", "fw_col"]:
        metric = "exact_match,strict" if task == "fw_riv" else "acc,none"
        mine = answers.correct[np.asarray(answers.categories) == task].mean()
        assert mine == pytest.approx(reference["results"][task][metric])
        # and the console says so, in lm-eval's terms
        assert f"lm-eval {task}: {metric} {reference['results'][task][metric]:.4f}" in "\n".join(lm_eval_lines(answers))


def test_acc_norm_and_another_filter_agree_per_sample(toy, task_dir, kept_rng):
    reference = lm_eval_run(toy.base, toy.tokenizer, task_dir, ["fw_cap", "fw_riv"], num_fewshot=3)
    probes = ProbeSet.from_lm_eval(
        ["fw_cap", "fw_riv"],
        num_fewshot=3,
        include_path=task_dir,
        include_defaults=False,
        metric={"fw_cap": "acc_norm"},
        filter={"fw_riv": "flex"},
    )
    answers = Scorer(toy.tokenizer, probes)(toy.base, show_progress=False)
    table = compare(
        reference, answers, probes, lambda t: ("exact_match", "flex") if t == "fw_riv" else ("acc_norm", "none")
    )
    assert_agrees(table)


def test_chat_template_agrees_per_sample(toy, task_dir, kept_rng):
    tokenizer = type(toy.tokenizer).from_pretrained(toy.base_dir)
    tokenizer.chat_template = CHAT_TEMPLATE
    options = dict(num_fewshot=2, apply_chat_template=True, system_instruction="You know geography.")
    reference = lm_eval_run(toy.base, tokenizer, task_dir, ["fw_cap", "fw_col"], **options)
    probes = ProbeSet.from_lm_eval(
        ["fw_cap", "fw_col"], include_path=task_dir, include_defaults=False, tokenizer=tokenizer, **options
    )
    assert probes[0].question.startswith("<|system|>\nYou know geography.")
    assert probes[0].delimiter == ""  # lm-eval drops the space after the assistant turn
    answers = Scorer(tokenizer, probes)(toy.base, show_progress=False)
    assert_agrees(compare(reference, answers, probes, lambda t: ("acc", "none")))
    with pytest.raises(ValueError, match="chat_template"):
        Scorer(tokenizer, probes, scoring=Scoring(chat_template=True))


def test_limit_takes_the_first_documents_of_each_subtask(task_dir):
    probes = ProbeSet.from_lm_eval("fw_group", limit=3, include_path=task_dir, include_defaults=False)
    assert probes.ids == ["fw_cap/0", "fw_cap/1", "fw_cap/2", "fw_col/0", "fw_col/1", "fw_col/2"]


@pytest.mark.parametrize(
    ("task", "why"),
    [
        ("x_rolling", "perplexity"),
        ("x_sample", "samples"),
        ("x_f1", "f1"),
    ],
)
def test_what_cannot_be_scored_per_sample_is_refused_at_load(task_dir, task, why):
    with pytest.raises(ValueError, match=f"{task}.*{why}"):  # the task, and what keeps it from being scored
        ProbeSet.from_lm_eval(["fw_cap", task], include_path=task_dir, include_defaults=False)


def test_a_metric_that_is_not_per_sample_right_or_wrong_is_refused(task_dir):
    with pytest.raises(ValueError, match="fw_col.*'acc_norm'"):
        ProbeSet.from_lm_eval("fw_col", include_path=task_dir, include_defaults=False, metric="acc_norm")
    with pytest.raises(ValueError, match="fw_riv.*'loose'.*strict, flex"):  # and the filters there are
        ProbeSet.from_lm_eval("fw_riv", include_path=task_dir, include_defaults=False, filter="loose")


def test_a_misspelled_task_name_gives_close_names(task_dir):
    with pytest.raises(ValueError, match="'fw_cpa'.*fw_cap, fw_col"):  # the name, and the close ones
        ProbeSet.from_lm_eval(["fw_cpa"], include_path=task_dir, include_defaults=False)


def test_a_config_names_lm_eval_tasks_with_a_task_folder_beside_it(task_dir, tmp_path):
    config = tmp_path / "watch.yaml"
    config.write_text(
        f"probes:\n  lm_eval: [fw_cap, fw_riv]\n  num_fewshot: 2\n  limit: 4\n  include_path: {task_dir.name}\n"
        "  include_defaults: false\neval_steps: 5\n"
    )
    (tmp_path / task_dir.name).symlink_to(task_dir)
    cfg = ForgetWatchConfig.from_yaml(config)
    assert cfg.probes.include_path == str(tmp_path / task_dir.name)  # relative to the YAML file
    probes = as_probe_set(cfg.probes)
    assert probes.ids == [f"fw_cap/{i}" for i in range(4)] + [f"fw_riv/{i}" for i in range(4)]
    assert probes[0].question.count("The capital of") == 3  # two examples, then the question
    config.write_text("probes:\n  lm_eval: [fw_cap]\n  num_fewshots: 2\n")
    with pytest.raises(ConfigError) as caught:
        ForgetWatchConfig.from_yaml(config)
    [(source, line, key, message)] = caught.value.errors
    assert (source, line, key) == (str(config), 1, "probes") and "did you mean 'num_fewshot'" in message


def test_the_command_line_scores_lm_eval_tasks(toy, task_dir, tmp_path, capsys):
    out = tmp_path / "answers.json"
    args = ["evaluate", "--model", toy.base_dir, "--out", str(out), "--no-progress", "--batch-size", "8"]
    tasks = ["--lm-eval-tasks", "fw_cap", "--num-fewshot", "5", "--include-path", str(task_dir)]
    assert main(args + tasks) == 0
    probes = ProbeSet.from_lm_eval("fw_cap", num_fewshot=5, include_path=task_dir, include_defaults=False)
    expected = Scorer(toy.tokenizer, probes)(toy.base, show_progress=False)
    assert "\n".join(lm_eval_lines(expected)) in capsys.readouterr().out
    assert main(args + ["--probes", "x.jsonl", "--num-fewshot", "5"]) == 2
    assert "--num-fewshot goes with --lm-eval-tasks" in capsys.readouterr().err


def test_the_command_line_builds_chat_prompts_with_the_model_s_tokenizer(toy, task_dir, tmp_path, capsys):
    tokenizer = type(toy.tokenizer).from_pretrained(toy.base_dir)
    tokenizer.chat_template = CHAT_TEMPLATE
    model_dir = tmp_path / "chat-model"
    toy.base.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    args = [
        "evaluate",
        "--model",
        str(model_dir),
        "--out",
        str(tmp_path / "a.json"),
        "--no-progress",
        "--chat-template",
    ]
    assert main(args + ["--lm-eval-tasks", "fw_col", "--num-fewshot", "2", "--include-path", str(task_dir)]) == 0
    probes = ProbeSet.from_lm_eval(
        "fw_col",
        num_fewshot=2,
        include_path=task_dir,
        include_defaults=False,
        apply_chat_template=True,
        tokenizer=tokenizer,
    )
    assert probes[0].question.startswith("<|user|>")
    expected = Scorer(tokenizer, probes)(toy.base, show_progress=False)
    assert "\n".join(lm_eval_lines(expected)) in capsys.readouterr().out


def test_a_watched_run_states_each_task_s_base_accuracy_as_lm_eval_reports_it(toy, task_dir, tmp_path, capsys):
    from forgetwatch import Watch
    from forgetwatch.page.html import write_report

    probes = ProbeSet.from_lm_eval(
        ["fw_cap", "fw_riv"], num_fewshot=3, limit=12, include_path=task_dir, include_defaults=False
    )
    watch = Watch(probes, output_dir=tmp_path / "forgetwatch", eval_steps=2)
    watch.start(toy.base, toy.tokenizer)
    watch.evaluate(toy.tuned, 2)
    watch.finish(toy.tuned, 3)
    expected = lm_eval_lines(Scorer(toy.tokenizer, probes)(toy.base, show_progress=False), "base, ")
    assert len(expected) == 2 and "\n".join(expected) in capsys.readouterr().out
    # kept with the snapshot: the report says it too
    page = write_report([tmp_path], tmp_path / "report.html").read_text()
    for line in lm_eval_lines(Scorer(toy.tokenizer, probes)(toy.base, show_progress=False)):
        assert line.removeprefix("[forgetwatch] ") in page
