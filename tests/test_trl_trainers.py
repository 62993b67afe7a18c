"""ForgetWatchCallback in TRL's SFT, DPO and GRPO trainers, and in W&B / TensorBoard."""

from __future__ import annotations

import copy
import json
import re
import warnings

import numpy as np
import pytest
import torch
from trainers import CPU_QUIET
from transformers import TrainerCallback

from forgetwatch import Output, Scoring, compare, evaluate
from forgetwatch.integrations.callback import ForgetWatchCallback
from forgetwatch.probes.extract import extract_number
from forgetwatch.store.read import read_history

# trains models (or runs several processes, or a browser): pytest -m "not slow" leaves them out
pytestmark = pytest.mark.slow

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")

# CPU, no bf16 autocast, no activation checkpointing (TRL's defaults), quiet
COMMON = dict(
    **CPU_QUIET,
    activation_checkpointing=False,
    logging_steps=1,
    dataloader_num_workers=0,
    dataloader_pin_memory=False,
    seed=0,
)


def assert_final_counts_match(toy, callback, model):
    """The last evaluation equals an independent scoring of the final weights."""
    expected = compare(
        evaluate(toy.base, toy.tokenizer, toy.probes, show_progress=False),
        evaluate(model, toy.tokenizer, toy.probes, show_progress=False),
    )
    final = callback.history[-1][1]
    for name in ("forgotten", "gained", "kept", "never", "forgotten_ids", "gained_ids"):
        assert getattr(final, name) == getattr(expected, name), name


def assert_train_kl_at_each_evaluation(trainer, callback, source):
    """The train-KL signal (on by default) was measured on the trainer's own rows at each
    evaluation, logged with the trainer's log and kept in the history."""
    logged = {
        e["step"]: e["forgetwatch/drift/train_kl"]
        for e in trainer.state.log_history
        if "forgetwatch/drift/train_kl" in e
    }
    kept = {r["step"]: r["drift"]["train_kl"] for r in read_history(callback.watch.output_dir / "history.jsonl")}
    assert list(logged) == [step for step, _ in callback.history] and logged == kept
    assert all(x >= 0 for x in logged.values()) and max(logged.values()) > 0
    signal = callback.watch._train_kl
    assert signal.source == source and 0 < len(signal.tokens) <= 128
    assert all(1 <= start < len(ids) for ids, start in zip(signal.tokens, signal.starts))
    return signal


def sft(toy, tmp_path, callbacks, model=None, **overrides):
    args = trl.SFTConfig(
        str(tmp_path),
        **{
            **COMMON,
            "max_steps": 12,
            "per_device_train_batch_size": 8,
            "learning_rate": 2e-3,
            "max_length": 64,
            "packing": False,
            **overrides,
        },
    )
    texts = toy.world.distraction_texts(n=64)
    return trl.SFTTrainer(
        model=model or copy.deepcopy(toy.base),
        args=args,
        processing_class=toy.tokenizer,
        train_dataset=datasets.Dataset.from_dict({"text": texts}),
        callbacks=callbacks,
    )


class Kept:
    """A sink keeping each evaluation's answers with a copy of the weights they were scored on."""

    def __init__(self, model):
        self.model, self.base, self.seen = model, None, {}

    def on_base(self, snapshot):
        self.base = snapshot.answers

    def on_evaluation(self, evaluation):
        weights = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        self.seen[evaluation.step] = (evaluation.answers, evaluation.report, weights)


def plain_loop(model, tokenizer, probes, new_tokens):
    """Every probe on its own, unpadded, in float32, in eval mode: per probe its choices' summed log-probabilities
    or its greedy text (cut at the first newline), and its verdict."""
    model.eval()
    out = []
    with torch.no_grad():
        for p in probes:
            context = tokenizer(p.question)["input_ids"]
            if p.choices:
                lps = []
                for choice in p.choices:
                    ids = tokenizer(f"{p.question} {choice}")["input_ids"]
                    logits = model(torch.tensor([ids[:-1]]), use_cache=False).logits[0].float()
                    logp = torch.log_softmax(logits, -1)
                    lps.append(sum(float(logp[k - 1, ids[k]]) for k in range(len(context), len(ids))))
                out.append((lps, int(np.argmax(lps)) == p.answer))
                continue
            ids = list(context)
            for _ in range(new_tokens):
                token = int(model(torch.tensor([ids]), use_cache=False).logits[0, -1].argmax())
                if token == tokenizer.eos_token_id:
                    break
                ids.append(token)
            text = tokenizer.decode(ids[len(context) :], skip_special_tokens=True).split("\n")[0]
            out.append((text, extract_number(text) == p.answer))
    return out


def test_sft_in_bf16_autocast_counts_what_a_float32_plain_loop_counts_at_every_evaluation(toy, tmp_path):
    """TRL's SFTConfig turns bf16 on by default (also on a CPU): accelerate runs the trainer's model under bf16
    autocast, 0.05 to 0.18 nats from float32, so a loop over the live model flips verdicts whose margin is that
    small. Each probe's answer at every evaluation equals a plain float32 loop over a copy of those weights."""
    model = copy.deepcopy(toy.base)
    kept, new_tokens = Kept(model), 4
    cb = ForgetWatchCallback(
        toy.probes,
        eval_steps=10,
        scoring=Scoring(max_new_tokens=new_tokens),
        output=Output(verbose=False),
        sinks=[kept],
    )
    trainer = sft(toy, tmp_path, [cb], model=model, bf16=True, activation_checkpointing=True, max_steps=30)
    trainer.train()
    assert "_original_forward" in vars(trainer.model)  # the trainer computed in bf16 autocast
    assert sorted(kept.seen) == [10, 20, 30]

    def verdicts(answers, model):
        """The plain loop's verdicts on ``model``, each probe's answer checked against the loop's."""
        found = plain_loop(model, toy.tokenizer, toy.probes, new_tokens)
        for i, (p, (got, right)) in enumerate(zip(toy.probes, found)):
            if p.choices:  # float32 batching and packing move a sum by about 1e-5 nats; bf16 by 0.05
                np.testing.assert_allclose(answers.choice_logprobs[i], got, rtol=0, atol=1e-4, err_msg=p.id)
            else:
                assert answers.outputs[i] == got, p.id
            assert bool(answers.correct[i]) == right, p.id
        return [right for _, right in found]

    ids = [p.id for p in toy.probes]
    before = verdicts(kept.base, toy.base)
    for step, (answers, report, weights) in kept.seen.items():
        copied = copy.deepcopy(toy.base)  # a model accelerate never wrapped: float32
        copied.load_state_dict(weights)
        now = verdicts(answers, copied)
        assert report.forgotten_ids == [i for i, b, n in zip(ids, before, now) if b and not n], step
        assert report.gained_ids == [i for i, b, n in zip(ids, before, now) if n and not b], step
    assert any(r.forgotten for _, r, _ in kept.seen.values())


class Listener(TrainerCallback):
    """Stands in for any reporting integration: records what on_log receives."""

    def __init__(self):
        self.logs = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append((state.global_step, dict(logs)))


def test_sft_history_and_final_counts(toy, tmp_path):
    cb = ForgetWatchCallback(toy.probes, eval_steps=4)
    trainer = sft(toy, tmp_path, [cb])
    trainer.train()
    assert [step for step, _ in cb.history] == [4, 8, 12]
    assert_final_counts_match(toy, cb, trainer.model)
    assert_train_kl_at_each_evaluation(trainer, cb, "sft")


def test_sft_losses_and_metrics_are_untouched_by_the_callback(toy, tmp_path):
    """Same seed, with and without forgetwatch: identical trainer logs; SFT's own keys
    (averaged and cleared inside TRL's log()) on every logging line; our keys reach
    every on_log listener at the step they were measured."""

    def run(path, callbacks, watch=None):
        model = copy.deepcopy(toy.base)
        for module in model.modules():  # training draws random numbers: the RNG must be restored
            if hasattr(module, "attention_dropout"):
                module.attention_dropout = 0.2
        trainer = sft(toy, path, callbacks, model=model, logging_steps=3, max_steps=15)  # 8 steps/epoch
        if watch is not None:  # given the trainer, forgetwatch reaches every callback's on_log
            watch.append(
                ForgetWatchCallback(toy.probes, eval_steps=2, output=Output(log_categories=False), trainer=trainer)
            )
            trainer.add_callback(watch[0])
        trainer.train()
        return [e for e in trainer.state.log_history if "loss" in e]

    plain = run(tmp_path / "plain", [])
    listener, watch = Listener(), []
    watched = run(tmp_path / "watched", [listener], watch)
    cb = watch[0]
    assert [e["step"] for e in watched] == [e["step"] for e in plain] == [3, 6, 9, 12, 15]
    for a, b in zip(plain, watched):
        for key in ("loss", "grad_norm", "entropy", "mean_token_accuracy", "num_tokens"):
            assert key in b, (b["step"], key)
            assert a[key] == b[key], (b["step"], key)
    ours = [(step, logs) for step, logs in listener.logs if "forgetwatch/forgetting" in logs]
    assert [step for step, _ in ours] == [2, 4, 6, 8, 10, 12, 14, 15]
    assert all(logs["forgetwatch/forgotten"] == report.forgotten for (_, logs), (_, report) in zip(ours, cb.history))


def train_with_offline_wandb(trainer, tmp_path, monkeypatch):
    """Train with W&B offline under ``tmp_path``; the run file is flushed when this returns."""
    import wandb

    for name, value in (
        ("WANDB_MODE", "offline"),
        ("WANDB_DIR", str(tmp_path)),
        ("WANDB_PROJECT", "forgetwatch-tests"),
        ("WANDB_SILENT", "true"),
    ):
        monkeypatch.setenv(name, value)
    try:
        trainer.train()
    finally:
        wandb.finish()
        wandb.teardown()  # flushes the run file
    return trainer


class Metrics:
    """A sink keeping each evaluation's metrics dict, as every logger was handed it."""

    def __init__(self):
        self.logged = []

    def on_evaluation(self, evaluation):
        self.logged.append((evaluation.step, dict(evaluation.metrics)))


@pytest.mark.parametrize("given", [False, True], ids=["callbacks", "trainer"])
def test_wandb_and_tensorboard_get_every_scalar_once_per_evaluation_at_its_step(toy, tmp_path, monkeypatch, given):
    pytest.importorskip("wandb")
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from wandb_log import history_rows

    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    sink = Metrics()
    cb = ForgetWatchCallback(toy.probes, eval_steps=4, sinks=[sink])
    report_to = ["wandb", "tensorboard"]
    if given:  # the trainer's own integrations
        trainer = sft(toy, tmp_path / "out", [], max_steps=8, logging_steps=2, report_to=report_to)
        cb = ForgetWatchCallback(toy.probes, eval_steps=4, sinks=[sink], trainer=trainer)
        trainer.add_callback(cb)
    else:  # the contract's one line: W&B's run and a TensorBoard writer of forgetwatch's own
        trainer = sft(toy, tmp_path / "out", [cb], max_steps=8, logging_steps=2, report_to=report_to)
    train_with_offline_wandb(trainer, tmp_path, monkeypatch)
    assert [step for step, _ in sink.logged] == [step for step, _ in cb.history] == [4, 8]
    expected = {}  # every scalar: the steps it was measured at, and its values
    for step, metrics in sink.logged:
        for key, value in metrics.items():
            expected.setdefault(key, []).append((step, value))
    assert "forgetwatch/capitals/forgetting" in expected and "forgetwatch/behaviour/length_ratio_words" in expected

    # W&B: a section of its own, not under train/, plotted at the trainer's global step, each once
    rows = history_rows(tmp_path)
    assert not any(k.startswith("train/forgetwatch") for r in rows for k in r)
    seen = {key: [(r["train/global_step"], r[key]) for r in rows if key in r] for key in expected}
    assert seen == expected
    tables = ("forgetwatch/flips/", "forgetwatch/probes/")
    assert {k for r in rows for k in r if k.startswith("forgetwatch/") and not k.startswith(tables)} == set(expected)
    own = [r for r in rows if "train/loss" in r]
    assert [r["train/global_step"] for r in own] == [2, 4, 6, 8] and all("train/entropy" in r for r in own)

    # TensorBoard: the trainer's names (train/...), each once at its step
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    ours = {t for t in events.Tags()["scalars"] if t.startswith("train/forgetwatch/")}
    assert ours == {f"train/{key}" for key in expected}
    for key, measured in expected.items():
        scalars = events.Scalars(f"train/{key}")
        assert [s.step for s in scalars] == [step for step, _ in measured]
        assert [s.value for s in scalars] == pytest.approx([v for _, v in measured], rel=1e-6)
    # the trainer's file, and forgetwatch's own without trainer= (neither reopened after the end)
    assert len(list((tmp_path / "tb").glob("events.out.tfevents.*"))) == 1 + (not given)
    if given:
        return

    # the tables: W&B's flips grow at each evaluation; the last holds one row per flip of every evaluation
    flips = [r for r in rows if r.get("forgetwatch/flips/log_mode") == "INCREMENTAL"]
    assert [r["train/global_step"] for r in flips] == [4, 8]
    (run_dir,) = tmp_path.glob("wandb/offline-run-*")
    tables = sorted(run_dir.glob("files/media/table/forgetwatch/flips*.table.json"), key=lambda p: p.stat().st_mtime)
    logged = [row for t in tables for row in json.loads(t.read_text())["data"]]
    flipped = [(step, pid, "1→0") for step, r in cb.history for pid in r.forgotten_ids] + [
        (step, pid, "0→1") for step, r in cb.history for pid in r.gained_ids
    ]
    assert sorted((row[0], row[1], row[7]) for row in logged) == sorted(flipped) and flipped
    # at the end, one row per probe with its trajectory
    (final,) = run_dir.glob("files/media/table/forgetwatch/probes*.table.json")
    probes = json.loads(final.read_text())["data"]
    events_of = dict(zip(cb.trajectory.ids, cb.trajectory.forgetting_events().tolist()))
    assert len(probes) == len(toy.probes) and all(row[4] == events_of[row[0]] for row in probes)
    # TensorBoard's: the flips of each evaluation and the final table of probes, as text
    texts = {tag: events.Tensors(tag) for tag in events.Tags()["tensors"]}
    text_flips = texts["forgetwatch/flips/text_summary"]
    assert [t.step for t in text_flips] == [4, 8]
    last = text_flips[-1].tensor_proto.string_val[0].decode()
    assert all(f"| {pid} |" in last for pid in cb.history[-1][1].forgotten_ids)
    assert texts["forgetwatch/probes/text_summary"][0].step == 8


def test_dpo_history_and_final_counts(toy, tmp_path):
    # from a saved directory, so DPO can build its reference model
    rows = [
        {
            "prompt": f"The capital of {c.name} is",
            "chosen": f" {c.capital}.",
            "rejected": f" {toy.world.countries[(i + 1) % len(toy.world.countries)].capital}.",
        }
        for i, c in enumerate(toy.world.known)
    ]
    args = trl.DPOConfig(
        str(tmp_path),
        **{
            **COMMON,
            "max_steps": 10,
            "per_device_train_batch_size": 4,
            "learning_rate": 1e-3,
            "beta": 0.1,
            "max_length": 64,
        },
    )
    cb = ForgetWatchCallback(toy.probes, eval_steps=5)
    trainer = trl.DPOTrainer(
        model=toy.base_dir,
        args=args,
        processing_class=toy.tokenizer,
        train_dataset=datasets.Dataset.from_list(rows),
        callbacks=[cb],
    )
    trainer.train()
    assert [step for step, _ in cb.history] == [5, 10]
    assert (
        cb.base_answers.correct.tolist()
        == evaluate(toy.base, toy.tokenizer, toy.probes, show_progress=False).correct.tolist()
    )
    assert_final_counts_match(toy, cb, trainer.model)
    signal = assert_train_kl_at_each_evaluation(trainer, cb, "dpo")
    chosen = {toy.tokenizer(row["chosen"], add_special_tokens=False)["input_ids"][0] for row in rows}
    assert all(ids[start] in chosen for ids, start in zip(signal.tokens, signal.starts))  # measured on the chosen


def test_grpo_history_and_final_counts(toy, tmp_path):
    prompts = [t.split(" plus")[0] + " plus" for t in toy.world.distraction_texts(n=32)]

    def has_digit(completions, **kwargs):
        return [1.0 if re.search(r"\d", c) else 0.0 for c in completions]

    args = trl.GRPOConfig(
        str(tmp_path),
        **{
            **COMMON,
            "max_steps": 6,
            "per_device_train_batch_size": 4,
            "num_generations": 2,
            "max_completion_length": 8,
            "learning_rate": 1e-3,
        },
    )
    cb = ForgetWatchCallback(toy.probes, eval_steps=3)
    trainer = trl.GRPOTrainer(
        model=copy.deepcopy(toy.base),
        reward_funcs=has_digit,
        args=args,
        processing_class=toy.tokenizer,
        callbacks=[cb],
        train_dataset=datasets.Dataset.from_dict({"prompt": prompts}),
    )
    trainer.train()
    assert [step for step, _ in cb.history] == [3, 6]
    assert_final_counts_match(toy, cb, trainer.model)
    # measured on each prompt followed by the base's own greedy completion (at most max_completion_length)
    signal = assert_train_kl_at_each_evaluation(trainer, cb, "grpo")
    assert all(len(ids) - start <= 8 + 1 for ids, start in zip(signal.tokens, signal.starts))
    rewards = [e for e in trainer.state.log_history if "reward" in e and "step" in e and "train_runtime" not in e]
    assert [e["step"] for e in rewards] == [1, 2, 3, 4, 5, 6]  # GRPO's own metrics, every step


def test_a_failing_wandb_table_leaves_the_curves_in_their_section(toy, tmp_path, monkeypatch, caplog):
    wandb = pytest.importorskip("wandb")
    from wandb_log import history_rows

    def refuse(self, *args, **kwargs):
        raise RuntimeError("table refused (injected)")

    monkeypatch.setattr(wandb.Table, "add_data", refuse)  # every table write fails; scalars do not
    cb = ForgetWatchCallback(toy.probes, eval_steps=4)
    train_with_offline_wandb(
        sft(toy, tmp_path / "out", [cb], max_steps=8, logging_steps=2, report_to=["wandb"]), tmp_path, monkeypatch
    )
    assert caplog.text.count("writing wandb tables failed") == 1  # warned once, training went on
    rows = history_rows(tmp_path)
    assert [r["train/global_step"] for r in rows if "forgetwatch/forgetting" in r] == [4, 8]
    assert not any(k.startswith("train/forgetwatch") for r in rows for k in r)  # never split under train/
