"""The groups of settings (forgetwatch.config.settings): one declaration per option, read by the config,
its YAML, evaluate, Scorer and the command line."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from forgetwatch import cli, evaluate
from forgetwatch.config import GROUPS, ConfigError, ForgetWatchConfig
from forgetwatch.config.settings import Monitor, Scoring, flat_key, help_text
from forgetwatch.scoring import Scorer


def test_each_group_documents_each_of_its_fields_once_in_order():
    for group in [ForgetWatchConfig, *GROUPS.values()]:
        helps = help_text(group)
        assert list(helps) == [f.name for f in dataclasses.fields(group)], group.__name__
        assert all(text.strip() for text in helps.values()), group.__name__


def test_help_text_reads_continued_entries_as_plain_text():
    assert help_text(Monitor)["metric"] == (
        'Which rate max_forgetting applies to: "forgetting" or "forgetting_adjusted" (flat key stop_metric).'
    )


def test_flat_keys_are_unique_and_name_their_group():
    keys = [flat_key(f) for group in GROUPS.values() for f in dataclasses.fields(group)]
    assert len(keys) == len(set(keys)) and not set(keys) & {"probes", "base"}
    assert flat_key(next(f for f in dataclasses.fields(Monitor) if f.name == "metric")) == "stop_metric"


def test_a_group_reports_all_its_problems_together():
    with pytest.raises(ConfigError) as info:
        Scoring(max_new_tokens=0, stop="\n", batch_size="big")
    assert [e.key for e in info.value.errors] == ["batch_size", "max_new_tokens", "stop"]
    assert all(e.source == "Scoring" for e in info.value.errors)


def test_settings_are_read_through_their_groups_and_checked_together():
    cfg = ForgetWatchConfig(monitor=Monitor(metric="forgetting_adjusted"))
    assert cfg.monitor.metric == "forgetting_adjusted" and not hasattr(cfg, "stop_metric")
    with pytest.raises(ConfigError) as info:
        ForgetWatchConfig.from_dict({"base": "", "patience": 0, "stop_metric": "loss", "verbose": 1}, "cfg")
    assert [e.key for e in info.value.errors] == ["base", "patience", "stop_metric", "verbose"]
    assert all(e.source == "cfg" for e in info.value.errors)


def test_a_group_of_the_wrong_type_is_named():
    with pytest.raises(ConfigError, match=r"key 'scoring': expected a Scoring, got \{'batch_size': 8\}"):
        ForgetWatchConfig(scoring={"batch_size": 8})  # type: ignore[arg-type]


# --- one way in YAML: each setting a flat key ----------------------------------------------------


def write(tmp_path, text):
    path = tmp_path / "forgetwatch.yaml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "eval_steps: 5\nmonitor:\n  patience: 3\n",
            "line 2: key 'monitor': write each of its settings as a key of its own (e.g. max_overhead: ...)",
        ),
        ("patiense: 3\n", "line 1: key 'patiense': unknown key (did you mean 'patience'?); fix or remove it"),
        ("scoring: {batch_size: 8}\n", "line 1: key 'scoring': write each of its settings as a key of its own"),
    ],
)
def test_a_group_is_no_section_in_a_file(tmp_path, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        ForgetWatchConfig.from_yaml(path)
    assert f"{path}: {expected}" in str(info.value)


def test_replace_takes_flat_keys_and_whole_groups():
    cfg = ForgetWatchConfig(scoring=Scoring(batch_size=8, max_new_tokens=5))
    assert cfg.replace(max_new_tokens=7).scoring == Scoring(batch_size=8, max_new_tokens=7)
    assert cfg.replace(scoring=Scoring(stop=["Q:"])).scoring == Scoring(stop=["Q:"])
    with pytest.raises(ConfigError, match=r"^replace\(\): key 'max_new_tokens': given twice"):
        cfg.replace(scoring=Scoring(), max_new_tokens=3)


# --- scoring defaults: declared once, in Scoring ------------------------------------------------


def test_evaluate_scorer_and_the_command_line_take_their_defaults_from_scoring():
    declared = {f.name: f.default for f in dataclasses.fields(Scoring)}
    for function in (evaluate, Scorer):
        shown = inspect.signature(function).parameters
        for name in declared.keys() & shown.keys():
            assert shown[name].default == declared[name], (function, name)
    assert inspect.signature(Scorer.__call__).parameters["batch_size"].default == declared["batch_size"]
    args = cli._parser().parse_args(["evaluate", "--model", "m", "--probes", "p", "--out", "a.json"])
    # a saved checkpoint runs no trainer's autocast: --dtype is its precision
    for name in declared.keys() - {"stop", "precision"}:
        assert getattr(args, name) == declared[name], name


def test_the_scorer_checks_its_options_as_the_settings_do():
    with pytest.raises(ConfigError, match=r"^Scoring: key 'max_new_tokens': expected an integer from 1 to"):
        Scorer(None, None, max_new_tokens=0)
    with pytest.raises(ConfigError, match=r"^Scoring: key 'normalize': expected one of 'chars', null"):
        Scorer(None, None, normalize="tokens")
