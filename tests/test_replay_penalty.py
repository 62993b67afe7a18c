"""The replay penalty's gradient equals that of a hand-written combined loss."""

from __future__ import annotations

import copy
import math

import pytest
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


@pytest.mark.parametrize("from_answer", [False, True], ids=["every-token", "from-a-start"])
def test_kl_gradient_equals_the_exact_kl_by_hand(toy, tmp_path, from_answer):
    from forgetwatch.scoring.next_tokens import BaseDistribution, base_distribution

    texts = toy.world.fact_texts()[:6]
    ids = encode_rows(
        toy.tokenizer,
        [r for r in ReplayPool.from_records([{"id": f"r{i}", "text": t} for i, t in enumerate(texts)])],
        64,
    )
    base = copy.deepcopy(toy.base)
    current = copy.deepcopy(toy.tuned).train()
    pad = toy.tokenizer.pad_token_id
    # a synthetic row learns from its answer on: positions before its start are context
    starts = [1 + i % 4 for i in range(len(ids))] if from_answer else None
    first = starts or [1] * len(ids)
    for k in (len(toy.tokenizer), 5):  # the whole vocabulary: exact; 5: the top five and the tail
        names = [f"r{i}" for i in range(len(ids))]
        cache = base_distribution(base, toy.tokenizer, names, ids, pad, k, 4, starts=starts)
        cache.save(tmp_path / "cache.npz")
        cache = BaseDistribution.load(tmp_path / "cache.npz")
        ours = copy.deepcopy(current)
        targets = [cache.row(f"r{i}") for i in range(len(ids))]
        mean = replay_backward(ours, ids, pad, 0.3, rows_per_batch=4, starts=starts, targets=targets)

        ref = copy.deepcopy(current)
        terms = []
        for i, row in enumerate(ids):
            x = torch.tensor([row])
            at = slice(first[i] - 1, None)
            with torch.no_grad():
                p_full = torch.log_softmax(base(input_ids=x).logits[0, :-1].float(), -1)[at]
            q = torch.log_softmax(ref(input_ids=x).logits[0, :-1].float(), -1)[at]
            top_ids, top_lp, tail = (torch.as_tensor(a) for a in cache.row(f"r{i}"))
            assert torch.allclose(top_lp, p_full.gather(-1, top_ids.long()), atol=1e-3, rtol=2e-3)  # stored at fp16
            qt = q.gather(-1, top_ids.long())
            q_tail = torch.log1p(-qt.exp().sum(-1).clamp(max=1 - 1e-7))
            terms.append((top_lp.exp() * (top_lp - qt)).sum(-1) + tail.exp() * (tail - q_tail))
            if k == len(toy.tokenizer):  # nothing outside: the exact KL(base ‖ current)
                exact = (p_full.exp() * (p_full - q)).sum(-1)
                torch.testing.assert_close(terms[-1], exact, atol=5e-3, rtol=1e-2)
        kl = torch.cat(terms).mean()
        (0.3 * kl).backward()
        assert abs(mean - float(kl)) < 1e-4 and mean > 0
        for a, b in zip(grads(ours), grads(ref)):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)
