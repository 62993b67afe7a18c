"""The train-KL signal (forgetwatch/drift/train_kl): exactly 0 at the base, the KL by hand, kept
once and read back on resume, logged at each evaluation of a Watch, off when asked, LoRA's base.

Trainer runs (Trainer, SFT, DPO, GRPO, a resume, DDP) assert it beside their own checks:
tests/test_replay_training.py, tests/test_trl_trainers.py, tests/test_distributed.py."""

from __future__ import annotations

import copy
import json
import logging

import numpy as np
import pytest
import torch
from trainers import run_view

from forgetwatch import Answers, Monitor, Output, Watch
from forgetwatch.common.distributed import Ranks
from forgetwatch.run import train_kl
from forgetwatch.run.train_kl import TrainKL, TrainRows, as_train_rows
from forgetwatch.store import TRAIN_KL
from forgetwatch.store.write import RunStore

QUIET = Output(verbose=False)
KEY = "forgetwatch/drift/train_kl"


@pytest.fixture(scope="module")
def rows(toy):
    """Rows of the post-training text: half measured from their second token, half on their
    second half only (a prompt and its answer)."""
    ids = toy.tokenizer(toy.world.distraction_texts(n=12))["input_ids"]
    return [(x, 1) if i % 2 else (x, len(x) // 2) for i, x in enumerate(ids)]


def context(tmp_path, **more):
    return run_view(more.pop("tokenizer"), store=RunStore(tmp_path), **more)


def by_hand(base, current, rows, k=None):
    """Mean KL(base ‖ current) per target token, one unpadded row at a time, in float64: over
    the whole vocabulary, or (``k``) over the base's top k and one tail for the rest."""
    total, count = 0.0, 0
    with torch.no_grad():
        for ids, start in rows:
            x = torch.tensor([ids])
            lp = torch.log_softmax(base(input_ids=x).logits[0, start - 1 : -1].double(), -1)
            lq = torch.log_softmax(current(input_ids=x).logits[0, start - 1 : -1].double(), -1)
            if k is None:
                kl = (lp.exp() * (lp - lq)).sum(-1)
            else:
                top_lp, top = lp.topk(k, -1)
                q_top = lq.gather(-1, top)
                tail, q_tail = (torch.log1p(-v.exp().sum(-1)) for v in (top_lp, q_top))
                kl = (top_lp.exp() * (top_lp - q_top)).sum(-1) + tail.exp() * (tail - q_tail)
            total, count = total + float(kl.sum()), count + len(kl)
    return total / count


@pytest.mark.parametrize("k", [None, 32], ids=["whole-vocabulary", "top-32-and-tail"])
def test_zero_at_the_base_and_the_kl_by_hand(toy, rows, tmp_path, k):
    signal = TrainKL(128, top_k=k or toy.base.config.vocab_size)
    signal.begin(toy.base, context(tmp_path, tokenizer=toy.tokenizer), rows)
    at_base = signal.measure(toy.base, Ranks())
    assert at_base["train_kl"] == 0.0  # the same forward: exactly
    tokens = sum(len(x) - s for x, s in rows)
    assert (at_base["rows"], at_base["tokens"]) == (len(rows), tokens)
    moved = signal.measure(toy.tuned, Ranks())["train_kl"]
    assert moved > 0.1 and moved == pytest.approx(by_hand(toy.base, toy.tuned, rows, k), rel=1e-5)


def test_rows_are_sampled_cut_and_checked():
    many = [[1, 2, 3, i] for i in range(10)]
    picked = as_train_rows(many, max_rows=4, seed=0)
    assert len(picked.rows) == 4 and picked.rows == as_train_rows(many, max_rows=4, seed=0).rows
    assert [r[0] for r in picked.rows] == sorted(r[0] for r in picked.rows)  # in their order
    long = as_train_rows([list(range(600)), ([1, 2], 2)], max_rows=8)  # a row with no target is left out
    assert [len(ids) for ids, _ in long.rows] == [train_kl.MAX_TOKENS]
    # a tuple of token ids is a row, a pair of ids and a number is a row and its start; arrays are read
    assert as_train_rows([(5, 6), (np.array([5, 6, 7]), 2)], max_rows=8).rows == [([5, 6], 1), ([5, 6, 7], 2)]
    prompts = TrainRows([([1, 2, 3], 3)], "grpo", completion_tokens=8)  # the completion comes later: kept whole
    assert as_train_rows(prompts, max_rows=8) == prompts
    for bad, match in (
        ("text", "list of token-id lists"),
        ([["a", "b"]], r"train_rows\[0\]"),
        ([([1, 2], 0)], "start"),
    ):
        with pytest.raises(ValueError, match=match):
            as_train_rows(bad, max_rows=8)


def test_a_watch_logs_it_at_each_evaluation_and_resumes_from_the_kept_file(toy, rows, tmp_path, monkeypatch, caplog):
    first = Watch(toy.probes, output_dir=tmp_path, eval_steps=2, output=QUIET)
    first.start(toy.base, toy.tokenizer, train_rows=rows)
    moved = first.evaluate(toy.tuned, 2)
    first.due(3)
    kept = first.state_dict()
    assert first.evaluate(toy.base, 4).metrics[KEY] == 0.0
    assert moved.metrics[KEY] == moved.drift["train_kl"] > 0
    assert moved.drift["rows"] == len(rows) and moved.drift["seconds"] >= 0
    written = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert [r["drift"]["train_kl"] for r in written] == [moved.drift["train_kl"], 0.0]

    def refuse(*args, **kwargs):
        raise AssertionError("measured the base again on resume")

    # resumed with moved weights: the kept distribution and rows are used, never measured again
    monkeypatch.setattr(train_kl, "base_distribution", refuse)
    again = Watch(toy.probes, output_dir=tmp_path, eval_steps=2, output=QUIET)
    again.load_state_dict(kept)
    again.start(toy.tuned, toy.tokenizer, train_rows=rows)
    assert again.evaluate(toy.base, 4).metrics[KEY] == 0.0
    assert again.evaluate(toy.tuned, 6).metrics[KEY] == moved.drift["train_kl"]

    # no copy to read back: one warning, the signal off, the run goes on
    (tmp_path / TRAIN_KL).write_bytes(b"not an npz")
    lost = Watch(toy.probes, output_dir=tmp_path, eval_steps=2, output=QUIET)
    lost.load_state_dict(kept)
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        lost.start(toy.tuned, toy.tokenizer, train_rows=rows)
        evaluation = lost.evaluate(toy.tuned, 4)
    assert caplog.text.count("train KL (forgetwatch/drift/train_kl) is off for this resumed run") == 1
    assert f"{tmp_path / TRAIN_KL}: " in caplog.text  # the file, named
    assert KEY not in evaluation.metrics and not evaluation.drift


def test_off_with_train_kl_rows_0_or_no_rows(toy, rows, tmp_path):
    for name, settings, given in (("zero", Monitor(train_kl_rows=0), rows), ("none", None, None)):
        watch = Watch(toy.probes, output_dir=tmp_path / name, eval_steps=2, output=QUIET, monitor=settings)
        watch.start(toy.base, toy.tokenizer, train_rows=given)
        evaluation = watch.evaluate(toy.tuned, 2)
        assert KEY not in evaluation.metrics and not evaluation.drift
        assert not (tmp_path / name / TRAIN_KL).exists()


def test_a_damaged_or_foreign_copy_leaves_it_off_and_says_why(toy, rows, tmp_path, caplog):
    signal = TrainKL(128)
    signal.begin(toy.base, context(tmp_path / "run", tokenizer=toy.tokenizer), rows)
    good = tmp_path / "run" / TRAIN_KL
    bad, other, foreign = tmp_path / "bad", tmp_path / "other", tmp_path / "foreign"
    bad.mkdir()
    with np.load(good) as z:  # a row's tokens changed: its key no longer holds
        arrays = dict(z)
    arrays["tokens"] = arrays["tokens"].copy()
    arrays["tokens"][3] += 1
    np.savez(bad / TRAIN_KL, **arrays)
    TrainKL(64).begin(toy.base, context(other, tokenizer=toy.tokenizer), rows)  # another train_kl_rows
    TrainKL(128).begin(toy.base, context(foreign, tokenizer=toy.tokenizer), rows[1:])  # another run's rows

    meta = {"model_key": signal.base.key["model"], "weights_key": signal.base.key["weights"]}
    base = Answers.from_samples("fp", {}, [], meta=meta)  # what the run's base answers say of their model
    said = {
        bad: "its rows are not those its key was made from",
        other: f"{other / TRAIN_KL}: made for other train_kl_rows than this run's",
        foreign: f"{foreign / TRAIN_KL}: made for other training rows (their token ids) than this run's",
    }
    for folder, why in said.items():  # the signal is off, said once, and why
        resumed = TrainKL(128)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="forgetwatch"):
            resumed.begin(toy.tuned, context(folder, tokenizer=toy.tokenizer, step=10, base_answers=base), rows)
        assert not resumed.on and caplog.text.count("is off for this resumed run") == 1 and why in caplog.text
    resumed = TrainKL(128)
    resumed.begin(toy.tuned, context(tmp_path / "run", tokenizer=toy.tokenizer, step=10, base_answers=base), rows)
    assert resumed.on and resumed.tokens == [list(x) for x, _ in rows]
    assert resumed.measure(toy.base, Ranks())["train_kl"] == 0.0


def test_lora_with_adapters_disabled_is_the_plain_base(toy, rows, tmp_path):
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False, task_type="CAUSAL_LM")
    lora = peft.get_peft_model(copy.deepcopy(toy.base), config)  # random adapters: not the base when on
    plain, disabled = TrainKL(128), TrainKL(128)
    plain.begin(toy.base, context(tmp_path / "plain", tokenizer=toy.tokenizer), rows)
    # on a resume too: the base is at hand, so it is measured again rather than read back
    run = context(tmp_path / "lora", tokenizer=toy.tokenizer, base="adapter_disabled", step=10)
    disabled.begin(lora, run, rows)
    for name in ("offsets", "top_ids", "top_logprobs", "tail"):
        np.testing.assert_array_equal(getattr(disabled.base, name), getattr(plain.base, name), err_msg=name)
    assert disabled.measure(toy.base, Ranks())["train_kl"] == 0.0
    assert disabled.measure(lora, Ranks())["train_kl"] > 0  # the adapters are on again


def test_the_callback_says_in_one_line_why_it_cannot_read_the_training_rows(toy, caplog):
    from types import SimpleNamespace

    from forgetwatch.integrations.callback import ForgetWatchCallback

    streamed = SimpleNamespace(dataset=(row for row in [{"input_ids": [1, 2]}]))  # the trainer's data loader
    kept = SimpleNamespace(dataset=[{"input_ids": [1, 2, 3]}])
    off = ForgetWatchCallback(toy.probes, monitor=Monitor(train_kl_rows=0))
    with caplog.at_level(logging.INFO, logger="forgetwatch"):
        assert ForgetWatchCallback(toy.probes)._train_rows(None, streamed, toy.tokenizer) is None
        assert off._train_rows(None, kept, toy.tokenizer) is None
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "forgetwatch: train KL (forgetwatch/drift/train_kl) is off: the training dataset (a generator) cannot be "
        "sampled by index: Watch.start(train_rows=...) takes rows directly"
    ]
