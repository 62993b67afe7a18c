"""What a resumed run reads back for replay is checked before training goes on: the draws (the
watch's state in the checkpoint's trainer_state.json, else rebuilt from the history, exactly) and
the base distribution (``replay_base.npz`` in the run directory); what cannot serve is one clear
error before any step."""

from __future__ import annotations

import copy
import json
import shutil

import numpy as np
import pytest
import torch
from trainers import make_trainer, run_view
from transformers import TrainerCallback

from forgetwatch import Monitor, Output, ReplayPool
from forgetwatch.integrations.callback import ForgetWatchCallback
from forgetwatch.replay import Replay, ReplayFileError
from forgetwatch.scoring.next_tokens import BaseDistribution
from forgetwatch.store.read import read_history

# trains models (or runs several processes, or a browser): pytest -m "not slow" leaves them out
pytestmark = pytest.mark.slow

pytest.importorskip("datasets")


@pytest.fixture(scope="module")
def pool(toy):
    rows = [
        {
            "id": f"f{i}",
            "text": f"Remember: a {c.color} flag flies over {c.name}; rivers counted in {c.name}: {c.rivers}.",
            "category": "colors" if i % 2 else "rivers",
        }
        for i, c in enumerate(toy.world.known)
    ]
    return ReplayPool.from_records(rows)


def settings(pool):
    return dict(
        eval_steps=2,
        output=Output(verbose=False),
        replay=Replay(pool, loss="kl", top_k=8, weight=2.0, batch_size=4),
        monitor=Monitor(eval_on_train_end=False),
    )


@pytest.fixture(scope="module")
def run(toy, train_data, pool, tmp_path_factory):
    """One run replaying with "kl": a checkpoint after each of its 4 steps,
    evaluations at steps 2 and 4."""
    root = tmp_path_factory.mktemp("replayed")
    make_trainer(
        toy,
        train_data,
        root,
        [ForgetWatchCallback(toy.probes, **settings(pool))],
        max_steps=4,
        save_strategy="steps",
        save_steps=1,
    ).train()
    return root


def began(tokenizer):
    """A fresh run in one process, as replay sees it when training begins (it keeps no files)."""
    return run_view(tokenizer)


def kept(run, step, name=None):
    """The replay state the checkpoint at ``step`` keeps (in trainer_state.json), or the run's file ``name``."""
    if name is not None:
        return BaseDistribution.load(run / "forgetwatch" / name)
    return watch_state(run / f"checkpoint-{step}")["plugins"]["replay"]


def watch_state(checkpoint):
    return json.loads((checkpoint / "trainer_state.json").read_text())["stateful_callbacks"]["ForgetWatch"]


class Began(Exception):
    """Raised once training has (re)begun: what was restored is read, and no step is taken."""


class StopWhenBegun(TrainerCallback):
    def on_train_begin(self, args, state, control, **kwargs):
        raise Began


def resume(toy, train_data, pool, run, tmp_path, step, damage=lambda d: None):
    """The run copied, ``damage(copy)`` done to it, then resumed from ``checkpoint-<step>``: the
    callback as it stands once training has begun again, before any step."""
    copied = tmp_path / "run"
    shutil.copytree(run, copied)
    damage(copied)
    callback = ForgetWatchCallback(toy.probes, **settings(pool))
    trainer = make_trainer(toy, train_data, copied, [callback, StopWhenBegun()], max_steps=4)
    with pytest.raises(Began):
        trainer.train(resume_from_checkpoint=str(copied / f"checkpoint-{step}"))
    return callback


def edit_state(d, step, change):
    """``change(replay's state)`` in the watch's state kept in checkpoint-<step>; ``None``: no watch state there."""
    path = d / f"checkpoint-{step}" / "trainer_state.json"
    saved = json.loads(path.read_text())
    if change is None:
        del saved["stateful_callbacks"]["ForgetWatch"]
    else:
        change(saved["stateful_callbacks"]["ForgetWatch"]["plugins"]["replay"])
    path.write_text(json.dumps(saved))


def edit_history_states(d, change):
    path = d / "forgetwatch" / "history.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for r in records:
        change(r)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_a_whole_checkpoint_resumes_with_its_own_state(toy, train_data, pool, run, tmp_path):
    resumed = resume(toy, train_data, pool, run, tmp_path, 3)
    assert resumed.replay.state() == kept(run, 3)
    np.testing.assert_array_equal(resumed.replay.base.top_logprobs, kept(run, 3, "replay_base.npz").top_logprobs)


def test_a_run_resumed_between_evaluations_logs_the_replay_loss_of_every_step_since_the_last(
    toy, train_data, pool, run, tmp_path
):
    assert kept(run, 3)["loss"]["steps"] == 1  # step 3's loss, kept until the evaluation at 4
    copied = tmp_path / "run"
    shutil.copytree(run, copied)
    callback = ForgetWatchCallback(toy.probes, **settings(pool))
    make_trainer(toy, train_data, copied, [callback], max_steps=4).train(
        resume_from_checkpoint=str(copied / "checkpoint-3")
    )
    whole = [json.loads(line) for line in (run / "forgetwatch" / "history.jsonl").read_text().splitlines()]
    resumed = read_history(callback.watch.output_dir / "history.jsonl")[-1]
    assert resumed["step"] == whole[-1]["step"] == 4
    # the mean over steps 3 and 4, as the uninterrupted run logged it (not step 4's alone)
    assert resumed["replay"]["replay/loss"] == pytest.approx(whole[-1]["replay"]["replay/loss"], rel=1e-6)


STATE_DAMAGE = {
    "NaN weight": lambda s: s.update(weight=float("nan")),
    "huge weight": lambda s: s.update(weight=1e30),
    "negative count": lambda s: s["sampler"]["taken"].update(colors=-3),
    "fractional count": lambda s: s["sampler"].update(drawn=s["sampler"]["drawn"] + 0.5),
    "another pool's": lambda s: s["key"].update(pool="0123456789abcdef"),
    "no key": lambda s: s.pop("key"),
}


@pytest.mark.parametrize("step", [1, 2, 3])  # before, at and after an evaluation
def test_a_checkpoint_without_the_watchs_state_rebuilds_replay_from_the_history_exactly(
    toy, train_data, pool, run, tmp_path, caplog, step
):
    with caplog.at_level("WARNING", logger="forgetwatch"):
        resumed = resume(toy, train_data, pool, run, tmp_path, step, lambda d: edit_state(d, step, None))
    # the draws, as the run had them (not the replay loss since the last evaluation)
    assert resumed.replay.state() == {k: v for k, v in kept(run, step).items() if k != "loss"}
    assert f"no replay state for step {step}" in caplog.text and "rebuilt it" in caplog.text


@pytest.mark.parametrize("damage", list(STATE_DAMAGE))
def test_a_damaged_state_is_one_clear_error_before_training(toy, train_data, pool, run, tmp_path, damage):
    with pytest.raises(ValueError, match="replay") as info:
        resume(toy, train_data, pool, run, tmp_path, 3, lambda d: edit_state(d, 3, STATE_DAMAGE[damage]))
    assert not isinstance(info.value, Began)


def test_no_state_and_a_damaged_history_is_one_clear_error_before_training(toy, train_data, pool, run, tmp_path):
    def damage(d):
        edit_state(d, 3, None)
        edit_history_states(d, lambda r: r["replay"]["sampler"]["taken"].update(rivers=-1))

    with pytest.raises(ReplayFileError) as info:
        resume(toy, train_data, pool, run, tmp_path, 3, damage)
    message = str(info.value)
    assert message.startswith("no replay state to resume step 3 with (the watch's state was not given)")
    assert "the history's replay state at step 2 cannot be used either" in message
    assert "count of rows taken from 'rivers' is -1" in message


def test_replay_new_on_resume_starts_afresh(toy, train_data, pool, run, tmp_path, caplog):
    def without_replay(d):  # as if the run had not replayed: no state anywhere
        edit_state(d, 3, None)
        edit_history_states(d, lambda r: r.pop("replay"))

    with caplog.at_level("WARNING", logger="forgetwatch"):
        resumed = resume(toy, train_data, pool, run, tmp_path / "new", 3, without_replay)
    assert resumed.replay.sampler.drawn == 0 and "replay was not on at the last evaluation (step 2)" in caplog.text


def damage_arrays(path, change):
    base = BaseDistribution.load(path)
    change(base)
    np.savez(
        path,
        ids=np.frombuffer(json.dumps(base.ids).encode(), dtype=np.uint8),
        key=np.frombuffer(json.dumps(base.key).encode(), dtype=np.uint8),
        offsets=base.offsets,
        top_ids=base.top_ids,
        top_logprobs=base.top_logprobs,
        tail=base.tail,
    )


BASE_DAMAGE = {
    "NaN": lambda b: b.top_logprobs.__setitem__((0, 0), np.nan),
    "positive log-probabilities": lambda b: b.top_logprobs.__setitem__(slice(None), 0.5),
    "token ids past the vocabulary": lambda b: b.top_ids.__setitem__((3, 1), 10_000),
    "offsets that do not add up": lambda b: b.offsets.__setitem__(1, b.offsets[2] + 1),
    "truncated file": None,
}


@pytest.mark.parametrize("damage", list(BASE_DAMAGE))
def test_a_damaged_base_distribution_is_one_clear_error_before_training(toy, train_data, pool, run, tmp_path, damage):
    def spoil(d):
        path = d / "forgetwatch/replay_base.npz"
        if BASE_DAMAGE[damage] is None:
            path.write_bytes(path.read_bytes()[:500])
        else:
            damage_arrays(path, BASE_DAMAGE[damage])

    with pytest.raises(ReplayFileError, match=r"forgetwatch/replay_base.npz: .*damaged"):
        resume(toy, train_data, pool, run, tmp_path, 3, spoil)


def test_another_models_distribution_for_the_same_rows_is_refused(toy, train_data, pool, run, tmp_path):
    other = Replay(pool, loss="kl", top_k=8, batch_size=4)
    other.begin(toy.tuned, began(toy.tokenizer))
    planted = other.base  # the tuned model's, keyed by its weights

    with pytest.raises(
        ReplayFileError,
        match=r"it cannot serve \(.*forgetwatch/replay_base.npz: made for other weights than this run's base model",
    ):
        resume(toy, train_data, pool, run, tmp_path, 3, lambda d: planted.save(d / "forgetwatch/replay_base.npz"))


def test_state_checks_name_what_is_wrong(toy, pool):
    from forgetwatch.replay.kept import state_problem

    replay = Replay(pool, batch_size=4)
    replay.begin(copy.deepcopy(toy.base), began(toy.tokenizer))
    good = replay.state()
    assert state_problem(replay, good, 0) is None

    def problem(change, step=10):
        state = copy.deepcopy(good)
        change(state)
        return state_problem(replay, state, step)

    assert problem(lambda s: s.update(weight=float("inf"))) == "its weight is inf, not a number from 0 to 100"
    assert problem(lambda s: s.update(weight=-1)).startswith("its weight is -1,")
    assert problem(lambda s: s.update(weight=0)) is None  # replay off at the checkpoint
    assert problem(lambda s: s.update(weight=True)).startswith("its weight is True,")
    assert problem(lambda s: s.update(batch_size=0)) == "its batch size is 0, not a whole number from 1"
    assert problem(lambda s: s["sampler"].update(drawn=11)) == (
        "its count of batches drawn is 11, not a whole number from 0 to 10"
    )
    assert problem(lambda s: s["sampler"]["taken"].update(colors=2.0)).startswith(
        "its count of rows taken from 'colors' is 2.0"
    )
    assert problem(lambda s: s["sampler"].update(seed=1)) == "made with seed=1, not 0"
    assert problem(lambda s: s["sampler"]["taken"].pop("colors")).startswith("made for the categories ['rivers']")
    assert problem(lambda s: s["key"].update(tokens="x")).startswith("made for the rows tokenized otherwise")
    assert problem(lambda s: s.pop("key")).startswith("it has no key saying what it was made from")
    assert problem(lambda s: s.update(loss={"sum": float("nan"), "steps": 1})).startswith(
        "its replay loss since the last evaluation is"
    )
    assert problem(lambda s: s.update(loss={"sum": 1.5, "steps": 11})) == (
        "its replay loss since the last evaluation is over 11 steps, not 0 to 10"
    )
    assert state_problem(replay, [1, 2], 10) == "not a replay state (a JSON list, not an object)"


def test_a_killed_run_with_replay_and_a_merge_resumes_as_the_uninterrupted_one(toy, train_data, pool, tmp_path):
    peft = pytest.importorskip("peft")
    from trainers import KillAt

    from forgetwatch import MergeAtEnd

    texts = toy.world.distraction_texts(n=6, seed=7)

    def lora():  # a LoRA model: the merge has its base (the adapters off) on resume too
        config = peft.LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=0.0)
        torch.manual_seed(0)  # the same adapters at every start
        return peft.get_peft_model(copy.deepcopy(toy.base), config)

    def watched():
        return ForgetWatchCallback(
            toy.probes,
            eval_steps=2,
            max_forgetting=0.0,
            monitor=Monitor(patience=2, eval_on_train_end=False),
            output=Output(verbose=False),
            replay=Replay(pool, weight=0.5, batch_size=4),
            merge_at_end=MergeAtEnd(target=texts, alphas=[0.0, 0.5, 1.0]),
            clock=lambda: 0.0,  # what train KL's time budget reads: the same rows measured in both runs
        )

    common = dict(max_steps=12, learning_rate=2e-2, save_strategy="steps", save_steps=1)
    whole = watched()
    make_trainer(toy, train_data, tmp_path / "whole", [whole], model=lora(), **common).train()
    assert whole.watch.stop_step is not None and whole.ending is not None
    kill_at = whole.watch.stop_step - 1  # killed before its checkpoint: resumed from the evaluation before the stop
    with pytest.raises(RuntimeError, match="killed"):
        make_trainer(toy, train_data, tmp_path / "cut", [watched(), KillAt(kill_at)], model=lora(), **common).train()
    again = watched()
    make_trainer(toy, train_data, tmp_path / "cut", [again], model=lora(), **common).train(
        resume_from_checkpoint=str(tmp_path / "cut" / f"checkpoint-{kill_at - 1}")
    )

    def history(run):  # what was measured, not when
        records = read_history(run / "forgetwatch" / "history.jsonl")
        for r in records:
            r.pop("time")
        return records

    cut, full = history(tmp_path / "cut"), history(tmp_path / "whole")
    for a, b in zip(cut, full):
        for key in set(a) | set(b):
            assert a.get(key) == b.get(key), (a["step"], key)
    assert len(cut) == len(full)
    assert again.watch.stop_step == whole.watch.stop_step
    assert (
        again.ending.metrics == whole.ending.metrics
        and again.merge_at_end.sweep.best() == whole.merge_at_end.sweep.best()
    )
