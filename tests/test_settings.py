"""The groups of settings (forgetwatch.config.settings): each option declared once, in its group, and read from there
by the config, its YAML, evaluate, Scorer, the command line and the frameworks' keys."""

from __future__ import annotations

import inspect

import pytest

from forgetwatch import cli, evaluate
from forgetwatch.config import FLAT_KEYS, ConfigError, ForgetWatchConfig
from forgetwatch.config.settings import GROUPS, Monitor, Scoring
from forgetwatch.integrations.framework_settings import NAMES
from forgetwatch.scoring import Scorer


def test_each_field_has_its_help_where_it_is_declared():
    for group in [ForgetWatchConfig, *GROUPS.values()]:
        assert all(field.description and field.description.strip() for field in group.model_fields.values()), group


def test_no_signature_restates_a_scoring_option():
    """Scoring's fields are declared in its class body alone: the scorer, evaluate, the monitor and the merge take a
    Scoring (evaluate's and a call's batch_size, contract, override its batch size)."""
    from forgetwatch import ForgetWatchCallback, Watch, merge_sweep
    from forgetwatch.scoring.kinds import scoring_options

    names = set(Scoring.model_fields)
    takes = {
        f.__qualname__: set(inspect.signature(f).parameters) & names
        for f in (Scorer, Scorer.__call__, evaluate, scoring_options, Watch, ForgetWatchCallback, merge_sweep)
    }
    assert takes == {
        "Scorer": set(),
        "Scorer.__call__": {"batch_size"},
        "evaluate": {"batch_size"},
        "scoring_options": set(),
        "Watch": set(),
        "ForgetWatchCallback": set(),
        "merge_sweep": set(),
    }


def test_the_scorer_and_evaluate_take_a_scoring_and_only_their_own_keywords():
    assert list(inspect.signature(Scorer).parameters) == [
        "tokenizer",
        "probes",
        "scoring",
        "extract",
        "reference_logprobs",
        "refusal_detector",
    ]
    assert "scoring" in inspect.signature(evaluate).parameters
    with pytest.raises(TypeError):
        Scorer(None, None, max_new_tokens=0)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="Scoring"):
        Scorer(None, None, {"max_new_tokens": 8})  # type: ignore[arg-type]


def test_the_command_line_takes_its_scoring_flags_and_defaults_from_scoring():
    args = cli._parser().parse_args(["evaluate", "--model", "m", "--probes", "p", "--out", "a.json"])
    for name, field in Scoring.model_fields.items():
        if name not in cli.NO_FLAG:
            assert getattr(args, name) == field.default, name
    given = ["--max-new-tokens", "8", "--stop", '["Q:"]', "--no-shared-prefixes", "--chat-template", "--batch-size"]
    args = cli._parser().parse_args(["evaluate", "--model", "m", "--probes", "p", "--out", "a.json", *given, "auto"])
    assert cli._scoring(args) == Scoring(max_new_tokens=8, stop=["Q:"], shared_prefixes=False, chat_template=True)


def test_every_setting_is_a_framework_key():
    assert set(FLAT_KEYS) <= set(NAMES)


def test_a_group_reports_all_its_problems_together():
    with pytest.raises(ConfigError) as info:
        Scoring(max_new_tokens=0, stop="\n", batch_size="big")
    assert [e.key for e in info.value.errors] == ["batch_size", "max_new_tokens", "stop"]
    assert all(e.source == "Scoring" for e in info.value.errors)


def test_settings_are_read_through_their_groups():
    cfg = ForgetWatchConfig(monitor=Monitor(stop_metric="forgetting_adjusted"))
    assert cfg.monitor.stop_metric == "forgetting_adjusted" and not hasattr(cfg, "stop_metric")


def test_a_group_of_the_wrong_type_is_named():
    with pytest.raises(ConfigError) as info:
        ForgetWatchConfig(scoring={"batch_size": 8})  # type: ignore[arg-type]
    assert [e.key for e in info.value.errors] == ["scoring"]


#: Classes whose field shares a Scoring option's name but holds something else
OTHER_MEANINGS = {
    "Evaluation.stop": "why training should stop (contract)",
    "GenerationPrompt.stop": "one prompt's stop strings (a probe's own, or an lm-eval task's)",
    "GenerationPrompt.seed": "one response's seed, made of the run's seed and the probe's id",
    "LmEvalJudge.max_new_tokens": "an lm-eval task's own generation settings, as lm-eval reads them",
    "LmEvalJudge.stop": "an lm-eval task's own stop strings",
    "Answering.max_new_tokens": "replay's synthetic answers (its own default and bound)",
    "Answering.chat_template": "replay's synthetic answers",
    "Answering.stop": "replay's synthetic answers (none by default)",
    "ReplayOptions.batch_size": "pool rows replayed before each optimizer step",
    "ReplayOptions.seed": "the seed of replay's draws",
}


def test_each_scoring_option_is_declared_in_one_class_body():
    import ast
    from pathlib import Path

    import forgetwatch

    options = set(Scoring.model_fields)
    declared: dict[str, list[str]] = {}
    for path in Path(forgetwatch.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for line in node.body:
                    if isinstance(line, ast.AnnAssign) and getattr(line.target, "id", None) in options:
                        declared.setdefault(line.target.id, []).append(f"{node.name}.{line.target.id}")
    assert set(declared) == options
    again = {name: [c for c in where if c not in OTHER_MEANINGS] for name, where in declared.items()}
    assert again == {name: [f"Scoring.{name}"] for name in options}
