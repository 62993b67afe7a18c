"""Synthetic replay: a pool of prompts, the base's greedy answers its targets. The rows against a
plain generate loop, one step against the loss on the answers by hand, and the kept answers."""

from __future__ import annotations

import copy

import pytest
import torch
from trainers import run_view

from forgetwatch import ReplayPool
from forgetwatch.replay import Replay
from forgetwatch.replay.kept import REPLAY_ANSWERS
from forgetwatch.replay.sampler import ReplaySampler
from forgetwatch.replay.synthetic import KeptAnswers
from forgetwatch.scoring.generation import Generated
from forgetwatch.scoring.scorer import pad_id
from forgetwatch.store.write import RunStore
from forgetwatch.toy import ToyWorld

# trains a toy model: pytest -m "not slow" leaves them out
pytestmark = pytest.mark.slow

PROMPTS = ["Remember: a red flag flies over", "The capital of", "One plus one is", "Rivers counted in"]


@pytest.fixture(scope="module")
def small():
    world = ToyWorld(seed=0)
    tokenizer = world.tokenizer()
    model = world.model(tokenizer)
    ToyWorld.train(model, tokenizer, world.fact_texts() + world.distraction_texts(n=100), steps=60)
    return world, tokenizer, model


def greedy_rows(model, tokenizer, prompts, max_new_tokens):
    """By hand: each prompt's tokens and the model's greedy continuation, one prompt at a time
    (up to EOS, which the row keeps)."""
    rows = []
    for text in prompts:
        ids = tokenizer(text)["input_ids"]
        with torch.no_grad():
            out = (
                model.eval()
                .generate(
                    torch.tensor([ids]),
                    attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                    max_new_tokens=max_new_tokens,
                    do_sample=False,
                    pad_token_id=pad_id(tokenizer),
                )[0, len(ids) :]
                .tolist()
            )
        eos = tokenizer.eos_token_id
        answer = out[: out.index(eos) + 1] if eos in out else out
        rows.append((ids + answer, len(ids)))
    return rows


def begin(replay, model, tokenizer, folder, step=0):
    """``replay`` as training begins (or resumes at ``step``) in one process, its files in ``folder``."""
    replay.begin(model, run_view(tokenizer, store=RunStore(folder), step=step))
    return replay


def test_prompt_rows_are_the_prompt_and_the_greedy_answer_and_one_step_learns_the_answer_only(small, tmp_path):
    world, tokenizer, trained = small
    model = copy.deepcopy(trained)
    weight, size = 0.5, 3
    pool = ReplayPool.from_prompts(PROMPTS, max_new_tokens=5)
    replay = Replay(pool, weight=weight, batch_size=size)
    model.train()
    begin(replay, model, tokenizer, tmp_path)
    by_hand = greedy_rows(copy.deepcopy(trained), tokenizer, PROMPTS, 5)
    assert [(replay.encoded[f"p{i}"], replay.starts[f"p{i}"]) for i in range(4)] == by_hand
    assert model.training  # the model handed back as found, in train mode

    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    replay.before_optimizer_step(model)
    drawn = ReplaySampler(pool, 0).next_batch(size, {"all": 1.0})
    hand = copy.deepcopy(trained).train()
    losses = []
    for row in drawn:
        ids, start = by_hand[int(row.id[1:])]
        x = torch.tensor([ids])
        lp = torch.log_softmax(hand(input_ids=x).logits[0, :-1].float(), -1)
        losses.append(-lp[torch.arange(len(ids) - 1), x[0, 1:]][start - 1 :])  # the answer's tokens only
    (weight * torch.cat(losses).mean()).backward()
    for (name, a), b in zip(model.named_parameters(), hand.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=2e-6, rtol=1e-4, msg=name)
    assert replay.tokens == sum(len(by_hand[int(r.id[1:])][0]) for r in drawn)


def test_answers_are_kept_once_and_read_back_on_resume(small, tmp_path, monkeypatch):
    world, tokenizer, model = small
    pool = ReplayPool.from_prompts(PROMPTS, max_new_tokens=4, category="facts")
    fresh = begin(Replay(pool), model, tokenizer, tmp_path)
    kept = KeptAnswers.load(tmp_path / REPLAY_ANSWERS)
    assert sorted(kept.answers) == ["p0", "p1", "p2", "p3"] and kept.key["pool"] == pool.fingerprint()

    def no_generation(*args, **kwargs):
        raise AssertionError("a resume generates nothing: the kept answers serve")

    monkeypatch.setattr("forgetwatch.replay.replay.answer_prompts", no_generation)
    resumed = begin(Replay(pool), model, tokenizer, tmp_path, 10)
    assert resumed.encoded == fresh.encoded and resumed.starts == fresh.starts and resumed.key == fresh.key

    # a damaged file, another pool's, or one that lacks a prompt's answer: one error says why
    short = KeptAnswers({i: a for i, a in kept.answers.items() if i != "p3"}, kept.key)
    for damage, says in [
        (lambda p: p.write_text("{"), "damaged"),
        (KeptAnswers({"p0": Generated("x", (1,), True)}, {"pool": "other"}).save, "made for another replay pool"),
        (short.save, "damaged: it has no answer to prompt 'p3'"),
    ]:
        damage(tmp_path / REPLAY_ANSWERS)
        with pytest.raises(ValueError, match=rf"it cannot serve \(.*replay_answers.json: {says}"):
            begin(Replay(pool), model, tokenizer, tmp_path, 10)
