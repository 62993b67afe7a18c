"""forgetwatch's settings as Axolotl / LLaMA-Factory keys and ms-swift environment variables:
checked by the config's own rules, named as the user wrote them, before any model work.
(The frameworks themselves run in tests/test_frameworks.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from forgetwatch import ForgetWatchCallback
from forgetwatch.cli import main
from forgetwatch.config import FLAT_KEYS, ConfigError, ForgetWatchConfig
from forgetwatch.integrations.framework_settings import FrameworkSettings
from forgetwatch.integrations.swift import PLUGIN_FILE
from forgetwatch.probes import ProbeError, ProbeSet
from forgetwatch.probes.lm_eval_tasks import LmEvalProbes

ROOT = Path(__file__).resolve().parents[1]
PROBES = str(ROOT / "configs" / "probes" / "general_knowledge.jsonl")
CONFIG = str(ROOT / "configs" / "early_stop_adjusted_5pct.yaml")


def test_keys_become_the_config_and_the_probes_are_loaded():
    settings = FrameworkSettings.from_keys(
        {
            "base_model": "x",  # the framework's own: not ours
            "forgetwatch_probes": PROBES,
            "forgetwatch_eval_steps": 7,
            "forgetwatch_max_forgetting": 0.1,
            "forgetwatch_batch_size": 4,
        },
        "train.yaml",
    )
    config = settings.config
    assert (config.eval_steps, config.max_forgetting, config.scoring.batch_size) == (7, 0.1, 4)
    assert settings.probes.ids == ProbeSet.from_jsonl(PROBES).ids
    callback = settings.callback()
    assert isinstance(callback, ForgetWatchCallback)
    # the probes as loaded, the rest of the settings as the keys gave them
    assert callback.config == config.model_copy(update={"probes": None}) and callback.watch.probes is settings.probes


def test_a_forgetwatch_yaml_is_overridden_by_the_keys_beside_it():
    settings = FrameworkSettings.from_keys({"forgetwatch_config": CONFIG, "forgetwatch_patience": 5}, "train.yaml")
    config = settings.config
    monitor = config.monitor
    assert (config.max_forgetting, monitor.stop_metric, monitor.patience) == (0.05, "forgetting_adjusted", 5)
    assert settings.probes.ids == ProbeSet.from_jsonl(ROOT / "configs" / "probes" / "general_knowledge.jsonl").ids


def test_every_setting_has_a_key():
    for key in FLAT_KEYS:
        with pytest.raises(ConfigError) as caught:
            FrameworkSettings.from_keys({f"forgetwatch_{key}": object()}, "train.yaml")
        # named as the framework's key, and known (no did-you-mean)
        assert [e.key for e in caught.value.errors] == [f"forgetwatch_{key}"], key
        assert "did you mean" not in str(caught.value), key


@pytest.mark.parametrize(
    "values, key",
    [
        ({"forgetwatch_probes": PROBES, "forgetwatch_eval_step": 5}, "forgetwatch_eval_step"),
        ({"forgetwatch_probes": PROBES, "forgetwatch_eval_steps": "abc"}, "forgetwatch_eval_steps"),
        ({"forgetwatch_probes": PROBES, "forgetwatch_max_forgetting": "5%"}, "forgetwatch_max_forgetting"),
        ({"forgetwatch_eval_steps": 5}, "forgetwatch_probes"),  # none given
        ({"forgetwatch_config": 3}, "forgetwatch_config"),
    ],
)
def test_a_wrong_key_is_one_error_naming_it_as_written(values, key):
    with pytest.raises(ConfigError) as caught:
        FrameworkSettings.from_keys(values, "train.yaml")
    assert [(e.source, e.key) for e in caught.value.errors] == [("train.yaml", key)]
    assert "did you mean 'forgetwatch_eval_steps'" in str(caught.value) or key != "forgetwatch_eval_step"


def test_errors_in_the_forgetwatch_yaml_name_its_file_and_line(tmp_path):
    config = tmp_path / "fw.yaml"
    config.write_text(f"probes: {PROBES}\neval_steps: 0\n")
    with pytest.raises(ConfigError) as caught:
        FrameworkSettings.from_keys({"forgetwatch_config": str(config)}, "train.yaml")
    assert [e[:3] for e in caught.value.errors] == [(str(config), 2, "eval_steps")]


def test_a_bad_probe_file_is_named_before_any_model_work(tmp_path):
    probes = tmp_path / "probes.jsonl"
    probes.write_text(json.dumps({"id": "a", "question": "Q?"}) + "\n")
    with pytest.raises(ProbeError) as caught:
        FrameworkSettings.from_keys({"forgetwatch_probes": str(probes)}, "train.yaml")
    assert [e[:3] for e in caught.value.errors] == [(str(probes), 1, "answer")]


def test_a_replay_pool_holding_a_probe_question_is_refused(tmp_path):
    question = ProbeSet.from_jsonl(PROBES)[0].question
    pool = tmp_path / "pool.jsonl"
    pool.write_text(json.dumps({"id": "r1", "text": f"{question} yes"}) + "\n")
    probe_id = ProbeSet.from_jsonl(PROBES)[0].id
    with pytest.raises(ValueError, match=rf"'r1'.*'{probe_id}'"):  # the row and the probe
        FrameworkSettings.from_keys({"forgetwatch_probes": PROBES, "forgetwatch_replay": str(pool)}, "t.yaml")
    pool.write_text(json.dumps({"id": "r1", "text": "Something else entirely."}) + "\n")
    settings = FrameworkSettings.from_keys({"forgetwatch_probes": PROBES, "forgetwatch_replay": str(pool)}, "t.yaml")
    assert settings.replay is not None and len(settings.replay.pool) == 1


def test_merge_settings_make_a_merge_at_end_or_one_error_naming_the_key(tmp_path):
    texts = tmp_path / "held_out.jsonl"
    texts.write_text(json.dumps({"text": "12 + 30 = 42"}) + "\n" + json.dumps({"text": "7 * 6 = 42"}) + "\n")
    keys = {"forgetwatch_probes": PROBES, "forgetwatch_merge_target_texts": str(texts), "forgetwatch_merge_keep": 0.8}
    settings = FrameworkSettings.from_keys({**keys, "forgetwatch_merge_save": True}, "t.yaml")
    merge = settings.callback().merge_at_end
    assert merge.target == ["12 + 30 = 42", "7 * 6 = 42"] and merge.keep == 0.8 and merge.save
    assert "merging with the base at the end" in settings.describe("Axolotl")
    env = FrameworkSettings.from_environ(
        {"FORGETWATCH_PROBES": PROBES, "FORGETWATCH_MERGE_TARGET_PROBES": PROBES, "FORGETWATCH_MERGE_ALPHAS": "[0.5]"}
    )
    assert env.merge.alphas == [0.0, 0.5, 1.0] and len(env.merge.target) == len(env.probes)
    probes = {"forgetwatch_probes": PROBES}
    gone = str(tmp_path / "gone.jsonl")
    for given, key in [
        ({**probes, "forgetwatch_merge_keep": 0.8}, "forgetwatch_merge_keep"),  # no target
        ({**keys, "forgetwatch_merge_target_probes": PROBES}, "forgetwatch_merge_target_texts"),  # two targets
        ({**keys, "forgetwatch_merge_keep": 2}, "forgetwatch_merge_keep"),
        ({**keys, "forgetwatch_merge_save": "yes"}, "forgetwatch_merge_save"),
        ({**keys, "forgetwatch_merge_alphas": [2]}, "forgetwatch_merge_alphas"),
        ({**keys, "forgetwatch_merge_target_texts": gone}, "forgetwatch_merge_target_texts"),
    ]:
        with pytest.raises(ConfigError) as err:
            FrameworkSettings.from_keys(given, "t.yaml")
        assert [e.key for e in err.value.errors] == [key]


def test_relative_paths_are_taken_from_the_folder_of_the_file_that_names_them(tmp_path, monkeypatch):
    rows = [json.loads(line) for line in Path(PROBES).read_text().splitlines()]
    here, there = tmp_path / "configs", tmp_path / "elsewhere"
    for folder, n in ((here, 4), (there, 2)):  # the same names in the working directory: decoys
        (folder / "sub").mkdir(parents=True)
        (folder / "probes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:n]))
        (folder / "sub" / "probes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[: n + 1]))
        (folder / "held.jsonl").write_text(json.dumps({"text": f"held out in {folder.name}"}) + "\n")
        (folder / "pool.jsonl").write_text(json.dumps({"id": "r", "text": f"pool of {folder.name}"}) + "\n")
        (folder / "sub" / "fw.yaml").write_text("probes: probes.jsonl\neval_steps: 3\n")  # the YAML's own folder
    monkeypatch.chdir(there)
    train = here / "train.yaml"
    names = {"probes": "probes.jsonl", "merge_target_texts": "held.jsonl", "replay": "pool.jsonl"}
    settings = FrameworkSettings.from_keys({f"forgetwatch_{k}": v for k, v in names.items()}, str(train), train)
    assert len(settings.probes) == 4 and settings.config.probes == str(here / "probes.jsonl")
    assert settings.merge.target == ["held out in configs"] and settings.replay.pool[0].text == "pool of configs"
    nested = FrameworkSettings.from_keys({"forgetwatch_config": "sub/fw.yaml"}, str(train), train)
    assert len(nested.probes) == 5 and nested.config.eval_steps == 3  # config from train.yaml's folder, probes from its
    # no file names them (the environment, ms-swift): the working directory
    env = FrameworkSettings.from_environ({f"FORGETWATCH_{k.upper()}": v for k, v in names.items()})
    assert len(env.probes) == 2 and env.merge.target == ["held out in elsewhere"]


def test_a_path_typed_on_the_llamafactory_command_line_is_the_working_directorys(tmp_path, monkeypatch):
    import sys
    import types

    from forgetwatch.integrations.llamafactory import run

    rows = Path(PROBES).read_text().splitlines(keepends=True)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "probes.jsonl").write_text("".join(rows[:4]))
    (tmp_path / "probes.jsonl").write_text("".join(rows[:2]))
    train = tmp_path / "configs" / "train.yaml"
    train.write_text("stage: sft\nforgetwatch_probes: probes.jsonl\n")
    monkeypatch.chdir(tmp_path)

    def read_args():  # as LLaMA-Factory's: the YAML, then key=value from the command line over it
        args = yaml.safe_load(Path(sys.argv[1]).read_text())
        return {**args, **dict(item.split("=", 1) for item in sys.argv[2:])}

    started = []
    parser = types.SimpleNamespace(read_args=read_args)
    tuner = types.SimpleNamespace(run_exp=lambda args, callbacks: started.append(callbacks[0]))
    for name in ("llamafactory", "llamafactory.hparams", "llamafactory.train"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "llamafactory.hparams.parser", parser)
    monkeypatch.setitem(sys.modules, "llamafactory.train.tuner", tuner)
    monkeypatch.setattr(sys, "argv", ["forgetwatch"])
    run(str(train))
    run(str(train), ["forgetwatch_probes=probes.jsonl"])
    assert [len(callback.watch.probes) for callback in started] == [4, 2]


def test_lm_eval_task_names_are_probes():
    tasks = ROOT / "configs" / "lm_eval_tasks"
    settings = FrameworkSettings.from_keys(
        {"forgetwatch_probes": {"lm_eval": ["fw_small"], "include_path": str(tasks), "limit": 3}}, "t.yaml"
    )
    assert isinstance(settings.config.probes, LmEvalProbes)
    assert "probes (lm-eval: fw_small), evaluating" in settings.describe("Axolotl")
    assert {p.category for p in settings.probes} == {"fw_general_knowledge", "fw_arithmetic"}


def test_environment_variables_are_read_as_yaml_values_and_named_as_set():
    settings = FrameworkSettings.from_environ(
        {
            "PATH": "/bin",
            "FORGETWATCH_PROBES": PROBES,
            "FORGETWATCH_EVAL_STEPS": "2",
            "FORGETWATCH_MAX_FORGETTING": "0.25",
            "FORGETWATCH_LOG_CATEGORIES": "false",
        }
    )
    assert settings.config.eval_steps == 2 and settings.config.max_forgetting == 0.25
    assert settings.config.output.log_categories is False
    with pytest.raises(ConfigError) as caught:
        FrameworkSettings.from_environ(
            {"FORGETWATCH_PROBES": PROBES, "FORGETWATCH_MAX_FORGETING": "0.1", "FORGETWATCH_EVAL_STEPS": "[1"}
        )
    assert [(e.source, e.key) for e in caught.value.errors] == [
        ("environment", "FORGETWATCH_EVAL_STEPS"),  # YAML syntax
        ("environment", "FORGETWATCH_MAX_FORGETING"),
    ]
    assert "did you mean 'FORGETWATCH_MAX_FORGETTING'" in caught.value.errors[1].message
    with pytest.raises(ConfigError) as caught:
        FrameworkSettings.from_environ({})
    assert [(e.source, e.key) for e in caught.value.errors] == [("environment", "FORGETWATCH_PROBES")]


def test_environment_values_are_read_by_yaml_1_2_and_checked_by_the_settings_type():
    def read(**env: str) -> ForgetWatchConfig:
        return FrameworkSettings.from_environ({"FORGETWATCH_PROBES": PROBES, **env}).config

    assert read(FORGETWATCH_EVAL_STEPS="010").eval_steps == 10  # decimal, not octal 8
    assert read(FORGETWATCH_MAX_OVERHEAD="5e-2").monitor.max_overhead == 0.05
    assert read(FORGETWATCH_MAX_FORGETTING="null").max_forgetting is None
    for env in [
        {"FORGETWATCH_EVAL_STEPS": "1:30"},  # text, not 90
        {"FORGETWATCH_LOG_CATEGORIES": "yes"},  # text, not true
        {"FORGETWATCH_MAX_FORGETTING": ""},  # set but empty
        {"FORGETWATCH_MAX_FORGETTING": " "},
        {"FORGETWATCH_EVAL_STEPS": "9" * 5000},
        {"forgetwatch_eval_steps": "5"},  # environment variables are upper case
        {"Forgetwatch_Eval_Step": "5"},
    ]:
        with pytest.raises(ConfigError) as caught:
            read(**env)
        assert [(e.source, e.key) for e in caught.value.errors] == [("environment", *env)], env
    with pytest.raises(ConfigError, match="'FORGETWATCH_EVAL_STEPS'"):  # the spelling to use
        read(Forgetwatch_Eval_Step="5")


def test_mixed_case_keys_are_named_with_their_spelling():
    with pytest.raises(ConfigError) as caught:
        FrameworkSettings.from_keys({"forgetwatch_probes": PROBES, "Forgetwatch_Eval_Steps": 5}, "train.yaml")
    assert [(e.source, e.key) for e in caught.value.errors] == [("train.yaml", "Forgetwatch_Eval_Steps")]
    assert "'forgetwatch_eval_steps'" in str(caught.value)  # the spelling to use


def test_a_framework_yaml_value_yaml_1_1_reads_otherwise_is_named_at_its_line(tmp_path):
    train = tmp_path / "train.yaml"
    train.write_text(
        f"base_model: x\nlearning_rate: 0.1\nforgetwatch_probes: {PROBES}\nforgetwatch_eval_steps: 1:30\n"
        "forgetwatch_patience: 010\nforgetwatch_verbose: 'yes'\n"
    )
    values = yaml.safe_load(train.read_text())  # as Axolotl reads it: 90, 8
    assert (values["forgetwatch_eval_steps"], values["forgetwatch_patience"]) == (90, 8)
    with pytest.raises(ConfigError) as caught:
        FrameworkSettings.from_keys(values, str(train), config_file=train)
    assert [e[:3] for e in caught.value.errors] == [
        (str(train), 4, "forgetwatch_eval_steps"),
        (str(train), 5, "forgetwatch_patience"),
    ]
    assert "1:30" in caught.value.errors[0].message and "90" in caught.value.errors[0].message  # as written; as read
    # a value overridden since (LLaMA-Factory's key=value) is not the file's
    values.update(forgetwatch_eval_steps=5, forgetwatch_patience=3, forgetwatch_verbose=True)
    config = FrameworkSettings.from_keys(values, str(train), config_file=train).config
    assert (config.eval_steps, config.monitor.patience) == (5, 3)


def test_the_first_console_line_says_what_the_plugin_will_do():
    settings = FrameworkSettings.from_keys(
        {"forgetwatch_probes": PROBES, "forgetwatch_eval_steps": 50, "forgetwatch_max_forgetting": 0.1}, "t.yaml"
    )
    count = len(ProbeSet.from_jsonl(PROBES))
    assert settings.describe("Axolotl") == (
        f"[forgetwatch] Axolotl plugin loaded: {count} probes ({PROBES}), evaluating every 50 steps, "
        "stopping above 10.0% forgetting; results in the run's output_dir/forgetwatch"
    )


def test_the_command_line_prints_the_swift_plugin_file(capsys):
    assert main(["plugin-path", "swift"]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == str(PLUGIN_FILE) and PLUGIN_FILE.is_file()
    assert PLUGIN_FILE.name != "forgetwatch.py"  # ms-swift puts its folder first on sys.path
    assert sorted(p.name for p in PLUGIN_FILE.parent.glob("*.py")) == ["__init__.py", "forgetwatch_plugin.py"]


def test_the_llamafactory_command_says_how_to_install_it(capsys, tmp_path):
    (tmp_path / "train.yaml").write_text("stage: sft\n")
    assert main(["llamafactory", str(tmp_path / "train.yaml")]) == 2
    assert "pip install llamafactory" in capsys.readouterr().err


@pytest.mark.parametrize("config, says", [("train.txt", "a .yaml, .yml or .json file"), ("gone.yaml", "no such file")])
def test_the_llamafactory_command_refuses_a_config_it_cannot_read_in_one_line(capsys, config, says):
    assert main(["llamafactory", config]) == 2
    err = capsys.readouterr().err  # one line, no traceback
    assert err.startswith(f"forgetwatch: error: {config}: ") and err.endswith(f"{says}\n") and err.count("\n") == 1
