"""The frameworks people post-train with, run for real with no code of the user's: Axolotl
(a YAML with the plugin), ms-swift (``swift sft`` / ``swift rlhf`` with the plugin file) and
LLaMA-Factory (``forgetwatch llamafactory``).

Each runs in its own cached environment (tests/framework_envs.py), installed from the package
index, with forgetwatch from this checkout: a tiny model that learned the toy world's facts is
post-trained on arithmetic for 6 steps, evaluated at 2, 4 and 6 (Axolotl and LLaMA-Factory
replaying a pool of other facts, the trainer found by each plugin's own route). The checks read
what the run left (history, snapshot, the framework's own log), never the exit code: Axolotl
trains on with exit code 0 when it cannot import a plugin.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from framework_envs import framework_env, framework_run

from forgetwatch import ProbeSet
from forgetwatch.results.answers import Answers
from forgetwatch.scoring import evaluate
from forgetwatch.toy import ToyWorld

pytestmark = [pytest.mark.slow, pytest.mark.framework]

AXOLOTL_PLUGIN = "forgetwatch.integrations.axolotl.ForgetWatchPlugin"
STEPS, EVERY = 6, 2
#: a threshold the arithmetic post-training crosses at its first evaluation
STOP_AT = 0.02


class World:
    """The files a run reads: a model that knows the facts, its probes, post-training data."""

    def __init__(self, root: Path):
        world = ToyWorld(seed=0)
        tokenizer = world.tokenizer()
        model = world.model(tokenizer)
        world.train(model, tokenizer, world.fact_texts(), steps=200)
        self.root, self.model, self.tokenizer = root, root / "model", tokenizer
        model.save_pretrained(self.model)
        tokenizer.save_pretrained(self.model)
        # probes on half the known countries; a replay pool of the other half's facts
        probes, pool = world.replay_split()
        self.probes = root / "probes.jsonl"
        ProbeSet.from_records(probes).to_jsonl(self.probes)
        self.pool = _jsonl(root / "pool.jsonl", pool)
        sums = [t.split(". ", 1) for t in world.distraction_texts(96)]  # "Compute a plus b", "The sum is c."
        self.text = _jsonl(root / "train.jsonl", [{"text": f"{q}. {a}"} for q, a in sums])
        chats = [[{"role": "user", "content": f"{q}."}, {"role": "assistant", "content": a}] for q, a in sums]
        self.chat = _jsonl(root / "chat.jsonl", [{"messages": m} for m in chats])
        self.preference = _jsonl(
            root / "preference.jsonl", [{"messages": m, "rejected_response": m[1]["content"][::-1]} for m in chats]
        )
        self.prompts = _jsonl(root / "prompts.jsonl", [{"messages": m[:1], "solution": m[1]["content"]} for m in chats])
        data = root / "lmf_data"
        data.mkdir()
        rows = [{"instruction": f"{q}.", "input": "", "output": a} for q, a in sums]
        (data / "sums.json").write_text(json.dumps(rows))
        (data / "dataset_info.json").write_text(json.dumps({"sums": {"file_name": "sums.json"}}))
        self.lmf_data = data

    def log(self, out: Path) -> Path:
        """A new file for what a run into ``out`` prints (kept for a failure's post-mortem)."""
        return self.root / f"{out.name}-{len(list(self.root.glob(out.name + '-*.log')))}.log"


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    return World(tmp_path_factory.mktemp("frameworks"))


# -- what every framework's run must leave ---------------------------------------------------------


def history(run_dir: Path) -> list[dict]:
    path = run_dir / "forgetwatch" / "history.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def steps(run_dir: Path) -> list[int]:
    return [record["step"] for record in history(run_dir)]


def forgotten(run_dir: Path) -> list[int]:
    return [record["report"]["forgotten"] for record in history(run_dir)]


def check_watched(run_dir: Path, printed: str, framework: str, world: World) -> None:
    """Evaluations at 2, 4, 6 over a base snapshot, said on the console; the snapshot and the
    step-2 figures are those of the model given and of the checkpoint saved at step 2, scored
    here afresh."""
    assert f"[forgetwatch] {framework} plugin loaded" in printed, printed[-3000:]
    assert steps(run_dir) == [2, 4, 6], printed[-3000:]
    base = Answers.load(run_dir / "forgetwatch" / "base_answers.npz")
    probes = ProbeSet.from_jsonl(world.probes)
    assert base.ids == probes.ids and "[forgetwatch] step 6:" in printed
    assert base.correct.tolist() == _scored(world.model, world).correct.tolist()
    at_2 = _scored(run_dir / "checkpoint-2", world)
    assert history(run_dir)[0]["report"]["forgotten"] == int(np.sum(base.correct & ~at_2.correct))


def _scored(weights: Path, world: World) -> Answers:
    from transformers import AutoModelForCausalLM

    return evaluate(AutoModelForCausalLM.from_pretrained(weights), world.tokenizer, ProbeSet.from_jsonl(world.probes))


def logged(records: list[dict], key: str = "forgetwatch/forgotten") -> dict[int, float]:
    """``key`` by step in a framework's log records (ms-swift writes ``"global_step/max_steps": "2/6"``)."""

    def step(record: dict) -> int:
        return int(record["step"] if "step" in record else str(record["global_step/max_steps"]).split("/")[0])

    return {step(r): r[key] for r in records if key in r}


# -- Axolotl ------------------------------------------------------------------------------------------


def axolotl_yaml(world: World, out: Path, **settings) -> Path:
    config = {
        "base_model": str(world.model),
        "plugins": [AXOLOTL_PLUGIN],
        "forgetwatch_probes": str(world.probes),
        "forgetwatch_eval_steps": EVERY,
        "forgetwatch_replay": str(world.pool),
        "datasets": [{"path": str(world.text), "ds_type": "json", "type": "completion"}],
        "dataset_prepared_path": str(world.root / "axolotl_prepared"),
        "sequence_len": 64,
        "micro_batch_size": 8,
        "gradient_accumulation_steps": 1,
        "max_steps": STEPS,
        "learning_rate": 1e-2,
        "optimizer": "adamw_torch",
        "lr_scheduler": "constant",
        "output_dir": str(out),
        "save_steps": EVERY,
        "logging_steps": 1,
        "use_tensorboard": True,
        "bf16": False,
        "fp16": False,
        "tf32": False,
        "val_set_size": 0,
        "seed": 0,
        "special_tokens": {"pad_token": "<pad>"},
        **settings,
    }
    path = out.with_suffix(".yaml")
    path.write_text(yaml.safe_dump(config))
    return path


def axolotl(world: World, out: Path, **settings) -> str:
    config = axolotl_yaml(world, out, **settings)
    return framework_run(framework_env("axolotl"), ["axolotl", "train", str(config)], world.root, world.log(out))


def tensorboard_scalars(run_dir: Path, key: str) -> dict[int, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found: dict[int, float] = {}
    for events in run_dir.rglob("events.out.tfevents.*"):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        if key in accumulator.Tags()["scalars"]:
            found.update({e.step: e.value for e in accumulator.Scalars(key)})
    return found


def test_axolotl_watches_stops_and_resumes(world):
    run = world.root / "axolotl_run"
    printed = axolotl(world, run)
    check_watched(run, printed, "Axolotl", world)
    # Axolotl's own logging (use_tensorboard) carries the figures at their steps, replay's too
    assert tensorboard_scalars(run, "train/forgetwatch/forgotten") == {
        r["step"]: float(r["report"]["forgotten"]) for r in history(run)
    }
    assert sorted(tensorboard_scalars(run, "train/forgetwatch/replay/loss")) == [2, 4, 6]

    stopped = world.root / "axolotl_stop"
    printed = axolotl(world, stopped, forgetwatch_max_forgetting=STOP_AT)
    assert steps(stopped) == [2], printed[-3000:]
    assert "[forgetwatch] stopping training at step 2" in printed and (stopped / "checkpoint-2").is_dir()
    assert not (stopped / "checkpoint-4").exists()

    # Axolotl's own resume: on from the checkpoint it stopped at, with the threshold lifted
    printed = axolotl(world, stopped, auto_resume_from_checkpoints=True)
    assert "base_answers.npz (loaded)" in printed, printed[-3000:]
    assert steps(stopped) == [2, 4, 6] and forgotten(stopped) == forgotten(run)  # as if never stopped


def test_axolotl_refuses_a_misspelled_setting_before_loading_a_model(world):
    out = world.root / "axolotl_typo"
    printed = axolotl(world, out, forgetwatch_eval_step=2)
    assert "key 'forgetwatch_eval_step': unknown key (did you mean 'forgetwatch_eval_steps'?)" in printed
    assert not list(out.glob("checkpoint-*")) and not (out / "forgetwatch").exists()


# -- ms-swift -----------------------------------------------------------------------------------------


def swift_arguments(world: World, out: Path, dataset: Path, max_steps: int = STEPS) -> dict:
    return {
        "model": str(world.model),
        "model_type": "llama",
        "template": "default",
        "dataset": str(dataset),
        "tuner_type": "full",
        "torch_dtype": "float32",
        "max_steps": max_steps,
        "save_steps": EVERY,
        "logging_steps": 1,
        "per_device_train_batch_size": 8,
        "learning_rate": 1e-2,
        "lr_scheduler_type": "constant",
        "warmup_ratio": 0.0,
        "max_length": 64,
        "output_dir": str(out),
        "dataloader_num_workers": 0,
        "dataset_num_proc": 1,
        "report_to": "none",
        "seed": 0,
    }


def swift(world: World, command: list[str], out: Path, env: dict[str, str] | None = None) -> str:
    bin_dir = framework_env("swift")
    offline = {"MODELSCOPE_REPO_TREE_PAGE_MAX_ATTEMPTS": "1", "MODELSCOPE_API_MAX_RETRIES": "0"}  # no network here
    return framework_run(bin_dir, ["swift", *command], world.root, world.log(out), {**offline, **(env or {})})


def swift_flags(arguments: dict) -> list[str]:
    return [item for key, value in arguments.items() for item in (f"--{key}", str(value))]


@functools.cache
def plugin_file() -> str:
    """The plugin file, as the swift environment's ``forgetwatch plugin-path swift`` prints it (asked once)."""
    bin_dir = framework_env("swift")
    printed = framework_run(bin_dir, ["forgetwatch", "plugin-path", "swift"], Path("/"), Path("/dev/null"))
    return printed.strip()


def plugin_flags() -> list[str]:
    return ["--external_plugins", plugin_file(), "--callbacks", "forgetwatch"]


def run_dirs(out: Path) -> list[Path]:
    """ms-swift's versioned run folders (``v0-<time>``, ``v1-<time>``), oldest first."""
    return sorted(out.glob("v*-*"), key=lambda p: int(p.name[1:].split("-")[0]))


def test_swift_sft_watches_stops_and_resumes(world):
    out = world.root / "swift_run"
    env = {"FORGETWATCH_PROBES": str(world.probes), "FORGETWATCH_EVAL_STEPS": str(EVERY)}
    plugin = plugin_flags()
    printed = swift(world, ["sft", *swift_flags(swift_arguments(world, out, world.chat)), *plugin], out, env)
    [run] = run_dirs(out)
    check_watched(run, printed, "ms-swift", world)
    # ms-swift's own log of the run holds the figures at their steps
    records = [json.loads(line) for line in (run / "logging.jsonl").read_text().splitlines()]
    assert logged(records) == {r["step"]: r["report"]["forgotten"] for r in history(run)}

    # settings from the YAML's ENV: block, as ms-swift documents for its own variables
    stop_out = world.root / "swift_stop"
    config = world.root / "swift_stop.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "ENV": {**env, "FORGETWATCH_MAX_FORGETTING": str(STOP_AT)},
                **swift_arguments(world, stop_out, world.chat),
                "external_plugins": plugin_file(),
                "callbacks": ["forgetwatch"],
            }
        )
    )
    printed = swift(world, ["sft", str(config)], stop_out)
    [stopped] = run_dirs(stop_out)
    assert steps(stopped) == [2], printed[-3000:]
    assert "[forgetwatch] stopping training at step 2" in printed and (stopped / "checkpoint-2").is_dir()

    # ms-swift's own resume flag: a new versioned folder goes on from the checkpoint
    resume = swift_flags(swift_arguments(world, stop_out, world.chat))
    printed = swift(
        world, ["sft", *resume, *plugin, "--resume_from_checkpoint", str(stopped / "checkpoint-2")], stop_out, env
    )
    resumed = run_dirs(stop_out)[-1]
    assert resumed != stopped and "base_answers.npz (loaded)" in printed, printed[-3000:]
    assert steps(resumed) == [2, 4, 6] and forgotten(resumed) == forgotten(run)


def test_swift_refuses_a_misspelled_setting_before_loading_a_model(world):
    out = world.root / "swift_typo"
    env = {"FORGETWATCH_PROBES": str(world.probes), "FORGETWATCH_EVAL_STEP": str(EVERY)}
    plugin = plugin_flags()
    printed = swift(world, ["sft", *swift_flags(swift_arguments(world, out, world.chat)), *plugin], out, env)
    assert "key 'FORGETWATCH_EVAL_STEP': unknown key (did you mean 'FORGETWATCH_EVAL_STEPS'?)" in printed
    assert not list(out.rglob("checkpoint-*")) and not list(out.rglob("forgetwatch"))


@pytest.mark.parametrize("kind", ["dpo", "grpo"])
def test_swift_rlhf_is_watched(world, kind):
    out = world.root / f"swift_{kind}"
    env = {"FORGETWATCH_PROBES": str(world.probes), "FORGETWATCH_EVAL_STEPS": str(EVERY)}
    arguments = swift_arguments(world, out, world.preference if kind == "dpo" else world.prompts, max_steps=4)
    extra = {
        "dpo": {"max_length": 512},
        "grpo": {"reward_funcs": "format", "num_generations": 4, "max_completion_length": 8, "max_length": 512},
    }[kind]
    arguments.update(extra, per_device_train_batch_size=4)
    plugin = plugin_flags()
    printed = swift(world, ["rlhf", "--rlhf_type", kind, *swift_flags(arguments), *plugin], out, env)
    [run] = run_dirs(out)
    assert steps(run) == [2, 4], printed[-3000:]
    assert (run / "forgetwatch" / "base_answers.npz").is_file()


# -- LLaMA-Factory ------------------------------------------------------------------------------------


def llamafactory(world: World, out: Path, **settings) -> str:
    config = {
        "model_name_or_path": str(world.model),
        "stage": "sft",
        "do_train": True,
        "finetuning_type": "full",
        "dataset": "sums",
        "dataset_dir": str(world.lmf_data),
        "template": "default",
        "cutoff_len": 64,
        "output_dir": str(out),
        "per_device_train_batch_size": 8,
        "max_steps": STEPS,
        "save_steps": EVERY,
        "logging_steps": 1,
        "learning_rate": 1e-2,
        "lr_scheduler_type": "constant",
        "report_to": "none",
        "preprocessing_num_workers": 1,
        "seed": 0,
        "forgetwatch_probes": str(world.probes),
        "forgetwatch_eval_steps": EVERY,
        "forgetwatch_replay": str(world.pool),
        **settings,
    }
    path = out.with_suffix(".yaml")
    path.write_text(yaml.safe_dump(config))
    bin_dir = framework_env("llamafactory")
    return framework_run(bin_dir, ["forgetwatch", "llamafactory", str(path)], world.root, world.log(out))


def test_llamafactory_watches_stops_and_resumes(world):
    run = world.root / "lmf_run"
    check_watched(run, llamafactory(world, run), "LLaMA-Factory", world)
    # the log LLaMA-Factory keeps (and plots from) holds the figures at their steps
    records = json.loads((run / "trainer_state.json").read_text())["log_history"]
    assert logged(records) == {r["step"]: r["report"]["forgotten"] for r in history(run)}
    assert sorted(logged(records, "forgetwatch/replay/loss")) == [2, 4, 6]  # the trainer was found for replay

    stopped = world.root / "lmf_stop"
    printed = llamafactory(world, stopped, forgetwatch_max_forgetting=STOP_AT)
    assert steps(stopped) == [2], printed[-3000:]
    assert "[forgetwatch] stopping training at step 2" in printed and (stopped / "checkpoint-2").is_dir()

    printed = llamafactory(world, stopped)  # LLaMA-Factory resumes from output_dir's last checkpoint
    assert "base_answers.npz (loaded)" in printed, printed[-3000:]
    assert steps(stopped) == [2, 4, 6] and forgotten(stopped) == forgotten(run)

    typo = world.root / "lmf_typo"
    printed = llamafactory(world, typo, forgetwatch_max_forgeting=0.1)
    assert "key 'forgetwatch_max_forgeting': unknown key (did you mean 'forgetwatch_max_forgetting'?)" in printed
    assert not list(typo.glob("checkpoint-*"))
