"""replay_select="rows": the pool's own loss rises drive the draws. The pure parts against hand
values, the per-row losses against a plain loop, and one step against the combined loss by hand."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from forgetwatch import ReplayPool
from forgetwatch.common.distributed import Ranks
from forgetwatch.config.settings import ReplaySettings
from forgetwatch.replay.driver import Replay
from forgetwatch.replay.scan import (
    ScanBase,
    decode_increase,
    encode_increase,
    row_losses,
    row_probabilities,
    scan_sample,
)
from forgetwatch.results.report import TransitionReport
from forgetwatch.results.store import REPLAY_SCAN, RunStore
from forgetwatch.run.repair import RunContext
from forgetwatch.scoring.scorer import pad_id
from forgetwatch.toy import ToyWorld


@pytest.fixture(scope="module")
def small():
    world = ToyWorld(seed=0)
    tokenizer = world.tokenizer()
    model = world.model(tokenizer)
    ToyWorld.train(model, tokenizer, world.fact_texts(), steps=30)
    return world, tokenizer, model


def by_hand_loss(model, ids, start=1):
    """One row, unpadded: the mean next-token loss over its tokens from ``start`` on."""
    x = torch.tensor([ids])
    lp = torch.log_softmax(model(input_ids=x).logits[0, :-1].float(), -1)
    nll = -lp[torch.arange(len(ids) - 1), x[0, 1:]]
    return nll[start - 1 :].mean()


def test_probabilities_follow_the_rise_with_a_floor():
    p = row_probabilities(np.array([0.4, 0.0, -1.0, 0.4]))
    assert p.tolist() == pytest.approx([0.475, 0.025, 0.025, 0.475]) and p.sum() == pytest.approx(1)
    assert row_probabilities(np.array([-0.1, 0.0])).tolist() == [0.5, 0.5]  # nothing rose: even


def test_the_sample_is_seeded_sorted_and_whole_when_small():
    assert scan_sample(5, 5, 3).tolist() == [0, 1, 2, 3, 4]
    a = scan_sample(1000, 64, 3)
    assert len(set(a.tolist())) == 64 and (np.diff(a) > 0).all() and (a == scan_sample(1000, 64, 3)).all()
    assert (a != scan_sample(1000, 64, 4)).any()


def test_the_rises_round_trip_bit_for_bit_and_bad_ones_are_refused():
    x = (np.random.default_rng(0).normal(size=7) / 3).astype(np.float32)
    assert decode_increase(encode_increase(x), 7).tobytes() == x.tobytes()
    assert decode_increase(encode_increase(x), 6) is None
    assert decode_increase(encode_increase(np.array([np.nan], np.float32)), 1) is None
    assert decode_increase("not base64!", 1) is None


@pytest.mark.slow
def test_row_losses_equal_a_plain_loop(small):
    world, tokenizer, model = small
    rows = [tokenizer(t)["input_ids"] for t in world.fact_texts()[:9]]
    starts = [1, 3, 1, 2, 5, 1, 1, 4, 1]
    got = row_losses(model, rows, starts, pad_id(tokenizer), 4, Ranks.alone(), tokenizer)
    with torch.no_grad():
        want = [float(by_hand_loss(model.eval(), r, s)) for r, s in zip(rows, starts)]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert model.training is False  # borrowed: handed back in the mode it was found in (eval here)


def test_a_damaged_scan_file_says_why(tmp_path):
    path = tmp_path / REPLAY_SCAN
    ScanBase(["r1", "r2"], [0.5, 1.25], {"pool": "x"}).save(path)
    assert ScanBase.load(path).base_loss == [0.5, 1.25]
    path.write_text(path.read_text().replace("1.25", "-1.0"))
    with pytest.raises(ValueError, match="damaged: a loss is not a finite number from 0"):
        ScanBase.load(path)
    path.write_text("{")
    with pytest.raises(ValueError, match=f"{REPLAY_SCAN}: damaged"):
        ScanBase.load(path)


@pytest.mark.slow
def test_one_step_after_a_scan_equals_the_combined_loss_by_hand(small, tmp_path):
    world, tokenizer, trained = small
    pool = ReplayPool.from_records(
        [{"id": f"r{i}", "text": t} for i, t in enumerate(world.fact_texts()[::3][:12])]  # any text: no probes here
    )
    model = copy.deepcopy(trained)
    weight, size = 0.7, 4
    replay = Replay(pool, ReplaySettings(select="rows", weight=weight, batch_size=size, seed=5, scan_rows=10))
    run = RunContext(
        ranks=Ranks.alone(), writes=True, store=RunStore(tmp_path), tokenizer=tokenizer, rows_per_batch=lambda m: 3
    )
    replay.begin(model, run)
    assert (tmp_path / REPLAY_SCAN).is_file() and len(replay.scanned) == 10  # 10 of the 12 rows, kept
    base_model = copy.deepcopy(model)

    # the model drifts (plain SGD on other text), then an evaluation scans the rows
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for text in world.distraction_texts(n=6):
        x = torch.tensor([tokenizer(text)["input_ids"]])
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()
    replay.on_evaluation(TransitionReport(), model)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    replay.step(model, tokenizer, pad_id(tokenizer), 0.0, 3, Ranks.alone())

    # by hand: each scanned row's mean loss now and at the base, its rise, the probabilities,
    # the seeded draw of the first batch, and weight x the mean loss over the drawn rows' tokens
    ids = [tokenizer(pool[i].text)["input_ids"] for i in range(len(pool))]
    scanned = [int(i[1:]) for i in replay.scanned]
    with torch.no_grad():
        rise = np.array(
            [
                float(by_hand_loss(model.eval(), ids[i])) - float(by_hand_loss(base_model.eval(), ids[i]))
                for i in scanned
            ]
        )
    model.train()
    np.testing.assert_allclose(replay.increase, rise, atol=2e-5)
    p = np.maximum(rise, 0) / np.maximum(rise, 0).sum() * 0.9 + 0.1 / len(rise)
    picks = np.random.default_rng([5, 0]).choice(len(scanned), size, replace=False, p=replay.weights)
    np.testing.assert_allclose(replay.weights, p, atol=1e-4)
    hand = copy.deepcopy(model)
    rows = [ids[scanned[i]] for i in picks]
    losses = []
    for row in rows:
        x = torch.tensor([row])
        lp = torch.log_softmax(hand(input_ids=x).logits[0, :-1].float(), -1)
        losses.append(-lp[torch.arange(len(row) - 1), x[0, 1:]])
    (weight * torch.cat(losses).mean()).backward()
    for (name, a), b in zip(model.named_parameters(), hand.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=2e-6, rtol=1e-4, msg=name)
    assert replay.tokens == sum(map(len, rows)) and replay.metrics()["replay/drift"] == pytest.approx(
        np.maximum(rise, 0).mean(), abs=2e-5
    )


@pytest.mark.slow
def test_a_scan_that_fails_or_finds_no_number_never_stops_training(small, tmp_path, caplog, monkeypatch):
    world, tokenizer, model = small
    pool = ReplayPool.from_records([{"id": f"r{i}", "text": t} for i, t in enumerate(world.fact_texts()[:6])])
    replay = Replay(pool, ReplaySettings(select="rows", batch_size=2))
    run = RunContext(
        ranks=Ranks.alone(), writes=True, store=RunStore(tmp_path), tokenizer=tokenizer, rows_per_batch=lambda m: 3
    )
    replay.begin(model, run)
    base = np.asarray(replay.scan_base.base_loss)
    # a row whose loss is not a number counts as risen by 0: nothing NaN reaches the draws or the logs
    monkeypatch.setattr(replay, "scan_losses", lambda m: base + np.array([0.5, np.nan, np.inf, 0, 0, 0]))
    replay.on_evaluation(TransitionReport(), model)
    assert replay.increase.tolist() == [0.5, 0, 0, 0, 0, 0] and np.isfinite(list(replay.metrics().values())).all()

    def broken(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")

    monkeypatch.setattr(torch.nn.Module, "__call__", broken)
    monkeypatch.setattr(replay, "scan_losses", Replay.scan_losses.__get__(replay))
    with caplog.at_level("WARNING", logger="forgetwatch"):
        replay.on_evaluation(TransitionReport(), model)  # a warning, not an exception
        replay.on_evaluation(TransitionReport(), model)
    assert "OutOfMemoryError: CUDA out of memory (injected)" in replay.scan_off
    assert caplog.text.count("the replay pool's scan failed") == 1 and replay.increase.tolist()[0] == 0.5
    assert "replay/drift" not in replay.metrics()
