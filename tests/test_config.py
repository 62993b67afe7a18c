"""Tests for forgetwatch.config: defaults, validation, the one YAML form (flat keys at a file's top level)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from forgetwatch.config import FLAT_KEYS, ConfigError, ForgetWatchConfig, from_flat_keys
from forgetwatch.config.settings import Monitor, Output, Scoring

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def write(tmp_path: Path, text: str, name: str = "forgetwatch.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def error_of(data: dict, source: str = "src") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        from_flat_keys(data, source)
    assert all(e.source == source for e in info.value.errors)
    return info.value


def keys_of(data: dict) -> list[str | None]:
    return [e.key for e in error_of(data).errors]


def yaml_error(path: Path) -> list[tuple]:
    """(file, line, key) of each problem of a YAML file."""
    with pytest.raises(ConfigError) as info:
        ForgetWatchConfig.from_yaml(path)
    return [tuple(e[:3]) for e in info.value.errors]


# --- defaults and construction ---------------------------------------------------------------


def test_every_setting_has_one_flat_key_its_fields_name():
    assert FLAT_KEYS[:5] == ("probes", "base", "eval_steps", "max_forgetting", "output_dir")
    grouped = [name for group in (Scoring, Monitor, Output) for name in group.model_fields]
    assert list(FLAT_KEYS[5:]) == grouped and len(set(FLAT_KEYS)) == len(FLAT_KEYS)
    assert list(ForgetWatchConfig().flat()) == list(FLAT_KEYS)


def test_no_settings_is_the_default_groups():
    cfg = ForgetWatchConfig()
    assert cfg.probes is None and cfg.base is None
    assert from_flat_keys({}, "src") == cfg == ForgetWatchConfig(scoring=Scoring(), monitor=Monitor())


def test_nothing_in_the_settings_can_be_edited_in_place():
    """Checked once, when built: nothing can change since (the watch reads them as they were checked)."""
    config = ForgetWatchConfig(monitor=Monitor(category_max_forgetting={"math": 0.1}))
    with pytest.raises(AttributeError):
        config.scoring.stop.append("")  # a tuple
    with pytest.raises(TypeError):
        config.monitor.category_max_forgetting["math"] = 5
    with pytest.raises(TypeError):
        config.output.category_map["capitals"] = ""
    assert ForgetWatchConfig().monitor.category_max_forgetting == {} and Scoring().stop == ("\n",)


def test_values_are_normalised_and_copied():
    categories = {"math": 0}
    cfg = ForgetWatchConfig(
        probes=Path("p.jsonl"),
        base=Path("b.npz"),
        max_forgetting=0,
        scoring=Scoring(stop=["a", "b"]),
        monitor=Monitor(category_max_forgetting=categories),
    )
    assert cfg.scoring.stop == ("a", "b")
    assert cfg.max_forgetting == 0.0 and isinstance(cfg.max_forgetting, float)
    assert cfg.monitor.category_max_forgetting == {"math": 0.0}
    assert isinstance(cfg.monitor.category_max_forgetting["math"], float)
    assert cfg.monitor.category_max_forgetting is not categories
    assert (cfg.probes, cfg.base) == ("p.jsonl", "b.npz")


def test_programmatic_construction_is_validated_and_every_problem_named():
    with pytest.raises(ConfigError) as info:
        Monitor(patience=0, stop_metric="loss")
    assert sorted((e.source, e.key) for e in info.value.errors) == [("Monitor", "patience"), ("Monitor", "stop_metric")]
    assert issubclass(ConfigError, ValueError)


def test_thresholds_without_a_way_to_stop_are_fine():
    cfg = ForgetWatchConfig(
        max_forgetting=0.1, monitor=Monitor(category_max_forgetting={"math": 0.2}, save_on_stop=False)
    )
    assert cfg.max_forgetting == 0.1


def test_a_config_cannot_be_edited():
    cfg = ForgetWatchConfig(eval_steps=50)
    with pytest.raises(ValidationError):
        cfg.eval_steps = 0  # used to mean the budget schedule, silently
    with pytest.raises(ValidationError):
        cfg.monitor.patience = 3


def test_unknown_keywords_are_type_errors_with_a_did_you_mean():
    with pytest.raises(TypeError, match=r"'eval_step'.*'eval_steps'"):  # the keyword and the suggestion
        ForgetWatchConfig(eval_step=10)
    with pytest.raises(TypeError, match=r"'patience'.*monitor=Monitor\(patience="):  # the group it belongs in
        Scoring(patience=3)
    with pytest.raises(ConfigError) as info:
        ForgetWatchConfig(base="")
    assert [e.key for e in info.value.errors] == ["base"]


# --- unknown keys and types --------------------------------------------------------------------


def test_unknown_keys_all_reported_with_did_you_mean():
    err = error_of({"eval_step": 50, "max_forgeting": 0.1, "zzz_qqq": 1, "patience": 2})
    assert [e.key for e in err.errors] == ["eval_step", "max_forgeting", "zzz_qqq"]
    assert "'eval_steps'" in err.errors[0].message and "'max_forgetting'" in err.errors[1].message
    assert "eval_steps" in err.errors[2].message  # lists the known keys when nothing is close


def test_unknown_keys_and_wrong_values_in_one_error():
    assert sorted(keys_of({"eval_step": 50, "patience": 0, "verbose": "yes"})) == ["eval_step", "patience", "verbose"]


def test_non_string_keys_and_groups_are_no_keys():
    assert keys_of({3: 1}) == ["3"]
    assert keys_of({"scoring": {"batch_size": 8}}) == ["scoring"]  # one problem: a group is no key of its own


BOOL_FIELDS = ["eval_on_evaluate", "eval_on_train_end", "significance", "save_on_stop", "chat_template"]


@pytest.mark.parametrize("name", [*BOOL_FIELDS, "log_categories", "verbose"])
@pytest.mark.parametrize("value", [1, 0, "true", "yes", None, 1.0])
def test_bool_fields_need_real_bools(name, value):
    assert keys_of({name: value}) == [name]


@pytest.mark.parametrize("name", ["eval_steps", "patience", "max_new_tokens"])
@pytest.mark.parametrize("value", [True, False, 5.0, 2.5, "5", [5]])
def test_int_fields_need_real_ints(name, value):
    assert keys_of({name: value}) == [name]


@pytest.mark.parametrize("name", ["max_overhead", "max_forgetting"])
@pytest.mark.parametrize("value", [True, "0.05", [0.05], {"a": 1}, "5e-2"])
def test_float_fields_need_numbers(name, value):
    assert keys_of({name: value}) == [name]


@pytest.mark.parametrize("name,value", [("probes", 3), ("probes", ""), ("base", ["a"]), ("output_dir", True)])
def test_path_fields_need_strings(name, value):
    assert keys_of({name: value}) == [name]


@pytest.mark.parametrize("value", ["\n", "Question:", None, {"a": 1}, 5, ["\n", ""], [""], ["a", 3], [None]])
def test_stop_is_a_list_of_non_empty_strings(value):
    assert keys_of({"stop": value}) == ["stop"]


def test_stop_may_be_empty():
    assert Scoring(stop=[]).stop == ()


@pytest.mark.parametrize(
    "value",
    [None, [0.1], 0.1, "math", {"math": "0.1"}, {"math": True}, {"math": 1.5}, {"math": -1}, {"m": None}, {3: 1}],
)
def test_category_thresholds_are_a_mapping_of_names_to_rates(value):
    assert keys_of({"category_max_forgetting": value}) == ["category_max_forgetting"]


# --- ranges ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        {"max_overhead": 0},
        {"max_overhead": 1},
        {"max_overhead": float("nan")},
        {"max_forgetting": -0.01},
        {"max_forgetting": 1.01},
        {"max_forgetting": 5},  # a percentage
        {"patience": 0},
        {"patience": -3},
        {"eval_steps": 0},
        {"max_new_tokens": 0},
        {"batch_size": 0},
        {"batch_size": "big"},
        {"batch_size": True},
        {"batch_size": 8.0},
        {"at_risk_share": 1},
        {"at_risk_floor": -0.5},
        {"at_risk_floor": "0.1"},
        {"normalize": "tokens"},
        {"precision": "half"},
        {"stop_metric": "loss"},
        {"stop_metric": None},
        {"train_kl_rows": 4097},
        {"table_rows": 0},
    ],
)
def test_range_errors_name_the_key(data):
    assert keys_of(data) == list(data)


def test_range_edges_accepted():
    cfg = from_flat_keys(
        {
            "max_overhead": 0.999,
            "max_forgetting": 0.0,
            "patience": 1,
            "eval_steps": 1,
            "batch_size": 1,
            "max_new_tokens": 1,
            "normalize": "chars",
            "stop_metric": "forgetting_adjusted",
        },
        "src",
    )
    assert cfg.max_forgetting == 0.0 and cfg.scoring.batch_size == 1
    assert ForgetWatchConfig(max_forgetting=1.0).max_forgetting == 1.0


# --- settings that pass a type check but cannot work (refused when the config is built) ---------


@pytest.mark.parametrize(
    "data",
    [
        {"max_overhead": 1e-320},  # the budget schedule divides by the share: it overflows to an infinite wait
        {"max_new_tokens": 10**12},  # more than any model's context
        {"behaviour_max_new_tokens": 10**12},
        {"batch_size": 10**30},
        {"eval_steps": 10**30},  # more than a 64-bit integer holds
        {"patience": 10**5000},  # its repr raises
        {"table_rows": 2**63},
        {"max_forgetting": 10**400},  # float() of it raises
        {"at_risk_floor": 10**400},
        {"output_dir": "runs/a\0b"},
        {"probes": "p\0.jsonl"},
        {"base": "\0"},
        {"stop": ["\n", "\ud800"]},
        {"stop": ["x" * 201]},
        {"stop": [f"<{i}>" for i in range(65)]},
        {"category_max_forgetting": {"ma\nth": 0.1}},
        {"category_max_forgetting": {"\udc80": 0.1}},
        {"category_map": {"capitals": 3}},
    ],
)
def test_settings_that_cannot_work_are_refused_when_built(data):
    err = error_of(data)
    assert [e.key for e in err.errors] == list(data) and len(str(err)) < 600


def test_the_bounds_keep_what_works():
    Monitor(max_overhead=0.001)
    ForgetWatchConfig(eval_steps=2**63 - 1)
    Scoring(max_new_tokens=1 << 20, stop=["x" * 200] * 64, batch_size=2**63 - 1)


def test_error_messages_never_print_a_huge_value():
    with pytest.raises(ConfigError) as info:
        Scoring(stop="x" * 10_000_000)
    assert len(str(info.value)) < 400
    with pytest.raises(ConfigError) as info:
        Monitor(category_max_forgetting=list(range(10_000_000)))
    assert len(str(info.value)) < 400


# --- YAML --------------------------------------------------------------------------------------


def test_example_configs():
    cfg = ForgetWatchConfig.from_yaml(CONFIGS / "multiple_choice_every_50_steps.yaml")
    assert cfg.probes == str(CONFIGS / "probes" / "general_knowledge.jsonl")
    assert (cfg.eval_steps, cfg.max_forgetting, cfg.scoring.normalize) == (50, None, None)
    cfg = ForgetWatchConfig.from_yaml(CONFIGS / "early_stop_adjusted_5pct.yaml")
    assert cfg.eval_steps is None and cfg.monitor.max_overhead == 0.05 and cfg.max_forgetting == 0.05
    monitor = cfg.monitor
    assert (monitor.stop_metric, monitor.patience, monitor.significance, monitor.save_on_stop) == (
        "forgetting_adjusted",
        2,
        True,
        True,
    )
    cfg = ForgetWatchConfig.from_yaml(CONFIGS / "gsm8k_generative.yaml")
    assert cfg.probes == str(CONFIGS / "probes" / "arithmetic.jsonl")
    assert (cfg.eval_steps, cfg.scoring.max_new_tokens) == (100, 256)
    assert cfg.scoring.stop == ("Question:", "</s>", "<|im_end|>")


def test_yaml_flat_layout(tmp_path):
    # Double quotes: YAML reads "\n" as a newline, '\n' as backslash + n.
    path = write(tmp_path, "eval_steps: 20\nmax_forgetting: 0.1\nstop: [\"\\n\", 'Q:']\n")
    cfg = ForgetWatchConfig.from_yaml(path)
    assert (cfg.eval_steps, cfg.max_forgetting, cfg.scoring.stop) == (20, 0.1, ("\n", "Q:"))


@pytest.mark.parametrize(
    "text, line, key",
    [
        ("eval_steps: 20\nverbose: 1\nmax_new_token: 5\n", 2, "verbose"),
        ("eval_steps: 20\nverbose: true\nmax_new_token: 5\n", 3, "max_new_token"),
        ("lr: 1\nforgetwatch:\n  eval_steps: 20\n", 1, "lr"),  # one form: the settings at the top level
        ("eval_steps: 5\nmonitor:\n  patience: 3\n", 2, "monitor"),  # a group is no section
        ("scoring: {batch_size: 8}\n", 1, "scoring"),
        ("eval_steps: 20\npatience: 2\neval_steps: 30\n", 3, None),  # a key given twice
        ('eval_steps: 20\npatience: 2\nstop: ["a", "b"\nverbose: true\n', 4, None),  # an unclosed bracket
        ("eval_steps: 20\n  patience: 2\n verbose: true\n", 2, None),  # indentation
        ("probes: x\n\teval_steps: 20\n", 2, None),  # a tab
        ("probes: !!python/object/apply:os.system ['echo hi']\n", 1, "probes"),  # a tag
        (f"eval_steps: 5\npatience: 1{'0' * 5000}\n", 2, "patience"),
        (f"stop: {'[' * 5000}{']' * 5000}\n", 1, "stop"),
        (f"eval_steps: 5\nstop: {'[' * 150}{']' * 150}\n", 2, "stop"),
        ("eval_steps: 5\nnote: !!timestamp 2024-13-45\n", 2, "note"),
        ('output_dir: "runs/\\0"\n', 1, "output_dir"),
        ("eval_steps: 1:30\n", 1, "eval_steps"),  # text, not 90 (base 60)
        ("verbose: yes\n", 1, "verbose"),  # text, not true
    ],
)
def test_yaml_errors_name_file_line_and_key(tmp_path, text, line, key):
    path = write(tmp_path, text)
    assert yaml_error(path)[0] == (str(path), line, key)


def test_every_problem_of_a_file_at_once_in_line_order(tmp_path):
    path = write(tmp_path, "eval_steps: 20\nverbose: 1\nmax_new_token: 5\npatience: 0\n")
    assert yaml_error(path) == [(str(path), 2, "verbose"), (str(path), 3, "max_new_token"), (str(path), 4, "patience")]


@pytest.mark.parametrize("text", ["- eval_steps\n- 50\n", "just some text\n", "42\n", "", "# only a comment\n"])
def test_yaml_document_must_be_a_mapping(tmp_path, text):
    path = write(tmp_path, text)
    assert yaml_error(path) == [(str(path), None, None)]


def test_yaml_numbers_are_read_by_yaml_1_2(tmp_path):
    assert yaml.safe_load("x: 010")["x"] == 8  # YAML 1.1, as PyYAML reads it
    config = ForgetWatchConfig.from_yaml(write(tmp_path, "eval_steps: 010\nmax_overhead: 5e-2\n"))
    assert (config.eval_steps, config.monitor.max_overhead) == (10, 0.05)  # not octal 8, not text


def test_yaml_relative_paths_resolve_against_the_file(tmp_path, monkeypatch):
    sub = tmp_path / "conf"
    sub.mkdir()
    path = write(sub, "probes: probes/p.jsonl\nbase: ../snap/base.npz\noutput_dir: out\n")
    monkeypatch.chdir(tmp_path.parent)  # the working directory must not matter
    cfg = ForgetWatchConfig.from_yaml(path)
    assert cfg.probes == str(sub / "probes" / "p.jsonl")
    assert Path(cfg.base).resolve() == (tmp_path / "snap" / "base.npz").resolve()
    assert cfg.output_dir == str(sub / "out")
    monkeypatch.chdir(tmp_path)
    assert ForgetWatchConfig.from_yaml("conf/forgetwatch.yaml").probes == str(sub / "probes" / "p.jsonl")


def test_yaml_absolute_and_home_paths_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    path = write(tmp_path, f"probes: {tmp_path / 'abs.jsonl'}\nbase: ~/base.json\n")
    cfg = ForgetWatchConfig.from_yaml(path)
    assert cfg.probes == str(tmp_path / "abs.jsonl")
    assert cfg.base == str(tmp_path / "home" / "base.json")


def test_flat_keys_without_a_file_keep_relative_paths():
    assert from_flat_keys({"probes": "p.jsonl"}, "src").probes == "p.jsonl"


def test_yaml_bombs_are_refused_before_they_go_off(tmp_path):
    laughs = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        laughs.append(f"{chr(97 + i)}: &{chr(97 + i)} [" + ", ".join([f"*{chr(96 + i)}"] * 9) + "]")
    laughs.append("stop: *i")
    path = write(tmp_path, "\n".join(laughs) + "\n", "laughs.yaml")
    assert path.stat().st_size < 1024  # expands to 9**9 strings if built
    assert yaml_error(path) == [(str(path), 1, "a")]
    big = write(tmp_path, "eval_steps: 5\n" + "# padding\n" * 200_000, "big.yaml")
    assert yaml_error(big) == [(str(big), None, None)]


def test_yaml_missing_file_and_not_utf8(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(FileNotFoundError) as info:
        ForgetWatchConfig.from_yaml(path)
    assert info.value.filename == str(path)
    latin = tmp_path / "latin1.yaml"
    latin.write_bytes("probes: caf\xe9.jsonl\n".encode("latin-1"))
    assert yaml_error(latin) == [(str(latin), None, None)]
