"""Replay's options live with it: ``Replay(pool, loss=, weight=, select=, ...)``, each checked when
the replay is built, retired values refused naming what to give instead, and the same options as
``replay_<name>`` keys of a framework's settings."""

from __future__ import annotations

import pytest

from forgetwatch import ForgetWatchCallback, Replay, ReplayPool, Watch
from forgetwatch.config import ConfigError
from forgetwatch.integrations.framework_settings import FrameworkSettings

POOL = ReplayPool.from_records([{"id": "r1", "text": "Rivers run to the sea.", "category": "geo"}])


def test_the_defaults_and_the_options_given():
    replay = Replay(POOL)
    assert (replay.loss, replay.weight, replay.select, replay.batch_size, replay.top_k, replay.seed) == (
        "lm",
        1.0,
        "categories",
        8,
        32,
        0,
    )
    kl = Replay(POOL, loss="kl", weight=5, select="uniform", batch_size=1024, top_k=1024, seed=2**63 - 1)
    assert (kl.loss, kl.weight, kl.select, kl.batch_size, kl.top_k) == ("kl", 5.0, "uniform", 1024, 1024)
    assert Replay(POOL, weight=100).weight == 100.0 and Replay(POOL, weight=0).weight == 0.0


@pytest.mark.parametrize(
    "options, words",
    [
        ({"weight": "auto"}, 'weight="auto" is retired: in its own benchmark it forgot more than a fixed weight'),
        ({"select": "rows"}, 'select="rows" is retired: drawing by category forgot fewer probes'),
    ],
)
def test_a_retired_value_says_what_to_give_instead(options, words):
    with pytest.raises(ValueError) as info:
        Replay(POOL, **options)
    assert words in str(info.value)


@pytest.mark.parametrize(
    "options",
    [
        {"weight": 1e30},
        {"weight": -1},
        {"loss": "mse"},
        {"select": "rivers"},
        {"top_k": 10**6},
        {"batch_size": 0},
        {"seed": 2**64},
        {"weight": float("nan")},
    ],
)
def test_an_option_that_cannot_work_is_refused_when_built(options):
    with pytest.raises(ConfigError) as info:
        Replay(POOL, **options)
    assert [(p.source, p.key) for p in info.value.errors] == [("ReplayOptions", *options)]


def test_a_pool_alone_is_replayed_with_the_defaults_and_a_path_is_refused(toy):
    callback = ForgetWatchCallback(toy.probes, replay=POOL)
    assert isinstance(callback.replay, Replay) and callback.replay.weight == 1.0
    given = Replay(POOL, weight=2.0)
    assert ForgetWatchCallback(toy.probes, replay=given).replay is given
    with pytest.raises(TypeError, match=r"ReplayPool.from_jsonl\(path\)"):  # the way to make one
        ForgetWatchCallback(toy.probes, replay="pool.jsonl")
    with pytest.raises(TypeError, match="'replay'"):  # the watch only watches
        Watch(toy.probes, output_dir="x", replay=POOL)


def test_a_frameworks_replay_keys_build_the_replay(tmp_path):
    pool = tmp_path / "pool.jsonl"
    pool.write_text('{"id": "r1", "text": "Rivers run to the sea."}\n')
    keys = {
        "forgetwatch_probes": "configs/probes/general_knowledge.jsonl",
        "forgetwatch_replay": str(pool),
        "forgetwatch_replay_loss": "kl",
        "forgetwatch_replay_weight": 3,
    }
    settings = FrameworkSettings.from_keys(keys, "train.yaml")
    assert (settings.replay.loss, settings.replay.weight, len(settings.replay.pool)) == ("kl", 3.0, 1)
    with pytest.raises(ConfigError) as info:
        FrameworkSettings.from_keys({**keys, "forgetwatch_replay_weight": "auto"}, "train.yaml")
    assert [(e.source, e.key) for e in info.value.errors] == [("train.yaml", "forgetwatch_replay_weight")]
    assert "retired" in str(info.value)
    with pytest.raises(ConfigError) as info:
        FrameworkSettings.from_environ(
            {"FORGETWATCH_PROBES": "configs/probes/general_knowledge.jsonl", "FORGETWATCH_REPLAY_SELECT": "uniform"}
        )
    assert "FORGETWATCH_REPLAY" in str(info.value)  # the pool's variable, to set
