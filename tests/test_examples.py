"""The example scripts under examples/: every code path but the downloads, offline, on the toy model.

The hub datasets the examples use are stood in for by tiny in-memory datasets in the same
layouts (cais/mmlu, trl-lib/Capybara, trl-lib/ultrafeedback_binarized, trl-lib/tldr), and the
hub model by the toy Llama saved with a chat template.
"""

from __future__ import annotations

import ast
import copy
import functools
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from forgetwatch import ProbeSet, Scoring, compare, evaluate
from forgetwatch.toy import ToyWorld

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
# CPU, no bf16 autocast, no activation checkpointing, quiet, tiny batches
CPU = {
    "use_cpu": True,
    "activation_checkpointing": False,
    "save_strategy": "no",
    "dataloader_num_workers": 0,
    "dataloader_pin_memory": False,
    "disable_tqdm": True,
    "logging_steps": 1,
    "seed": 0,
}


@functools.cache
def example(name: str):
    """Import examples/<name>.py as a module (the folder is not a package; its scripts import
    their neighbour ``common``, as they do when run)."""
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(f"forgetwatch_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


TRAINING_EXAMPLES = ["sft_trl", "dpo_trl", "grpo_trl"]


# -- stand-ins for the hub data, in the hub layouts -----------------------------------------------


def toy_mmlu_rows(world) -> list[dict]:
    """The toy world's capital and flag questions in the cais/mmlu layout."""
    return [
        {
            "question": r["question"] + "?",
            "subject": f"toy_{r['category']}",
            "choices": r["choices"],
            "answer": r["answer"],
        }
        for r in world.probe_records(generative=False)
    ]


def arithmetic(world, n: int = 32) -> list[tuple[str, str]]:
    """(question, answer) pairs from the toy world's arithmetic: 'Compute a plus b.', 'The sum is c.'"""
    return [tuple(t.split(". ", 1)) for t in world.distraction_texts(n=n)]


def capybara_rows(world) -> list[dict]:
    """trl-lib/Capybara: a ``messages`` conversation (some multi-turn) and a ``source``."""
    pairs = arithmetic(world)
    rows = []
    for i in range(0, len(pairs) - 1, 2):
        turns = pairs[i : i + 1 + i % 4 // 2]  # alternately one and two exchanges
        messages = [
            m for q, a in turns for m in ({"role": "user", "content": q + "."}, {"role": "assistant", "content": a})
        ]
        rows.append({"source": "toy", "messages": messages})
    return rows


def ultrafeedback_rows(world, explicit_prompt: bool) -> list[dict]:
    """trl-lib/ultrafeedback_binarized: ``chosen`` / ``rejected`` conversations sharing the user
    turn (implicit prompt) and scores; or the explicit-prompt layout other datasets use."""
    rows = []
    for q, a in arithmetic(world, n=16):
        wrong = a.replace("sum is", "sum is not")
        user = [{"role": "user", "content": q + "."}]
        if explicit_prompt:
            rows.append(
                {
                    "prompt": user,
                    "chosen": [{"role": "assistant", "content": a}],
                    "rejected": [{"role": "assistant", "content": wrong}],
                }
            )
        else:
            rows.append(
                {
                    "chosen": user + [{"role": "assistant", "content": a}],
                    "rejected": user + [{"role": "assistant", "content": wrong}],
                    "score_chosen": 8.0,
                    "score_rejected": 2.0,
                }
            )
    return rows


def tldr_rows(world, conversational: bool) -> list[dict]:
    """trl-lib/tldr: a plain-text ``prompt`` ending in 'TL;DR:' and a reference ``completion``;
    or the same prompt as a user turn."""
    rows = []
    for q, a in arithmetic(world, n=16):
        post = f"SUBREDDIT: r/toy\n\nTITLE: {q}\n\nPOST: {q} {a}\n\nTL;DR:"
        prompt = [{"role": "user", "content": post}] if conversational else post
        rows.append({"prompt": prompt, "completion": f" {a}"})
    return rows


@pytest.fixture(scope="module")
def chat_tokenizer(toy):
    tokenizer = copy.deepcopy(toy.tokenizer)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


@pytest.fixture(scope="module")
def chat_model_dir(toy, chat_tokenizer, tmp_path_factory) -> str:
    """The toy base model saved with a chat-template tokenizer: what main() loads by path."""
    path = tmp_path_factory.mktemp("chat_model") / "model"
    shutil.copytree(toy.base_dir, path)
    chat_tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def mmlu_probes(toy) -> ProbeSet:
    return example("sft_trl").build_probes(toy_mmlu_rows(toy.world), n=16)


def history_steps(trainer) -> list[int]:
    return [step for step, _ in trainer.forgetwatch.history]


def check_run(trainer, probes, chat_tokenizer, toy, steps):
    """History at the expected steps, on disk too; base scored with the chat template; summary."""
    callback = trainer.forgetwatch
    assert history_steps(trainer) == steps
    assert callback.config.scoring.chat_template is True
    expected = evaluate(toy.base, chat_tokenizer, probes, scoring=Scoring(chat_template=True), show_progress=False)
    np.testing.assert_allclose(callback.base_answers.gold_logprob, expected.gold_logprob, rtol=1e-4, atol=1e-4)
    path = Path(trainer.args.output_dir) / "forgetwatch" / "history.jsonl"
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == steps
    text = trainer.forgetwatch.summary()
    assert callback.history[-1][1].summary() in text
    assert f"history: {path}" in text
    assert "stopped early" not in text


# -- every script's command line -----------------------------------------------------------------

# every script under examples/ and benchmarks/, found anew so that a new one is covered; common.py and
# real_world.py (the examples') and skill_world.py (the replay benchmark's world) are shared modules, not scripts
SCRIPTS = sorted(
    p
    for folder in ("examples", "benchmarks")
    for p in (ROOT / folder).glob("*.py")
    if p.name not in ("common.py", "real_world.py", "skill_world.py")
)
# run as `python SCRIPT ARGS...`, but with these modules made unimportable: a script that loads
# them before reading its arguments fails, instead of answering --help seconds later
HEAVY = ("torch", "transformers", "datasets", "trl", "peft", "lm_eval")
AS_SCRIPT = (
    "import os, runpy, sys\n"
    f"sys.modules.update(dict.fromkeys({HEAVY!r}))\n"
    "sys.argv = sys.argv[1:]\n"
    "sys.path.insert(0, os.path.dirname(sys.argv[0]))\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


def run_script(script: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-c", AS_SCRIPT, str(script), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_scripts_are_found():
    names = {p.name for p in SCRIPTS}
    assert {"sft_trl.py", "make_toy_checkpoints.py", "bench_scoring.py"} <= names and len(names) >= 10


def documented_command_lines(script: Path) -> list[str]:
    """The ``python <script> ...`` lines of the script's docstring, without their comments."""
    doc = ast.get_docstring(ast.parse(script.read_text(encoding="utf-8"))) or ""
    return [line.split("#")[0].strip() for line in doc.splitlines() if line.strip().startswith("python ")]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_script_answers_help_and_mistakes_before_any_work(script, tmp_path):
    shown = run_script(script, "--help", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"usage: {script.name}"), shown.stdout
    documented = documented_command_lines(script)
    assert documented, f"{script.name}: its docstring shows no command line"
    for line in documented:  # the documented command lines name this script and its real options
        assert line.split()[1] == f"{script.parent.name}/{script.name}", line
        for flag in re.findall(r"--[\w-]+", line):
            assert flag in shown.stdout, f"{script.name}: {line}: {flag} is not an option"
    mistaken = run_script(script, "--no-such-option", cwd=tmp_path)
    assert mistaken.returncode == 2, mistaken.stderr
    assert "unrecognized arguments: --no-such-option" in mistaken.stderr
    assert list(tmp_path.iterdir()) == []  # nothing created: no folder named --help


# -- build_probes ---------------------------------------------------------------------------------

MMLU_ROWS = [
    {"question": "What is 2 + 2?", "subject": "elementary_mathematics", "choices": ["3", "4", "5", "6"], "answer": 1},
    {
        "question": "Which planet is the largest?\n",
        "subject": "astronomy",
        "choices": ["Mars", "Jupiter", "Venus", "Earth"],
        "answer": 1,
    },
    {"question": "What is 3 * 3?", "subject": "elementary_mathematics", "choices": ["6", "9", "12", "3"], "answer": 1},
    {
        "question": "What is the Sun?",
        "subject": "astronomy",
        "choices": ["A star", "A planet", "A moon", "A comet"],
        "answer": 0,
    },
    {"question": "What is 10 - 7?", "subject": "elementary_mathematics", "choices": ["2", "3", "4", "7"], "answer": 1},
]


@pytest.mark.parametrize("name", TRAINING_EXAMPLES)
@pytest.mark.parametrize("as_dataset", [False, True])
def test_build_probes_uses_lm_eval_mmlu_prompts(name, as_dataset):
    build_probes = example(name).build_probes
    rows = datasets.Dataset.from_list(MMLU_ROWS) if as_dataset else MMLU_ROWS
    probes = build_probes(rows, n=500)  # fewer rows than asked: all of them
    assert len(probes) == 5
    assert probes.categories == ["astronomy", "elementary_mathematics"]
    first, second = probes[0], probes[1]
    assert first.question == (
        "The following are multiple choice questions (with answers) about elementary "
        "mathematics.\n\nWhat is 2 + 2?\nA. 3\nB. 4\nC. 5\nD. 6\nAnswer:"
    )
    assert second.question == (
        "The following are multiple choice questions (with answers) about astronomy."
        "\n\nWhich planet is the largest?\nA. Mars\nB. Jupiter\nC. Venus\nD. Earth\nAnswer:"
    )
    assert first.choices == ("A", "B", "C", "D") and first.answer == 1
    assert first.category == "elementary_mathematics" and first.id == "mmlu/elementary_mathematics/0"

    small = build_probes(rows, n=2, seed=0)  # stratified: one per subject, deterministic
    assert len(small) == 2 and small.categories == ["astronomy", "elementary_mathematics"]
    assert small.ids == build_probes(rows, n=2, seed=0).ids


# -- SFT ------------------------------------------------------------------------------------------


def toy_trainer(name, model, rows, output_dir, probes, tokenizer, **settings):
    """examples/<name>.py's ``build_trainer`` on the CPU with a stand-in dataset: 4 steps,
    evaluations at 2 and 4 unless ``settings`` say otherwise."""
    settings = {"max_steps": 4, "eval_steps": 2, "learning_rate": 1e-3, **CPU, **settings}
    data = datasets.Dataset.from_list(rows)
    return example(name).build_trainer(model, tokenizer, data, probes, str(output_dir), **settings)


@pytest.mark.slow
def test_sft_example_on_capybara_layout(toy, chat_tokenizer, mmlu_probes, tmp_path):
    rows = capybara_rows(toy.world)
    small = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 1, "max_length": 64}
    trainer = toy_trainer(
        "sft_trl", copy.deepcopy(toy.base), rows, tmp_path, mmlu_probes, chat_tokenizer, max_forgetting=0.9, **small
    )
    assert isinstance(trainer, trl.SFTTrainer)
    assert trainer.args.report_to == []  # "none" by default
    assert trainer.forgetwatch.config.max_forgetting == 0.9
    trainer.train()
    check_run(trainer, mmlu_probes, chat_tokenizer, toy, [2, 4])
    assert any("loss" in e for e in trainer.state.log_history)


# -- DPO ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("explicit_prompt", [False, True], ids=["implicit_prompt", "explicit_prompt"])
@pytest.mark.slow
def test_dpo_example_on_ultrafeedback_layout(toy, chat_tokenizer, mmlu_probes, tmp_path, explicit_prompt):
    rows = ultrafeedback_rows(toy.world, explicit_prompt)
    small = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 1, "max_length": 64}
    trainer = toy_trainer("dpo_trl", toy.base_dir, rows, tmp_path, mmlu_probes, chat_tokenizer, **small)
    assert isinstance(trainer, trl.DPOTrainer)
    assert trainer.ref_model is not None  # built by TRL from the path
    trainer.train()
    check_run(trainer, mmlu_probes, chat_tokenizer, toy, [2, 4])


# -- GRPO -----------------------------------------------------------------------------------------


def test_length_reward_scores_words_for_plain_and_conversational_completions():
    grpo = example("grpo_trl")
    reward = grpo.make_length_reward(4)
    completions = ["one two three four", "one two", [{"role": "assistant", "content": "a b c d e f g h i j"}]]
    assert reward(completions, prompts=["p"] * 3, completion=["ref"] * 3) == [1.0, 0.5, -0.5]
    assert grpo.make_length_reward()(["w " * 20]) == [1.0]


@pytest.mark.parametrize("conversational", [False, True], ids=["plain_prompt", "conversational_prompt"])
@pytest.mark.slow
def test_grpo_example_on_tldr_layout(toy, chat_tokenizer, mmlu_probes, tmp_path, conversational):
    rows = tldr_rows(toy.world, conversational)
    small = {"per_device_train_batch_size": 4, "num_generations": 2, "max_completion_length": 8}
    model = copy.deepcopy(toy.base)
    trainer = toy_trainer("grpo_trl", model, rows, tmp_path, mmlu_probes, chat_tokenizer, target_words=3, **small)
    assert isinstance(trainer, trl.GRPOTrainer)
    assert not trainer.args.use_vllm
    trainer.train()
    check_run(trainer, mmlu_probes, chat_tokenizer, toy, [2, 4])
    rewards = [e for e in trainer.state.log_history if "rewards/length_reward/mean" in e]
    assert [e["step"] for e in rewards] == [1, 2, 3, 4]


# -- summaries and main() -------------------------------------------------------------------------


@pytest.mark.slow
def test_summarize_reports_an_early_stop_and_a_run_without_evaluations(toy, chat_tokenizer, mmlu_probes, tmp_path):
    rows = capybara_rows(toy.world)
    trainer = toy_trainer(
        "sft_trl",
        copy.deepcopy(toy.base),
        rows,
        tmp_path / "a",
        mmlu_probes,
        chat_tokenizer,
        max_steps=40,
        max_forgetting=0.0,
        learning_rate=1e-2,
    )
    trainer.train()
    text = trainer.forgetwatch.summary()
    step = trainer.state.global_step
    assert step < 40 and trainer.forgetwatch.history[-1][1].forgetting > 0  # stopped at the first forgetting
    assert f"forgetwatch stopped training at step {step}: forgetting" in text
    assert f"history: {tmp_path / 'a' / 'forgetwatch' / 'history.jsonl'}" in text
    quiet = toy_trainer(
        "sft_trl", copy.deepcopy(toy.base), rows, tmp_path / "b", mmlu_probes, chat_tokenizer, max_steps=2, eval_steps=5
    )
    config = quiet.forgetwatch.config
    monitor = config.monitor.model_copy(update={"eval_on_train_end": False})
    quiet.forgetwatch.watch.config = config.model_copy(update={"monitor": monitor})
    quiet.train()
    assert "forgetwatch has not evaluated yet" in quiet.forgetwatch.summary()


@pytest.mark.parametrize("name", TRAINING_EXAMPLES)
def test_probes_is_a_sample_size_or_a_probe_file(name, toy, tmp_path, monkeypatch, capsys):
    parse_args = example(name).parse_args
    monkeypatch.chdir(tmp_path)
    defaults = vars(parse_args([]))
    assert defaults["probes"] == 500
    assert {k: defaults[k] for k in example(name).DEFAULTS} == example(name).DEFAULTS  # the trainer's defaults
    assert parse_args(["--probes", "12"]).probes == 12
    toy.probes.to_jsonl(tmp_path / "mine.jsonl")
    loaded = parse_args(["--probes", "mine.jsonl"]).probes
    assert isinstance(loaded, ProbeSet) and loaded.ids == toy.probes.ids
    (tmp_path / "bad.jsonl").write_text('{"id": "q1", "question": "2+2="}\n', encoding="utf-8")
    for value, error in [
        ("missing.jsonl", "argument --probes: no such file: missing.jsonl"),
        (".", "argument --probes: no such file: ."),
        ("0", "argument --probes: 0: give at least 1 probe"),
        ("bad.jsonl", "argument --probes: bad.jsonl: line 1: field 'answer'"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            parse_args(["--probes", value])
        assert exit_info.value.code == 2
        assert error in capsys.readouterr().err


def fake_load_dataset(world, train_rows):
    """Stands in for datasets.load_dataset: MMLU and the training set from memory."""
    calls = []

    def load_dataset(path, name=None, split=None, **kwargs):
        calls.append((path, name, split))
        if path == "cais/mmlu":
            assert (name, split) == ("all", "test")
            return datasets.Dataset.from_list(toy_mmlu_rows(world))
        assert split == "train"
        return datasets.Dataset.from_list(train_rows)

    return load_dataset, calls


SMALL_BATCH = ["--batch-size", "4", "--grad-accum", "1", "--max-length", "64"]


@pytest.mark.parametrize(
    "name, rows, extra",
    [
        ("sft_trl", capybara_rows, SMALL_BATCH),
        ("sft_trl", capybara_rows, [*SMALL_BATCH, "--lora"]),
        ("sft_trl", capybara_rows, [*SMALL_BATCH, "--probes", "probes.jsonl"]),
        ("dpo_trl", lambda w: ultrafeedback_rows(w, False), SMALL_BATCH),
        (
            "grpo_trl",
            lambda w: tldr_rows(w, False),
            ["--batch-size", "4", "--num-generations", "2", "--max-completion-length", "8", "--target-words", "3"],
        ),
    ],
)
@pytest.mark.slow
def test_main_end_to_end_with_local_model_and_data(
    name, rows, extra, toy, chat_model_dir, tmp_path, monkeypatch, capsys
):
    module = example(name)
    load_dataset, calls = fake_load_dataset(toy.world, rows(toy.world))
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.chdir(tmp_path)
    own = ProbeSet.from_records(toy.world.probe_records(generative=False)[:10], source="own")
    own.to_jsonl(tmp_path / "probes.jsonl")
    trainer = module.main(
        [
            "--model",
            chat_model_dir,
            "--output-dir",
            str(tmp_path),
            "--max-steps",
            "2",
            "--eval-steps",
            "1",
            "--probes",
            "12",
            "--learning-rate",
            "1e-3",
            "--cpu",
            *extra,
        ]
    )
    if "probes.jsonl" in extra:  # the file's probes, and no MMLU download
        assert calls == [(module.DATASET, None, "train")]
        assert trainer.forgetwatch.watch.probes.ids == own.ids
    else:
        assert calls == [("cais/mmlu", "all", "test"), (module.DATASET, None, "train")]
        assert len(trainer.forgetwatch.watch.probes) == 12
    assert history_steps(trainer) == [1, 2]
    assert trainer.args.use_cpu and trainer.args.report_to == []
    out = capsys.readouterr().out
    assert trainer.forgetwatch.history[-1][1].summary() in out
    assert f"history: {tmp_path / 'forgetwatch' / 'history.jsonl'}" in out
    assert (tmp_path / "forgetwatch" / "history.jsonl").is_file()
    lora = "--lora" in extra
    assert hasattr(trainer.model, "peft_config") is lora
    assert (trainer.forgetwatch.base_answers.meta.get("base") == "adapter_disabled") is lora


# -- replay on forgetting -------------------------------------------------------------------------


def test_the_replay_pool_is_the_other_half_of_the_facts():
    replay = example("replay_on_forgetting")
    world = ToyWorld(seed=0)
    probes, pool = replay.split_world(world)
    pool.check_disjoint(probes)  # no probe question in the pool
    probed = {p.id.split("/", 1)[1] for p in probes}
    pooled = {r.id.split("/", 1)[1] for r in pool}
    assert probed and pooled and not probed & pooled  # disjoint countries, not only disjoint text
    assert sorted(pool.categories) == ["capitals", "colors", "rivers"]


@pytest.mark.slow
def test_replay_main_runs_offline_and_compares_both_runs(tmp_path, capsys):
    replay = example("replay_on_forgetting")
    trainers = replay.main(
        ["--output-dir", str(tmp_path), "--base-steps", "120", "--max-steps", "10", "--eval-steps", "5"]
    )
    out = capsys.readouterr().out
    assert "without replay" in out and "with replay" in out and "forgetting (right at the base" in out
    plain, repaired = trainers["without replay"], trainers["with replay"]
    assert [s for s, _ in plain.forgetwatch.history] == [s for s, _ in repaired.forgetwatch.history] == [5, 10]
    logged = [e for e in repaired.state.log_history if "forgetwatch/replay/loss" in e]
    assert [e["step"] for e in logged] == [5, 10]
    assert not any("forgetwatch/replay/loss" in e for e in plain.state.log_history)
    (hook,) = [s.hook for s in repaired.forgetwatch.watch._their_sinks]
    assert sorted(hook.by_step) == [5, 10]
    assert hook.by_step[10] == repaired.forgetwatch.history[-1][1].at_risk_ids


# -- tool use during SFT ------------------------------------------------------------------------


@pytest.mark.slow
def test_tool_use_main_watches_the_calls_and_counts_as_a_recount(tmp_path, capsys):
    tool_use = example("tool_use_sft")
    run = tool_use.main(["--output-dir", str(tmp_path), "--max-steps", "10", "--eval-steps", "5"])
    callback, probes, base = run["callback"], run["probes"], run["base"]
    assert [s for s, _ in callback.history] == [5, 10]
    assert base.accuracy > 0.5  # the taught calls are right before fine-tuning
    now = evaluate(
        run["trainer"].model, callback.watch.view.tokenizer, probes, scoring=Scoring(behaviour_max_new_tokens=32)
    )
    report = callback.history[-1][1]
    assert report.forgotten_ids == compare(base, now).forgotten_ids
    out = capsys.readouterr().out
    assert "tool calls at step 10" in out
    for pid in report.forgotten_ids:
        assert f"{pid}: expected " in out
