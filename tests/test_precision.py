"""The precision answers are computed in: the weights' own by default, even when the trainer
runs in mixed precision; recorded with the answers, and answers of another precision refused."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from trainers import make_trainer

from forgetwatch import Answers, Monitor, Scoring, compare, evaluate
from forgetwatch.integrations.callback import ForgetWatchCallback
from forgetwatch.results.answers import AnswersMismatchError
from forgetwatch.scoring.borrow import compute_precision, epsilon, is_reduced, scoring_in


def logprobs(answers: Answers) -> np.ndarray:
    return np.concatenate([*answers.choice_logprobs, answers.gold_logprob[np.isfinite(answers.gold_logprob)]])


def test_recorded_precision_names_weights_and_autocast(toy):
    cpu = torch.device("cpu")
    assert compute_precision(toy.base, cpu, "weights") == "float32"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert compute_precision(toy.base, cpu, "autocast") == "bfloat16 autocast, float32 weights"
        assert compute_precision(toy.base, cpu, "weights") == "float32"
    half = copy.deepcopy(toy.base).to(torch.bfloat16)
    assert compute_precision(half, cpu, "weights") == "bfloat16"
    assert is_reduced("bfloat16") and not is_reduced("float32")
    assert epsilon("float16 autocast, float32 weights") == torch.finfo(torch.float16).eps


def test_weights_precision_ignores_an_ambient_autocast_and_autocast_follows_it(toy):
    plain = evaluate(toy.base, toy.tokenizer, toy.probes, show_progress=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        same = evaluate(toy.base, toy.tokenizer, toy.probes, show_progress=False)
        rounded = evaluate(
            toy.base, toy.tokenizer, toy.probes, show_progress=False, scoring=Scoring(precision="autocast")
        )
    assert same.scoring == plain.scoring and plain.scoring["precision"] == "float32"
    np.testing.assert_array_equal(logprobs(same), logprobs(plain))
    assert rounded.scoring["precision"] == "bfloat16 autocast, float32 weights"
    assert np.abs(logprobs(rounded) - logprobs(plain)).max() > 1e-3  # bf16 arithmetic, visibly
    with pytest.raises(AnswersMismatchError, match="another precision"):
        compare(plain, rounded)


def test_accelerates_wrapper_is_set_aside_while_scoring_and_put_back(toy, fresh_accelerate_state):
    from accelerate import Accelerator

    model = Accelerator(cpu=True, mixed_precision="bf16").prepare_model(copy.deepcopy(toy.base))
    assert compute_precision(model, torch.device("cpu"), "autocast") == "bfloat16 autocast, float32 weights"
    wrapped = vars(model)["forward"]
    ids = torch.tensor([[1, 2, 3]])
    with scoring_in(model, torch.device("cpu"), "weights"), torch.no_grad():
        assert model.forward is vars(model)["_original_forward"]
        inside = model(ids).logits
    assert vars(model)["forward"] is wrapped
    with torch.no_grad():
        assert torch.equal(inside, toy.base(ids).logits)
        assert not torch.equal(model(ids).logits, inside)  # the wrapper computes in bf16
    with pytest.raises(RuntimeError), scoring_in(model, torch.device("cpu"), "weights"):
        raise RuntimeError("a failure inside")
    assert vars(model)["forward"] is wrapped


@pytest.mark.slow
def test_a_bf16_mixed_precision_run_is_watched_in_the_weights_precision(toy, train_data, tmp_path):
    cb = ForgetWatchCallback(toy.probes, eval_steps=10)
    trainer = make_trainer(toy, train_data, tmp_path, [cb], bf16=True, max_steps=10)
    trainer.train()
    assert "_original_forward" in vars(trainer.model)  # the trainer did compute in bf16 autocast
    base = Answers.load(tmp_path / "forgetwatch" / "base_answers.npz")
    offline_base = evaluate(toy.base, toy.tokenizer, toy.probes, show_progress=False)
    assert base.scoring["precision"] == offline_base.scoring["precision"] == "float32"
    np.testing.assert_allclose(logprobs(base), logprobs(offline_base), atol=1e-5)
    assert "noise_floor" not in base.meta  # full precision: no noise check by default

    # the last evaluation equals an offline recount of the final weights, in a fresh model
    final = copy.deepcopy(toy.base)
    final.load_state_dict(trainer.model.state_dict())
    offline = compare(offline_base, evaluate(final, toy.tokenizer, toy.probes, show_progress=False))
    step, report = cb.history[-1]
    assert step == 10
    assert (report.forgotten_ids, report.gained_ids) == (offline.forgotten_ids, offline.gained_ids)


@pytest.mark.slow
def test_autocast_precision_is_recorded_and_measures_the_noise_floor(toy, train_data, tmp_path):
    cb = ForgetWatchCallback(
        toy.probes, eval_steps=10, scoring=Scoring(precision="autocast", batch_size=16), monitor=Monitor()
    )
    trainer = make_trainer(toy, train_data, tmp_path, [cb], bf16=True, max_steps=10)
    trainer.train()
    base = Answers.load(tmp_path / "forgetwatch" / "base_answers.npz")
    assert base.scoring["precision"] == "bfloat16 autocast, float32 weights"
    assert "noise_floor" in base.meta
    offline = evaluate(toy.base, toy.tokenizer, toy.probes, show_progress=False)
    assert np.abs(logprobs(base) - logprobs(offline)).max() > 1e-3

    # a later run in the weights' precision does not reuse that snapshot: it scores the base again
    again = ForgetWatchCallback(toy.probes, eval_steps=10, scoring=Scoring(batch_size=16))
    make_trainer(toy, train_data, tmp_path, [again], bf16=True, max_steps=10).train()
    rescored = Answers.load(tmp_path / "forgetwatch" / "base_answers.npz")
    assert rescored.scoring["precision"] == "float32"


def test_train_kl_forwards_follow_the_scoring_precision(toy, fresh_accelerate_state):
    from accelerate import Accelerator

    from forgetwatch.common.distributed import Ranks
    from forgetwatch.scoring.next_tokens import row_sums

    wrapped = Accelerator(cpu=True, mixed_precision="bf16").prepare_model(copy.deepcopy(toy.base))
    rows = [toy.tokenizer(t)["input_ids"] for t in toy.world.fact_texts()[:6]]

    def nll(logits, ids, _):
        return torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")

    def sums(model, compute):
        return row_sums(model, toy.tokenizer, rows, [1] * len(rows), 0, 4, Ranks(), nll, compute=compute)

    plain = sums(toy.base, "weights")
    np.testing.assert_array_equal(sums(wrapped, "weights"), plain)
    assert np.abs(sums(wrapped, "autocast") - plain).max() > 1e-3  # the trainer's bf16, for a training loss
