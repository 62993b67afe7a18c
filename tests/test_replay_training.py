"""Replay while training: one step's arithmetic by hand, nothing when its weight is 0, probes
never replayed, an exact resume, and every trainer."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from trainers import killed_and_resumed, make_trainer, run_view
from transformers import DataCollatorForLanguageModeling

from forgetwatch import Monitor, Output, Replay, ReplayPool
from forgetwatch.integrations.callback import ForgetWatchCallback
from forgetwatch.replay.penalty import encode_rows
from forgetwatch.replay.sampler import ReplaySampler
from forgetwatch.replay.synthetic import answer_prompts
from forgetwatch.store.read import read_history

# trains models (or runs several processes, or a browser): pytest -m "not slow" leaves them out
pytestmark = pytest.mark.slow

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")


@pytest.fixture(scope="module")
def pool(toy):
    """Text the probes do not hold: the facts in other words, and unrelated sentences."""
    rows = [
        {
            "id": f"f{i}",
            "text": f"Remember: a {c.color} flag flies over {c.name}; rivers counted in {c.name}: {c.rivers}.",
            "category": "colors" if i % 2 else "rivers",
        }
        for i, c in enumerate(toy.world.known)
    ]
    return ReplayPool.from_records(rows)


@pytest.fixture(scope="module")
def mixed_pool(pool, toy):
    """The pool's text rows and prompts the base answers when training begins (synthetic replay)."""
    prompts = [
        {"id": f"p{i}", "prompt": f"Remember: a {c.color} flag flies over", "category": "colors"}
        for i, c in enumerate(toy.world.known[:8])
    ]
    rows = [{"id": r.id, "text": r.text, "category": r.category} for r in pool]
    return ReplayPool.from_records(rows + prompts, max_new_tokens=6)


@pytest.mark.parametrize(
    "setup",
    [{}, {"gradient_accumulation_steps": 2, "per_device_train_batch_size": 16}, {"activation_checkpointing": True}],
    ids=["plain", "accumulation", "checkpointing"],
)
def test_one_step_equals_the_combined_loss_by_hand(toy, pool, tmp_path, setup):
    texts = toy.world.distraction_texts(n=32)
    data = datasets.Dataset.from_dict({"text": texts}).map(
        lambda b: toy.tokenizer(b["text"]), batched=True, remove_columns=["text"]
    )
    weight, lr = 0.5, 0.05
    cb = ForgetWatchCallback(
        toy.probes,
        eval_steps=100,
        replay=Replay(pool, weight=weight, batch_size=5),
        output=Output(verbose=False),
        monitor=Monitor(eval_on_train_end=False),
    )
    settings = {"per_device_train_batch_size": 32, **setup}
    trainer = make_trainer(
        toy,
        data,
        tmp_path,
        [cb],
        max_steps=1,
        optim="sgd",
        learning_rate=lr,
        max_grad_norm=0.0,
        lr_scheduler_type="constant",
        **settings,
    )
    trainer.train()

    # by hand: the same batch (all 32 rows; the mean loss does not depend on their order) plus
    # the rows the sampler draws first, every replay token alike
    model = copy.deepcopy(toy.base).train()
    batch = DataCollatorForLanguageModeling(toy.tokenizer, mlm=False)([data[i] for i in range(32)])
    rows = ReplaySampler(pool, seed=0).next_batch(5, {c: 1 / len(pool.categories) for c in pool.categories})
    tokens = []
    for row in encode_rows(toy.tokenizer, rows, 512):
        x = torch.tensor([row])
        lp = torch.log_softmax(model(input_ids=x).logits[0, :-1].float(), -1)
        tokens.append(-lp[torch.arange(len(row) - 1), x[0, 1:]])
    (model(**batch).loss + weight * torch.cat(tokens).mean()).backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad
    for (name, a), b in zip(trainer.model.named_parameters(), model.parameters()):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-4, msg=name)


def test_weight_zero_is_a_run_without_replay(toy, train_data, tmp_path, pool, mixed_pool):
    runs = []
    zero = {"replay": Replay(pool, weight=0.0)}
    synthetic = {"replay": Replay(mixed_pool, weight=0.0, select="uniform")}  # the base answers its prompts
    for name, extra in (("plain", {}), ("zero", zero), ("zero-synthetic", synthetic)):
        cb = ForgetWatchCallback(toy.probes, eval_steps=10, **extra, output=Output(verbose=False))
        trainer = make_trainer(toy, train_data, tmp_path / name, [cb], max_steps=20)
        trainer.train()
        runs.append(([e["loss"] for e in trainer.state.log_history if "loss" in e], trainer.model.state_dict()))
    for other in runs[1:]:  # the base's answers borrow the model and change nothing
        assert runs[0][0] == other[0]
        assert all(torch.equal(runs[0][1][k], other[1][k]) for k in runs[0][1])


def test_a_pool_holding_a_probe_question_is_refused_naming_both(toy):
    probe = toy.probes[0]
    leaky = ReplayPool.from_records([{"id": "leak", "text": f"Notes. {probe.question.upper()} ..."}])
    with pytest.raises(ValueError, match=rf"row 'leak' contains the question of probe '{probe.id}'"):
        ForgetWatchCallback(toy.probes, replay=leaky)


RESUMED = dict(max_steps=30, save_strategy="steps", save_steps=10, learning_rate=5e-3)


@pytest.fixture(scope="module")
def plain(toy, train_data, tmp_path_factory):
    """The run without replay that replay runs are measured against (run once); without the
    train-KL signal too (``train_kl_rows=0``), which changes nothing the runs compare."""
    cb = ForgetWatchCallback(toy.probes, eval_steps=5, output=Output(verbose=False), monitor=Monitor(train_kl_rows=0))
    make_trainer(toy, train_data, tmp_path_factory.mktemp("plain"), [cb], **RESUMED).train()
    return cb


def train_kl_of(callback):
    """The train-KL signal of each evaluation in the run's history, by step."""
    return {
        r["step"]: r["drift"]["train_kl"]
        for r in read_history(callback.watch.output_dir / "history.jsonl")
        if "drift" in r
    }


@pytest.mark.parametrize("select", ["categories", "uniform"])
def test_replay_is_logged_repairs_and_resumes_exactly(
    toy, train_data, tmp_path, pool, mixed_pool, select, monkeypatch, plain
):
    import forgetwatch.replay.replay as module
    from forgetwatch.run import train_kl

    answered = []  # the base answers the prompts once per run begun, never on resume
    monkeypatch.setattr(module, "answer_prompts", lambda *a, **k: answered.append(1) or answer_prompts(*a, **k))
    common = RESUMED
    rows = pool if select == "categories" else mixed_pool  # "uniform": with prompts the base answers
    settings = dict(
        eval_steps=5, output=Output(verbose=False), replay=Replay(rows, weight=1.0, batch_size=8, select=select)
    )
    whole = ForgetWatchCallback(toy.probes, **copy.deepcopy(settings))
    trainer = make_trainer(toy, train_data, tmp_path / "whole", [whole], **common)
    trainer.train()
    logged = [e for e in trainer.state.log_history if "forgetwatch/replay/loss" in e]
    assert [e["step"] for e in logged] == [5, 10, 15, 20, 25, 30] and all(
        e["forgetwatch/replay/weight"] == 1.0 for e in logged
    )
    # replaying the facts in other words keeps more of them than training without it
    assert whole.history[-1][1].forgotten < plain.history[-1][1].forgotten
    # the train-KL signal (on by default: the Trainer's rows are token ids) at each evaluation, growing;
    # with train_kl_rows=0 neither measured nor kept
    drift = [e["forgetwatch/drift/train_kl"] for e in trainer.state.log_history if "forgetwatch/drift/train_kl" in e]
    assert drift == list(train_kl_of(whole).values()) and len(drift) == 6 and 0 < drift[0] < drift[-1]
    assert (tmp_path / "whole" / "forgetwatch" / "train_kl.npz").is_file()
    assert not train_kl_of(plain) and not list(plain.watch.output_dir.parent.rglob("train_kl.npz"))

    def refuse(*args, **kwargs):
        raise AssertionError("the train-KL base was measured again on resume")

    resumed, again = killed_and_resumed(
        toy,
        train_data,
        tmp_path / "killed",
        settings,
        kill_at=13,
        resume_from=10,
        # the kept train_kl.npz serves the resumed run: the base is never measured from moved weights
        before_resume=lambda: monkeypatch.setattr(train_kl, "base_distribution", refuse),
        **common,
    )
    assert [(s, r.forgotten_ids) for s, r in resumed.history] == [(s, r.forgotten_ids) for s, r in whole.history]
    for k, v in trainer.model.state_dict().items():
        torch.testing.assert_close(again.model.state_dict()[k], v, msg=k)
    assert train_kl_of(resumed) == train_kl_of(whole)  # exactly, at 15 to 30 (and 5, 10 kept in the history)

    # the state after each evaluation (draws, replayed tokens) is the whole run's
    def kept(callback):
        return [r["replay"] for r in read_history(callback.watch.output_dir / "history.jsonl") if r["step"] > 10]

    assert kept(resumed) == kept(whole)
    assert kept(whole)[-1]["tokens"] > 0
    assert len(answered) == (2 if select == "uniform" else 0)  # the whole run and the killed one; the resume read them


def scaled_run(toy, train_data, path, scaler, autocast, **settings):
    """A run under fp16's gradient scaler as on a GPU (CPU autocast in fp16 when ``autocast``:
    then accelerate unscales the gradients to clip them; otherwise they reach replay still
    scaled, so nothing may clip them before)."""
    cb = ForgetWatchCallback(toy.probes, eval_steps=2, **settings, output=Output(verbose=False))
    trainer = make_trainer(
        toy,
        train_data,
        path,
        [cb],
        max_steps=4,
        fp16=True,
        optim="sgd",
        learning_rate=0.05,
        max_grad_norm=1.0 if autocast else 0.0,
    )
    trainer.accelerator.scaler, trainer.accelerator.native_amp = scaler, autocast
    trainer.train()
    return trainer


@pytest.mark.parametrize("autocast", [False, True], ids=["scaled", "autocast-unscaled"])
def test_under_fp16s_gradient_scaler_replay_adds_the_unscaled_gradient(toy, train_data, tmp_path, pool, autocast):
    def run(name, scaler, **settings):
        trainer = scaled_run(toy, train_data, tmp_path / name, scaler, autocast, **settings)
        return trainer.model.state_dict()

    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    scaled = run("scaled", scaler, replay=pool)
    unscaled = run("plain", torch.amp.GradScaler("cpu", enabled=False), replay=pool)
    without = run("without", torch.amp.GradScaler("cpu", init_scale=2.0**12))
    assert scaler.get_scale() == 2.0**12  # no step was skipped
    for k, v in unscaled.items():
        torch.testing.assert_close(scaled[k], v, atol=2e-5, rtol=1e-3, msg=k)  # fp16 autocast: near, not equal
    assert max((scaled[k] - without[k]).abs().max() for k in without) > 1e-3  # replay did move them


def test_a_replay_gradient_that_overflows_is_left_out_of_the_step(toy, train_data, tmp_path, pool, caplog, monkeypatch):
    from forgetwatch.replay import replay as driver

    real = driver.replay_backward

    def overflowing(model, *args, **kwargs):  # as a half-precision backward at a large scale overflows
        loss = real(model, *args, **kwargs)
        next(p for p in model.parameters() if p.grad is not None).grad.view(-1)[0] = float("inf")
        return loss

    monkeypatch.setattr(driver, "replay_backward", overflowing)
    runs = {}
    for name, extra in (("without", {}), ("overflowing", {"replay": pool})):
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
        with caplog.at_level("WARNING", logger="forgetwatch"):
            runs[name] = scaled_run(toy, train_data, tmp_path / name, scaler, False, **extra).model.state_dict()
        assert scaler.get_scale() == 2.0**12  # the trainer's own steps all went through
    for k, v in runs["without"].items():
        torch.testing.assert_close(runs["overflowing"][k], v, msg=k)
    assert "replay gradient overflowed" in caplog.text and "(1 step(s) so far)" in caplog.text


def test_mixed_precision_without_a_scaler_replays(toy, train_data, tmp_path, pool):
    # fp16 on a CPU: autocast, and no gradient scaler, so nothing stands in replay's way
    cb = ForgetWatchCallback(toy.probes, eval_steps=2, replay=pool, output=Output(verbose=False))
    trainer = make_trainer(toy, train_data, tmp_path, [cb], max_steps=4, fp16=True)
    trainer.train()
    losses = [e["forgetwatch/replay/loss"] for e in trainer.state.log_history if "forgetwatch/replay/loss" in e]
    assert len(losses) == 2 and all(0 < x < 20 for x in losses)


COMMON = dict(
    use_cpu=True,
    bf16=False,
    activation_checkpointing=False,
    logging_steps=1,
    save_strategy="no",
    report_to=[],
    dataloader_num_workers=0,
    seed=0,
    disable_tqdm=True,
)


def trl_trainer(kind, toy, path, callbacks):
    if kind == "sft":
        args = trl.SFTConfig(
            str(path),
            **COMMON,
            max_steps=4,
            per_device_train_batch_size=8,
            max_length=64,
            packing=False,
            learning_rate=2e-3,
        )
        return trl.SFTTrainer(
            model=copy.deepcopy(toy.base),
            args=args,
            processing_class=toy.tokenizer,
            train_dataset=datasets.Dataset.from_dict({"text": toy.world.distraction_texts(n=32)}),
            callbacks=callbacks,
        )
    if kind == "dpo":
        rows = [
            {"prompt": f"{a} plus", "chosen": " one.", "rejected": " two."} for a in ("One", "Two", "Three", "Four") * 4
        ]
        args = trl.DPOConfig(
            str(path), **COMMON, max_steps=4, per_device_train_batch_size=4, max_length=32, learning_rate=1e-3
        )
        return trl.DPOTrainer(
            model=toy.base_dir,
            args=args,
            processing_class=toy.tokenizer,
            train_dataset=datasets.Dataset.from_list(rows),
            callbacks=callbacks,
        )
    prompts = [t.split(" plus")[0] + " plus" for t in toy.world.distraction_texts(n=16)]
    args = trl.GRPOConfig(
        str(path),
        **COMMON,
        max_steps=4,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=6,
        learning_rate=1e-3,
    )
    return trl.GRPOTrainer(
        model=copy.deepcopy(toy.base),
        reward_funcs=lambda completions, **kw: [1.0] * len(completions),
        args=args,
        processing_class=toy.tokenizer,
        callbacks=callbacks,
        train_dataset=datasets.Dataset.from_dict({"prompt": prompts}),
    )


@pytest.mark.parametrize("kind, select", [("sft", "categories"), ("dpo", "categories"), ("grpo", "uniform")])
def test_replay_runs_in_trl_trainers(toy, tmp_path, mixed_pool, kind, select):
    steps = []

    class Count(ForgetWatchCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            super().on_pre_optimizer_step(args, state, control, **kwargs)
            steps.append(self.replay.sampler.drawn)

    replay = Replay(mixed_pool, batch_size=4, select=select)
    cb = Count(toy.probes, eval_steps=2, output=Output(verbose=False), replay=replay)
    trainer = trl_trainer(kind, toy, tmp_path, [cb])
    trainer.train()
    assert steps == [1, 2, 3, 4]  # one replay batch before each optimizer step
    losses = [e["forgetwatch/replay/loss"] for e in trainer.state.log_history if "forgetwatch/replay/loss" in e]
    assert len(losses) == 2 and all(0 < x < 20 for x in losses)


def test_kl_replay_keeps_the_base_distribution_once_and_resumes_with_it(toy, train_data, tmp_path, pool):
    from forgetwatch.scoring.next_tokens import BaseDistribution

    common = dict(max_steps=20, save_strategy="steps", save_steps=10, learning_rate=5e-3)
    settings = dict(eval_steps=5, output=Output(verbose=False), replay=Replay(pool, loss="kl", top_k=8))
    whole = ForgetWatchCallback(toy.probes, **copy.deepcopy(settings))
    trainer = make_trainer(toy, train_data, tmp_path / "whole", [whole], **common)
    trainer.train()
    kept = BaseDistribution.load(tmp_path / "whole" / "forgetwatch" / "replay_base.npz")
    assert kept.k == 8 and kept.ids == [r.id for r in pool]
    losses = [e["forgetwatch/replay/loss"] for e in trainer.state.log_history if "forgetwatch/replay/loss" in e]
    assert len(losses) == 4 and all(x >= 0 for x in losses) and losses[-1] > 0  # KL: the model moved away

    # resumed from checkpoint-10 (whose weights are not the base): the kept distribution, not a new one
    resumed, again = killed_and_resumed(
        toy, train_data, tmp_path / "killed", settings, kill_at=13, resume_from=10, **common
    )
    np.testing.assert_array_equal(resumed.replay.base.top_logprobs, kept.top_logprobs)
    assert [(s, r.forgotten_ids) for s, r in resumed.history] == [(s, r.forgotten_ids) for s, r in whole.history]
    for k, v in trainer.model.state_dict().items():
        torch.testing.assert_close(again.model.state_dict()[k], v, msg=k)


def test_sharded_training_is_refused_before_it_starts(toy, pool):
    from types import SimpleNamespace

    from forgetwatch.integrations.trainer_link import sharded_run

    for args in (SimpleNamespace(deepspeed={"zero_optimization": {"stage": 3}}), SimpleNamespace(fsdp="full_shard")):
        with pytest.raises(ValueError, match="sharded models"):
            run = run_view(toy.tokenizer, sharded=sharded_run(args))
            Replay(pool).begin(toy.base, run)
    assert not sharded_run(SimpleNamespace(deepspeed=None, fsdp=""))


def test_a_fresh_kl_run_never_reuses_an_earlier_runs_base_distribution(toy, train_data, tmp_path, pool):
    from forgetwatch.scoring.next_tokens import BaseDistribution

    settings = dict(eval_steps=5, output=Output(verbose=False), replay=Replay(pool, loss="kl", top_k=8))
    first = ForgetWatchCallback(toy.probes, **copy.deepcopy(settings))
    make_trainer(toy, train_data, tmp_path, [first], max_steps=5).train()
    planted = first.replay.base
    planted.top_logprobs[:] = -1.0  # as if another base model had written it
    planted.save(tmp_path / "forgetwatch" / "replay_base.npz")
    again = ForgetWatchCallback(toy.probes, **copy.deepcopy(settings))
    make_trainer(toy, train_data, tmp_path, [again], max_steps=5).train()
    kept = BaseDistribution.load(tmp_path / "forgetwatch" / "replay_base.npz")
    assert not (again.replay.base.top_logprobs == -1.0).all()
    np.testing.assert_array_equal(kept.top_logprobs, again.replay.base.top_logprobs)
