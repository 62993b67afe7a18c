"""Replay at each optimizer step: a failure while replaying never reaches the trainer, and rows
too short to teach anything are counted when training begins, never drawn, and a pool of
nothing else is refused."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from injected import OutOfMemoryAbove
from trainers import run_view

from forgetwatch import ReplayPool, ReplayPoolError
from forgetwatch.replay import Replay
from forgetwatch.replay.sampler import ReplaySampler
from forgetwatch.toy import ToyWorld


@pytest.fixture(scope="module")
def small():
    """A tokenizer without a start token (a one-letter row is one token, as with Qwen2's) and an
    untrained tiny model: replay's arithmetic needs no knowledge."""
    world = ToyWorld(seed=0)
    tokenizer = world.tokenizer(add_bos=False)
    return SimpleNamespace(world=world, tokenizer=tokenizer, model=world.model(tokenizer))


def begun(replay, model, tokenizer):
    """``replay`` as training begins in one process."""
    replay.begin(model, run_view(tokenizer))
    return replay


def sentences(n):
    return [{"id": f"r{i}", "text": f"Remember: a red flag flies over Zeta{i}."} for i in range(n)]


def test_a_pool_of_one_token_rows_is_refused_before_training(small):
    pool = ReplayPool.from_records([{"id": f"r{i}", "text": c} for i, c in enumerate("abcdefg")])
    with pytest.raises(ReplayPoolError, match=r"\b7\b.*'r0', 'r1', 'r2', 'r3', 'r4' and 2 more"):  # how many; which
        begun(Replay(pool), small.model, small.tokenizer)


def test_rows_too_short_are_counted_once_and_never_drawn(small, warned):
    pool = ReplayPool.from_records(
        [{"id": "a", "text": "a", "category": "short"}, *sentences(3), {"id": "b", "text": "b"}]
    )
    replay = Replay(pool, batch_size=4)
    begun(replay, small.model, small.tokenizer)
    assert replay.dropped == ["a", "b"]
    assert len(warned("2 of the 5")) == 1  # how many rows, of how many
    drawn = {r.id for _ in range(10) for r in replay.sampler.next_batch(4, replay.weights)}
    assert drawn == {"r0", "r1", "r2"}  # a category with no usable row ("short") is not drawn from either
    assert replay.sampler.categories == ["all"]


def trainers_gradient(small, model):
    """The gradient the trainer leaves before its optimizer step (one batch of other text)."""
    batch = small.tokenizer(["Two plus two is four."], return_tensors="pt")
    model.module(**batch, labels=batch["input_ids"]).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_a_failure_while_replaying_switches_replay_off_and_never_reaches_the_trainer(small, warned):
    model = OutOfMemoryAbove(copy.deepcopy(small.model), limit=2)  # a replay micro-batch of 4 rows runs out
    replay = Replay(ReplayPool.from_records(sentences(8)), batch_size=4)
    begun(replay, model, small.tokenizer)
    before = trainers_gradient(small, model)
    for _ in range(3):  # the trainer's optimizer steps go on; replay is tried once, then off
        replay.before_optimizer_step(model)
    for name, p in model.named_parameters():  # the failed step left the trainer's gradient as it was
        torch.testing.assert_close(p.grad, before[name], rtol=0, atol=0, msg=name)
    assert model.sizes == [4]
    assert len(warned("replay", "OutOfMemoryError")) == 1  # what failed, and how
    assert replay.off and replay.metrics() == {}  # no weight logged for what was not replayed
    assert replay.sampler.drawn == 3  # still one draw per step: a resume draws the same rows as this run


def test_a_replay_that_works_still_adds_its_gradient(small):
    model = OutOfMemoryAbove(copy.deepcopy(small.model), limit=8)
    replay = Replay(ReplayPool.from_records(sentences(8)), batch_size=4)
    begun(replay, model, small.tokenizer)
    before = trainers_gradient(small, model)
    replay.before_optimizer_step(model)
    drawn = ReplaySampler(replay.sampler.pool, 0).next_batch(4, replay.weights)  # the same draw, again
    figures = replay.metrics()
    assert not replay.off and set(figures) == {"replay/weight", "replay/loss", "replay/tokens"}
    assert figures["replay/tokens"] == sum(len(replay.encoded[r.id]) for r in drawn) > 0  # every token forwarded
    assert any(not torch.equal(p.grad, before[n]) for n, p in model.named_parameters())


def test_stepping_before_the_run_began_is_a_programming_error(small):
    with pytest.raises(RuntimeError, match=r"Replay.before_optimizer_step\(\)"):
        Replay(ReplayPool.from_records(sentences(2))).before_optimizer_step(small.model)
