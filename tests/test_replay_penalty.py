"""The replay penalty's gradient equals that of a hand-written combined loss."""

from __future__ import annotations

import copy
import math

import torch

from forgetwatch import ReplayPool
from forgetwatch.replay.penalty import encode_rows, replay_backward


def grads(model):
    return [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


def test_replay_gradient_adds_weight_times_the_mean_token_loss(toy):
    texts = toy.world.fact_texts()[:11]
    pool = ReplayPool.from_records([{"id": f"r{i}", "text": t} for i, t in enumerate(texts)])
    ids = encode_rows(toy.tokenizer, list(pool), max_length=64)
    batch = toy.tokenizer(toy.world.distraction_texts(n=4), return_tensors="pt", padding=True)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    weight = 0.7

    # the trainer's backward, then the replay's
    ours = copy.deepcopy(toy.base).train()
    ours(**batch, labels=labels).loss.backward()
    mean = replay_backward(ours, ids, pad_id=toy.tokenizer.pad_token_id, weight=weight, rows_per_batch=3)

    # by hand: one combined loss, each replay row alone and unpadded
    ref = copy.deepcopy(toy.base).train()
    token_losses = []
    for row in ids:
        x = torch.tensor([row])
        lp = torch.log_softmax(ref(input_ids=x).logits[0, :-1].float(), -1)
        token_losses.append(-lp[torch.arange(len(row) - 1), x[0, 1:]])
    replay = torch.cat(token_losses).mean()
    (ref(**batch, labels=labels).loss + weight * replay).backward()

    assert abs(mean - float(replay)) < 1e-5
    for a, b in zip(grads(ours), grads(ref)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_weight_zero_runs_nothing(toy):
    model = copy.deepcopy(toy.base).train()
    ids = encode_rows(toy.tokenizer, list(ReplayPool.from_records([{"id": "r", "text": "a b c d"}])), 32)
    state = torch.get_rng_state()
    assert math.isnan(replay_backward(model, ids, pad_id=0, weight=0.0))
    assert math.isnan(replay_backward(model, [], pad_id=0, weight=1.0))
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(state, torch.get_rng_state())
