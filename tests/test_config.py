"""Tests for forgetwatch.config: defaults, validation, YAML loading and saving, example configs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from forgetwatch.config import ConfigError, ForgetWatchConfig
from forgetwatch.config.settings import Monitor, Output, Scoring

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def write(tmp_path: Path, text: str, name: str = "forgetwatch.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def error_of(data: dict, source: str = "src") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        ForgetWatchConfig.from_dict(data, source=source)
    return info.value


# --- defaults and construction ---------------------------------------------------------------


#: every flat key, in declaration order
KEYS = [
    "probes",
    "base",
    "eval_steps",
    "max_forgetting",
    "output_dir",
    "batch_size",
    "normalize",
    "chat_template",
    "max_new_tokens",
    "stop",
    "behaviour_max_new_tokens",
    "shared_prefixes",
    "precision",
    "samples",
    "temperature",
    "top_p",
    "seed",
    "max_overhead",
    "eval_on_evaluate",
    "eval_on_train_end",
    "stop_metric",
    "patience",
    "significance",
    "category_max_forgetting",
    "save_on_stop",
    "at_risk_share",
    "at_risk_floor",
    "noise_check",
    "train_kl_rows",
    "table_rows",
    "log_categories",
    "category_map",
    "min_logged_right",
    "max_logged_categories",
    "verbose",
]


def test_every_setting_has_one_flat_key():
    assert list(ForgetWatchConfig().to_dict()) == KEYS


def test_no_settings_is_the_default_groups():
    cfg = ForgetWatchConfig()
    assert cfg.probes is None and cfg.base is None
    assert ForgetWatchConfig.from_dict({}) == cfg == ForgetWatchConfig(scoring=Scoring(), monitor=Monitor())


def test_mutable_defaults_are_not_shared():
    a, b = ForgetWatchConfig(), ForgetWatchConfig()
    a.scoring.stop.append("Question:")
    a.monitor.category_max_forgetting["math"] = 0.1
    assert b.scoring.stop == ["\n"] and b.monitor.category_max_forgetting == {}
    assert Scoring().stop == ["\n"]


def test_values_are_normalised_and_copied():
    stop = ("a", "b")
    categories = {"math": 0}
    scoring = Scoring(stop=stop)
    monitor = Monitor(category_max_forgetting=categories)
    cfg = ForgetWatchConfig(
        probes=Path("p.jsonl"), base=Path("b.npz"), max_forgetting=0, scoring=scoring, monitor=monitor
    )
    assert cfg.scoring.stop == ["a", "b"] and isinstance(cfg.scoring.stop, list)
    assert cfg.max_forgetting == 0.0 and isinstance(cfg.max_forgetting, float)
    assert cfg.monitor.category_max_forgetting == {"math": 0.0}
    assert isinstance(cfg.monitor.category_max_forgetting["math"], float)
    assert cfg.monitor.category_max_forgetting is not categories
    assert (cfg.probes, cfg.base) == ("p.jsonl", "b.npz")


def test_ints_accepted_for_float_fields():
    cfg = ForgetWatchConfig(max_forgetting=1)
    assert cfg.max_forgetting == 1.0 and isinstance(cfg.max_forgetting, float)


def test_programmatic_construction_is_validated():
    with pytest.raises(ConfigError) as info:
        Monitor(patience=0, metric="loss")
    message = str(info.value)
    assert "Monitor: key 'patience'" in message
    assert "Monitor: key 'metric'" in message
    assert len(info.value.errors) == 2


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


def test_thresholds_without_a_way_to_stop_are_fine():
    cfg = ForgetWatchConfig(
        max_forgetting=0.1, monitor=Monitor(category_max_forgetting={"math": 0.2}, save_on_stop=False)
    )
    assert cfg.max_forgetting == 0.1


# --- from_dict: unknown keys and types ---------------------------------------------------------


def test_unknown_keys_all_reported_with_did_you_mean():
    err = error_of({"eval_step": 50, "max_forgeting": 0.1, "zzz_qqq": 1, "patience": 2})
    lines = str(err).splitlines()
    assert "src: key 'eval_step': unknown key (did you mean 'eval_steps'?)" in lines[0]
    assert "src: key 'max_forgeting': unknown key (did you mean 'max_forgetting'?)" in lines[1]
    assert "src: key 'zzz_qqq': unknown key" in lines[2]
    assert "did you mean" not in lines[2]
    assert "eval_steps" in lines[2]  # lists the known keys when nothing is close
    assert len(lines) == 3
    assert [e.key for e in err.errors] == ["eval_step", "max_forgeting", "zzz_qqq"]


def test_unknown_keys_and_wrong_values_in_one_error():
    err = error_of({"eval_step": 50, "patience": 0, "verbose": "yes"})
    assert [e.key for e in err.errors] == ["eval_step", "patience", "verbose"]


def test_default_source_is_dict():
    assert str(error_of({"eval_step": 1}, source="<dict>")).startswith("<dict>: key 'eval_step'")
    with pytest.raises(ConfigError, match=r"^<dict>: key 'eval_step'"):
        ForgetWatchConfig.from_dict({"eval_step": 1})


def test_non_string_key():
    err = error_of({3: 1})
    assert "key 3 (int) is not a string" in str(err)


def test_from_dict_needs_a_mapping():
    with pytest.raises(ConfigError, match="expected a mapping"):
        ForgetWatchConfig.from_dict(["eval_steps", 50])  # type: ignore[arg-type]


BOOL_FIELDS = [
    "eval_on_evaluate",
    "eval_on_train_end",
    "significance",
    "save_on_stop",
    "chat_template",
    "log_categories",
    "verbose",
]


@pytest.mark.parametrize("name", BOOL_FIELDS)
@pytest.mark.parametrize("value", [1, 0, "true", "yes", None, 1.0])
def test_bool_fields_need_real_bools(name, value):
    err = error_of({name: value})
    message = str(err)
    assert f"src: key '{name}': expected true or false, got {value!r}" in message
    assert len(err.errors) == 1


def test_bool_hints():
    assert "not 0 or 1" in str(error_of({"verbose": 1}))
    assert "remove the quotes" in str(error_of({"verbose": "false"}))


@pytest.mark.parametrize("name", ["eval_steps", "patience", "max_new_tokens"])
@pytest.mark.parametrize("value", [True, False, 5.0, 2.5, "5", [5]])
def test_int_fields_need_real_ints(name, value):
    message = str(error_of({name: value}))
    assert f"src: key '{name}': expected an integer " in message
    assert f"got {value!r}" in message


def test_int_hints():
    assert "write 50, without the decimal point" in str(error_of({"eval_steps": 50.0}))
    assert "remove the quotes" in str(error_of({"patience": "3"}))
    assert "true/false is not a number" in str(error_of({"patience": True}))


@pytest.mark.parametrize("name", ["max_overhead", "max_forgetting"])
@pytest.mark.parametrize("value", [True, "0.05", [0.05], {"a": 1}])
def test_float_fields_need_numbers(name, value):
    message = str(error_of({name: value}))
    assert f"src: key '{name}': expected a number in" in message
    assert f"got {value!r}" in message


def test_yaml_exponent_without_dot_hint():
    # PyYAML reads 5e-2 as a string.
    assert yaml.safe_load("x: 5e-2")["x"] == "5e-2"
    assert "write it with a dot: 0.05" in str(error_of({"max_overhead": "5e-2"}))


@pytest.mark.parametrize(
    "name,value",
    [
        ("probes", 3),
        ("probes", ""),
        ("base", ["a"]),
        ("output_dir", True),
    ],
)
def test_path_fields_need_strings(name, value):
    assert f"src: key '{name}': expected a file system path" in str(error_of({name: value}))


@pytest.mark.parametrize("value", ["\n", None, {"a": 1}, 5])
def test_stop_must_be_a_list(value):
    assert "src: key 'stop': expected a list of non-empty strings" in str(error_of({"stop": value}))


def test_stop_single_string_hint():
    assert "write a single stop string as a list: ['Question:']" in str(error_of({"stop": "Question:"}))


@pytest.mark.parametrize("value", [["\n", ""], [""], ["a", 3], [None]])
def test_stop_items_must_be_non_empty_strings(value):
    message = str(error_of({"stop": value}))
    assert "src: key 'stop': item" in message and "expected a non-empty string" in message


def test_stop_may_be_empty():
    assert Scoring(stop=[]).stop == []


@pytest.mark.parametrize("value", [None, [0.1], 0.1, "math"])
def test_category_max_forgetting_must_be_a_mapping(value):
    assert "src: key 'category_max_forgetting': expected a mapping" in str(error_of({"category_max_forgetting": value}))


@pytest.mark.parametrize("value", [{"math": "0.1"}, {"math": True}, {"math": 1.5}, {"math": -0.1}, {"math": None}])
def test_category_thresholds_are_rates(value):
    message = str(error_of({"category_max_forgetting": value}))
    assert "key 'category_max_forgetting': category 'math': expected a number in [0, 1]" in message


def test_category_names_are_strings():
    message = str(error_of({"category_max_forgetting": {2024: 0.1}}))
    assert "expected category names as non-empty strings, got 2024 (int)" in message


# --- ranges ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data,expected",
    [
        ({"max_overhead": 0}, "key 'max_overhead': expected a number in [0.001, 1), got 0"),
        ({"max_overhead": 1}, "key 'max_overhead': expected a number in [0.001, 1), got 1"),
        ({"max_overhead": 0.0}, "key 'max_overhead': expected a number in [0.001, 1), got 0.0"),
        ({"max_overhead": float("nan")}, "key 'max_overhead': expected a number in [0.001, 1), got nan"),
        ({"max_forgetting": -0.01}, "key 'max_forgetting': expected a number in [0, 1] or null"),
        ({"max_forgetting": 1.01}, "key 'max_forgetting': expected a number in [0, 1] or null"),
        ({"patience": 0}, "key 'patience': expected an integer >= 1, got 0"),
        ({"patience": -3}, "key 'patience': expected an integer >= 1, got -3"),
        ({"eval_steps": 0}, "key 'eval_steps': expected an integer >= 1 or null"),
        ({"max_new_tokens": 0}, "key 'max_new_tokens': expected an integer from 1 to 1048576, got 0"),
        ({"stop": ["\n", ""]}, "key 'stop': item 1: expected a non-empty string, got ''"),
        ({"batch_size": 0}, "key 'batch_size': expected a positive integer or 'auto', got 0"),
        ({"at_risk_share": 1}, "key 'at_risk_share': expected a number in (0, 1), got 1 (int)"),
        ({"at_risk_floor": -0.5}, "key 'at_risk_floor': expected a number >= 0, got -0.5 (float)"),
        ({"at_risk_floor": "0.1"}, "key 'at_risk_floor': expected a number >= 0, got '0.1' (str); remove the quotes"),
        ({"batch_size": "big"}, "key 'batch_size': expected a positive integer or 'auto', got 'big'"),
        ({"batch_size": True}, "key 'batch_size': expected a positive integer or 'auto', got True"),
        ({"batch_size": 8.0}, "key 'batch_size': expected a positive integer or 'auto', got 8.0"),
        ({"normalize": "tokens"}, "key 'normalize': expected one of 'chars', null, got 'tokens'"),
        ({"stop_metric": "loss"}, "key 'stop_metric': expected one of 'forgetting', 'forgetting_adjusted', got 'loss'"),
        ({"stop_metric": None}, "key 'stop_metric': expected one of 'forgetting', 'forgetting_adjusted', got None"),
    ],
)
def test_range_errors(data, expected):
    message = str(error_of(data))
    assert message.startswith(f"src: {expected}")
    assert "; " in message  # every message says what to do


def test_range_edges_accepted():
    cfg = ForgetWatchConfig.from_dict(
        {
            "max_overhead": 0.999,
            "max_forgetting": 0.0,
            "patience": 1,
            "eval_steps": 1,
            "batch_size": 1,
            "max_new_tokens": 1,
            "normalize": "chars",
            "stop_metric": "forgetting_adjusted",
        }
    )
    assert cfg.max_forgetting == 0.0 and cfg.scoring.batch_size == 1
    assert ForgetWatchConfig(max_forgetting=1.0).max_forgetting == 1.0


def test_percentage_hint():
    assert "write 0.05 for 5 %" in str(error_of({"max_forgetting": 5}))


def test_choice_did_you_mean():
    assert "did you mean 'forgetting_adjusted'?" in str(error_of({"stop_metric": "forgetting_adjustd"}))


# --- YAML --------------------------------------------------------------------------------------


def test_example_multiple_choice_every_50_steps():
    path = CONFIGS / "multiple_choice_every_50_steps.yaml"
    cfg = ForgetWatchConfig.from_yaml(path)
    assert cfg.probes == str(CONFIGS / "probes" / "general_knowledge.jsonl")
    assert cfg.eval_steps == 50
    assert cfg.max_forgetting is None
    assert cfg.scoring.normalize is None


def test_example_early_stop_adjusted_5pct():
    cfg = ForgetWatchConfig.from_yaml(CONFIGS / "early_stop_adjusted_5pct.yaml")
    assert cfg.probes == str(CONFIGS / "probes" / "general_knowledge.jsonl")
    assert cfg.eval_steps is None  # the cost-budget schedule
    assert cfg.monitor.max_overhead == 0.05
    assert cfg.max_forgetting == 0.05
    assert cfg.monitor.metric == "forgetting_adjusted"
    assert cfg.monitor.patience == 2
    assert cfg.monitor.significance is True
    assert cfg.monitor.save_on_stop is True


def test_example_gsm8k_generative():
    path = CONFIGS / "gsm8k_generative.yaml"
    assert "forgetwatch" in yaml.safe_load(path.read_text())  # shows the nested layout
    cfg = ForgetWatchConfig.from_yaml(path)
    assert cfg.probes == str(CONFIGS / "probes" / "arithmetic.jsonl")
    assert cfg.eval_steps == 100
    assert cfg.scoring.max_new_tokens == 256
    assert cfg.scoring.stop == ["Question:", "</s>", "<|im_end|>"]


def test_every_example_config_loads():
    files = sorted(CONFIGS.glob("*.yaml"))
    assert len(files) >= 3
    for path in files:
        assert isinstance(ForgetWatchConfig.from_yaml(path), ForgetWatchConfig)


def test_yaml_flat_layout(tmp_path):
    # Double quotes: YAML reads "\n" as a newline, '\n' as backslash + n.
    path = write(tmp_path, "eval_steps: 20\nmax_forgetting: 0.1\nstop: [\"\\n\", 'Q:']\n")
    cfg = ForgetWatchConfig.from_yaml(path)
    assert (cfg.eval_steps, cfg.max_forgetting, cfg.scoring.stop) == (20, 0.1, ["\n", "Q:"])


def test_yaml_forgetwatch_root_key(tmp_path):
    path = write(tmp_path, "learning_rate: 1.0e-5\nmodel: gpt2\nforgetwatch:\n  eval_steps: 20\n  patience: 3\n")
    cfg = ForgetWatchConfig.from_yaml(path)
    assert (cfg.eval_steps, cfg.monitor.patience) == (20, 3)


def test_yaml_forgetwatch_root_key_errors_name_the_line(tmp_path):
    path = write(tmp_path, "lr: 1\nforgetwatch:\n  eval_steps: 20\n  eval_step: 5\n")
    with pytest.raises(ConfigError) as info:
        ForgetWatchConfig.from_yaml(path)
    assert str(info.value) == (
        f"{path}: line 4: key 'eval_step': unknown key (did you mean 'eval_steps'?); fix or remove it"
    )


def test_yaml_forgetwatch_section_must_be_a_mapping(tmp_path):
    for text in ("forgetwatch:\n", "forgetwatch: [1, 2]\n", "forgetwatch: 5\n"):
        path = write(tmp_path, "lr: 1\n" + text)
        with pytest.raises(ConfigError, match=r"line 2: key 'forgetwatch': expected a mapping"):
            ForgetWatchConfig.from_yaml(path)


def test_yaml_training_config_without_section_hints_at_root_key(tmp_path):
    path = write(tmp_path, "learning_rate: 1.0e-5\nmodel: gpt2\n")
    with pytest.raises(ConfigError) as info:
        ForgetWatchConfig.from_yaml(path)
    assert "top-level 'forgetwatch:' key" in str(info.value)
    assert "key 'learning_rate': unknown key" in str(info.value)


def test_yaml_errors_name_file_and_line(tmp_path):
    path = write(tmp_path, "eval_steps: 20\nverbose: 1\nmax_new_token: 5\n")
    with pytest.raises(ConfigError) as info:
        ForgetWatchConfig.from_yaml(path)
    lines = str(info.value).splitlines()
    assert lines[0].startswith(f"{path}: line 3: key 'max_new_token': unknown key (did you mean 'max_new_tokens'?)")
    assert lines[1].startswith(f"{path}: line 2: key 'verbose': expected true or false, got 1")


def test_yaml_duplicate_key(tmp_path):
    path = write(tmp_path, "eval_steps: 20\npatience: 2\neval_steps: 30\n")
    with pytest.raises(ConfigError, match=r"line 3: key 'eval_steps': appears 2 times \(lines 1, 3\)"):
        ForgetWatchConfig.from_yaml(path)


def test_yaml_relative_paths_resolve_against_the_file(tmp_path, monkeypatch):
    sub = tmp_path / "conf"
    sub.mkdir()
    path = write(sub, "probes: probes/p.jsonl\nbase: ../snap/base.npz\noutput_dir: out\n")
    monkeypatch.chdir(tmp_path.parent)  # the working directory must not matter
    cfg = ForgetWatchConfig.from_yaml(path)
    assert cfg.probes == str(sub / "probes" / "p.jsonl")
    assert Path(cfg.base).resolve() == (tmp_path / "snap" / "base.npz").resolve()
    assert cfg.output_dir == str(sub / "out")


def test_yaml_relative_path_of_the_file_itself(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c").mkdir()
    write(tmp_path / "c", "probes: p.jsonl\n")
    cfg = ForgetWatchConfig.from_yaml("c/forgetwatch.yaml")
    assert cfg.probes == str(tmp_path / "c" / "p.jsonl")


def test_yaml_absolute_and_home_paths_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    path = write(tmp_path, f"probes: {tmp_path / 'abs.jsonl'}\nbase: ~/base.json\n")
    cfg = ForgetWatchConfig.from_yaml(path)
    assert cfg.probes == str(tmp_path / "abs.jsonl")
    assert cfg.base == str(tmp_path / "home" / "base.json")


def test_from_dict_keeps_relative_paths():
    assert ForgetWatchConfig.from_dict({"probes": "p.jsonl"}).probes == "p.jsonl"


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    path = write(tmp_path, 'eval_steps: 20\npatience: 2\nstop: ["a", "b"\nverbose: true\n')
    with pytest.raises(ConfigError) as info:
        ForgetWatchConfig.from_yaml(path)
    message = str(info.value)
    assert message.startswith(f"{path}: line ")
    assert "YAML syntax error" in message
    line = info.value.errors[0].line
    assert line in (3, 4)  # where the unclosed bracket is noticed


def test_yaml_syntax_error_bad_indent(tmp_path):
    path = write(tmp_path, "forgetwatch:\n  eval_steps: 20\n patience: 2\n")
    with pytest.raises(ConfigError, match=rf"^{path}: line 3: YAML syntax error"):
        ForgetWatchConfig.from_yaml(path)


def test_yaml_tab_indent_error(tmp_path):
    path = write(tmp_path, "forgetwatch:\n\teval_steps: 20\n")
    with pytest.raises(ConfigError, match=rf"^{path}: line 2: YAML syntax error"):
        ForgetWatchConfig.from_yaml(path)


def test_yaml_unsafe_tag_refused(tmp_path):
    path = write(tmp_path, "probes: !!python/object/apply:os.system ['echo hi']\n")
    with pytest.raises(ConfigError, match=rf"^{path}: line 1: YAML error: .*tag"):
        ForgetWatchConfig.from_yaml(path)


@pytest.mark.parametrize(
    "text,kind",
    [
        ("- eval_steps\n- 50\n", "['eval_steps', 50] (list)"),
        ("just some text\n", "'just some text' (str)"),
        ("42\n", "42 (int)"),
        ("", "an empty document"),
        ("# only a comment\n", "an empty document"),
    ],
)
def test_yaml_document_must_be_a_mapping(tmp_path, text, kind):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        ForgetWatchConfig.from_yaml(path)
    message = str(info.value)
    assert message.startswith(f"{path}: the document must be a mapping")
    assert f"got {kind}" in message


def test_yaml_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(FileNotFoundError) as info:
        ForgetWatchConfig.from_yaml(path)
    assert str(path) in str(info.value)
    assert info.value.filename == str(path)


def test_yaml_not_utf8(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("probes: caf\xe9.jsonl\n".encode("latin-1"))
    with pytest.raises(ConfigError, match="not UTF-8"):
        ForgetWatchConfig.from_yaml(path)


# --- to_dict / to_yaml ---------------------------------------------------------------------------


def full_config(tmp_path: Path) -> ForgetWatchConfig:
    return ForgetWatchConfig(
        eval_steps=25,
        max_forgetting=0.2,
        output_dir=str(tmp_path / "out"),
        probes=str(tmp_path / "p.jsonl"),
        base=str(tmp_path / "base.npz"),
        scoring=Scoring(
            batch_size=16,
            normalize="chars",
            chat_template=True,
            max_new_tokens=200,
            stop=["\n", "Question:", "</s>", "  ", "# not a comment", "a: b"],
        ),
        output=Output(log_categories=False, verbose=False),
        monitor=Monitor(
            max_overhead=0.1,
            eval_on_evaluate=False,
            eval_on_train_end=False,
            metric="forgetting_adjusted",
            patience=3,
            significance=True,
            category_max_forgetting={"math": 0.1, "näive: 'quotes'": 0.3},
            save_on_stop=False,
        ),
    )


def test_to_dict_is_plain_and_complete(tmp_path):
    cfg = full_config(tmp_path)
    data = cfg.to_dict()
    assert list(data) == KEYS
    assert json.loads(json.dumps(data)) == data  # plain values only
    assert data["stop_metric"] == "forgetting_adjusted"
    data["stop"].append("x")
    data["category_max_forgetting"]["x"] = 0.5
    assert "x" not in cfg.scoring.stop and "x" not in cfg.monitor.category_max_forgetting  # copies
    assert ForgetWatchConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("make", [lambda tmp: ForgetWatchConfig(), full_config])
def test_yaml_round_trip(tmp_path, make):
    cfg = make(tmp_path)
    path = tmp_path / "sub" / "saved.yaml"
    cfg.to_yaml(path)
    assert ForgetWatchConfig.from_yaml(path) == cfg
    assert not [p.name for p in path.parent.iterdir() if p.name != "saved.yaml"]  # no temp files left


def test_to_yaml_overwrites(tmp_path):
    path = tmp_path / "saved.yaml"
    ForgetWatchConfig(eval_steps=1).to_yaml(path)
    ForgetWatchConfig(eval_steps=2).to_yaml(path)
    assert ForgetWatchConfig.from_yaml(path).eval_steps == 2


def test_to_yaml_keeps_the_meaning_of_relative_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = ForgetWatchConfig(output_dir="out", probes="probes/p.jsonl")
    path = tmp_path / "elsewhere" / "saved.yaml"
    cfg.to_yaml(path)
    loaded = ForgetWatchConfig.from_yaml(path)
    assert loaded.probes == str(tmp_path / "probes" / "p.jsonl")
    assert loaded.output_dir == str(tmp_path / "out")


def test_example_configs_round_trip(tmp_path):
    for source in sorted(CONFIGS.glob("*.yaml")):
        cfg = ForgetWatchConfig.from_yaml(source)
        cfg.to_yaml(tmp_path / source.name)
        assert ForgetWatchConfig.from_yaml(tmp_path / source.name) == cfg


# --- declared once, immutable, bounded ---------------------------------------------------------


def test_a_config_cannot_be_edited_only_replaced_with_a_checked_copy():
    cfg = ForgetWatchConfig(eval_steps=50)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.eval_steps = 0  # used to mean the budget schedule, silently
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.monitor = Monitor()
    changed = cfg.replace(max_forgetting=0.1)
    assert changed.max_forgetting == 0.1 and cfg.max_forgetting is None
    assert changed.monitor == cfg.monitor
    with pytest.raises(ConfigError, match="key 'max_forgetting'"):
        cfg.replace(max_forgetting=-1)  # used to stop at the first evaluation


def test_unknown_keywords_and_empty_paths_are_config_errors():
    with pytest.raises(TypeError, match=r"'eval_step' \(did you mean 'eval_steps'\?\)"):
        ForgetWatchConfig(eval_step=10)
    with pytest.raises(ConfigError, match="key 'base'"):
        ForgetWatchConfig(base="")


def test_yaml_keywords_override_the_file(tmp_path):
    path = tmp_path / "fw.yaml"
    path.write_text("eval_steps: 50\npatience: 2\n")
    cfg = ForgetWatchConfig.from_yaml(path, eval_steps=10)
    assert (cfg.eval_steps, cfg.monitor.patience) == (10, 2)
    with pytest.raises(ConfigError, match="key 'patience'"):
        ForgetWatchConfig.from_yaml(path, patience=0)


def test_yaml_bombs_are_refused_before_they_go_off(tmp_path):
    laughs = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        laughs.append(f"{chr(97 + i)}: &{chr(97 + i)} [" + ", ".join([f"*{chr(96 + i)}"] * 9) + "]")
    laughs.append("stop: *i")
    path = tmp_path / "laughs.yaml"
    path.write_text("\n".join(laughs) + "\n")
    assert path.stat().st_size < 1024  # expands to 9**9 strings if built
    with pytest.raises(ConfigError, match="anchors and aliases") as info:
        ForgetWatchConfig.from_yaml(path)
    assert len(str(info.value)) < 300
    big = tmp_path / "big.yaml"
    big.write_text("eval_steps: 5\n" + "# padding\n" * 200_000)
    with pytest.raises(ConfigError, match="bytes"):
        ForgetWatchConfig.from_yaml(big)


def test_error_messages_never_print_a_huge_value():
    with pytest.raises(ConfigError) as info:
        Scoring(stop="x" * 10_000_000)
    assert len(str(info.value)) < 400
    with pytest.raises(ConfigError) as info:
        Monitor(category_max_forgetting=list(range(10_000_000)))
    assert len(str(info.value)) < 400


# --- settings that pass a type check but cannot work (refused when the config is built) ---------


@pytest.mark.parametrize(
    "data, key, words",
    [
        # the budget schedule divides by the share: a tiny one overflows to an infinite wait
        ({"max_overhead": 1e-320}, "max_overhead", "for rare evaluations set eval_steps"),
        ({"max_new_tokens": 10**12}, "max_new_tokens", "more than any model's context"),
        ({"behaviour_max_new_tokens": 10**12}, "behaviour_max_new_tokens", "more than any model's context"),
        ({"batch_size": 10**30}, "batch_size", "positive integer or 'auto'"),
        ({"eval_steps": 10**30}, "eval_steps", "what a 64-bit integer holds"),
        ({"patience": 10**5000}, "patience", "an integer of about 5001 digits"),  # its repr raises
        ({"table_rows": 2**63}, "table_rows", "what a 64-bit integer holds"),
        ({"max_forgetting": 10**400}, "max_forgetting", "[0, 1]"),  # float() of it raises
        ({"at_risk_floor": 10**400}, "at_risk_floor", "a number >= 0"),
        ({"output_dir": "runs/a\0b"}, "output_dir", "NUL character at character 6"),
        ({"probes": "p\0.jsonl"}, "probes", "NUL character"),
        ({"base": "\0"}, "base", "NUL character"),
        ({"stop": ["\n", "\ud800"]}, "stop", "item 1: expected a string of Unicode text"),
        ({"stop": ["x" * 201]}, "stop", "at most 200 characters"),
        ({"stop": [f"<{i}>" for i in range(65)]}, "stop", "at most 64 stop strings"),
        ({"category_max_forgetting": {"ma\nth": 0.1}}, "category_max_forgetting", "control character"),
        ({"category_max_forgetting": {"\udc80": 0.1}}, "category_max_forgetting", "lone surrogate"),
    ],
)
def test_settings_that_cannot_work_are_refused_when_built(data, key, words):
    with pytest.raises(ConfigError) as info:
        ForgetWatchConfig.from_dict(data)
    assert [e.key for e in info.value.errors] == [key]
    assert words in str(info.value) and len(str(info.value)) < 600


def test_the_bounds_keep_what_works():
    Monitor(max_overhead=0.001)
    ForgetWatchConfig(eval_steps=2**63 - 1)
    Scoring(max_new_tokens=1 << 20, stop=["x" * 200] * 64, batch_size=2**63 - 1)


@pytest.mark.parametrize(
    "text, line, key, words",
    [
        (f"eval_steps: 5\npatience: 1{'0' * 5000}\n", 2, "patience", "an integer of 5001 characters"),
        (f"forgetwatch:\n  stop: {'[' * 5000}{']' * 5000}\n", 2, "stop", "nested more than 100 levels"),
        (f"stop: {'[' * 150}{']' * 150}\n", 1, "stop", "nested more than 100 levels"),
        ("eval_steps: 5\nnote: !!timestamp 2024-13-45\n", 2, None, "YAML cannot build this value (month must be"),
        ('output_dir: "runs/\\0"\n', 1, "output_dir", "NUL character"),
        ("eval_steps: 1:30\n", 1, "eval_steps", "expected an integer >= 1 or null"),  # not 90 (base 60)
        ("verbose: yes\n", 1, "verbose", "expected true or false, got 'yes'"),
    ],
)
def test_yaml_values_that_would_fail_later_name_file_line_and_key(tmp_path, text, line, key, words):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        ForgetWatchConfig.from_yaml(path)
    assert [e[:3] for e in info.value.errors] == [(str(path), line, key)]
    assert words in str(info.value)


def test_yaml_numbers_are_read_by_yaml_1_2(tmp_path):
    config = ForgetWatchConfig.from_yaml(write(tmp_path, "eval_steps: 010\nmax_overhead: 5e-2\n"))
    assert (config.eval_steps, config.monitor.max_overhead) == (10, 0.05)  # not octal 8, not text


def test_a_number_too_large_for_a_float_gets_no_quotes_hint():
    # PyYAML reads 1.0e999 (no sign in the exponent) as text; float() of it is inf, no rate
    assert "remove the quotes" not in str(error_of({"max_forgetting": "1.0e999"}))
