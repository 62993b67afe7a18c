"""The shipped ``configs/*.yaml`` work on a fresh checkout: settings, probe file, callback."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from forgetwatch import ForgetWatchCallback, ProbeSet
from forgetwatch.config import ConfigError, ForgetWatchConfig
from forgetwatch.probes import as_probe_set
from forgetwatch.probes.lm_eval_tasks import LmEvalProbes
from forgetwatch.probes.presets import PRESETS

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
YAMLS = sorted(CONFIGS.glob("*.yaml"))


def test_there_are_configs_to_check():
    assert len(YAMLS) >= 3


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.name)
def test_config_loads_and_its_probe_file_is_shipped(path):
    cfg = ForgetWatchConfig.from_yaml(path)
    if isinstance(cfg.probes, LmEvalProbes):  # a local lm-eval task folder, shipped beside it
        assert Path(cfg.probes.include_path).is_relative_to(CONFIGS / "lm_eval_tasks")
        probes = as_probe_set(cfg.probes)
        assert len(probes) >= 30 and len(probes.categories) >= 2
        assert ForgetWatchCallback.from_yaml(path).config == cfg
        return
    assert cfg.probes and Path(cfg.probes).is_relative_to(CONFIGS / "probes")
    probes = ProbeSet.from_jsonl(cfg.probes)
    assert len(probes) >= 30
    assert len({p.category for p in probes}) >= 3
    callback = ForgetWatchCallback.from_yaml(path)
    assert callback.config == cfg
    assert ForgetWatchCallback.from_yaml(path, eval_steps=7).config.eval_steps == 7


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.name)
def test_the_dataset_recipe_in_a_config_names_real_presets(path):
    """The commented ``from_hf(...)`` recipe for users with the dataset names a preset we have."""
    for preset in re.findall(r'preset="(\w+)"', path.read_text()):
        assert preset in PRESETS


def test_shipped_probe_files_are_what_the_configs_describe():
    knowledge = ProbeSet.from_jsonl(CONFIGS / "probes" / "general_knowledge.jsonl")
    arithmetic = ProbeSet.from_jsonl(CONFIGS / "probes" / "arithmetic.jsonl")
    assert len(knowledge) == 40 and all(p.choices for p in knowledge)
    assert len(arithmetic) == 30 and not any(p.choices for p in arithmetic)
    assert {p.extract for p in arithmetic} == {"number"}
    assert all(str(p.answer).isdigit() for p in arithmetic)


@pytest.mark.parametrize("name,shipped", [("behaviour", "behaviour.jsonl"), ("knowledge", "general_knowledge.jsonl")])
def test_forgetwatch_probes_writes_the_starter_sets_the_configs_use(tmp_path, capsys, name, shipped):
    from forgetwatch.cli import main

    out = tmp_path / "new" / f"{name}.jsonl"
    assert main(["probes", "--starter", name, "--out", str(out)]) == 0
    assert "a smoke alarm, not a benchmark" in capsys.readouterr().out
    assert out.read_bytes() == (CONFIGS / "probes" / shipped).read_bytes()
    probes = ProbeSet.from_jsonl(out)
    if name == "behaviour":
        assert all(p.is_behaviour for p in probes)
        refusing = [p for p in probes if p.check.get("refuses") is True]
        answering = [p for p in probes if p.check.get("refuses") is False]
        assert len(refusing) >= 8 and len(answering) >= 8
        assert {"format", "length"} <= set(probes.categories)


HOSTILE = [  # a line that used to load and fail later, the key an error names
    pytest.param("table_rows: 1" + "0" * 5000, "table_rows", id="5000-digit-int"),
    pytest.param("category_max_forgetting: " + "[" * 5000 + "]" * 5000, "category_max_forgetting", id="deep"),
    pytest.param('output_dir: "runs/\\0"', "output_dir", id="nul-path"),
    pytest.param("max_logged_categories: 1000000000000000000000000000000", "max_logged_categories", id="absurd-size"),
]


@pytest.mark.parametrize("line, key", HOSTILE)
@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.name)
@pytest.mark.slow
def test_a_shipped_config_given_a_value_that_cannot_work_names_its_line(tmp_path, path, line, key):
    text = path.read_text(encoding="utf-8").rstrip("\n")
    copy = tmp_path / path.name
    copy.write_text(f"{text}\n{line}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        ForgetWatchConfig.from_yaml(copy)
    assert [e[:3] for e in info.value.errors] == [(str(copy), text.count("\n") + 2, key)]
