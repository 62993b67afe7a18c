"""Per-probe trajectories: events, persistence, survival, at-risk probes, checked against plain
loops over per-evaluation correctness, in a TRL SFT run and after a resume."""

from __future__ import annotations

import copy
import json
import random

import numpy as np
import pytest
from trainers import KillAt, make_trainer
from transformers import TrainerCallback

from forgetwatch import Output, Trajectory, evaluate, load_trajectory
from forgetwatch.integrations.callback import ForgetWatchCallback
from forgetwatch.sinks.logged import metric_values
from forgetwatch.store.read import read_history

# trains models (or runs several processes, or a browser): pytest -m "not slow" leaves them out
pytestmark = pytest.mark.slow

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")


# -- plain loops over lists: the independent recomputation ----------------------------------------


def plain_events(row):
    return sum(1 for a, b in zip(row, row[1:]) if a and not b)


def plain_first_forgotten(row, steps):
    for t in range(1, len(row)):
        if row[t - 1] and not row[t]:
            return steps[t]
    return -1


def plain_regained(row):
    lost = False
    for t in range(1, len(row)):
        if lost and row[t]:
            return True
        lost = lost or (row[t - 1] and not row[t])
    return False


def plain_persistent(row):
    return len(row) >= 3 and row[0] and not row[-1] and not row[-2]


def plain_survival(rows):
    right = [r for r in rows if r[0]]
    return [
        sum(1 for r in right if not any(r[s - 1] and not r[s] for s in range(1, t + 1))) / len(right)
        for t in range(len(rows[0]))
    ]


def assert_matches_plain_loops(trajectory, rows, steps, categories):
    assert trajectory.steps.tolist() == steps
    assert trajectory.correct.tolist() == rows
    assert trajectory.forgetting_events().tolist() == [plain_events(r) for r in rows]
    assert trajectory.first_forgotten().tolist() == [plain_first_forgotten(r, steps) for r in rows]
    assert trajectory.regained().tolist() == [plain_regained(r) for r in rows]
    assert trajectory.persistent().tolist() == [plain_persistent(r) for r in rows]
    assert trajectory.survival().tolist() == pytest.approx(plain_survival(rows))
    for cat in set(categories):
        mine = [r for r, c in zip(rows, categories) if c == cat]
        figures = trajectory.metrics([i for i, c in enumerate(categories) if c == cat])
        assert figures["forgetting_events"] == sum(plain_events(r) for r in mine)
        if len(steps) >= 3:
            assert figures["forgetting_persistent"] == pytest.approx(sum(map(plain_persistent, mine)) / len(mine))
        else:
            assert "forgetting_persistent" not in figures  # does not apply yet: left out, never NaN


@pytest.mark.parametrize("n_steps", [1, 2, 3, 7])
def test_figures_equal_plain_loops_on_random_trajectories(n_steps):
    rng = random.Random(n_steps)
    rows = [[rng.random() < 0.6 for _ in range(n_steps)] for _ in range(300)]
    categories = [rng.choice("abc") for _ in rows]
    steps = [0] + [5 * (t + 1) for t in range(n_steps - 1)]
    trajectory = Trajectory([f"q{i}" for i in range(len(rows))], categories, steps, rows)
    assert_matches_plain_loops(trajectory, rows, steps, categories)


# -- inside a real TRL SFT run, and after a resume ------------------------------------------------


class Recorder(TrainerCallback):
    """Scores the live weights independently at every step forgetwatch evaluates."""

    def __init__(self, toy, every):
        self.toy, self.every, self.columns = toy, every, {}

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.every == 0:
            self.columns[state.global_step] = evaluate(
                model, self.toy.tokenizer, self.toy.probes, show_progress=False
            ).correct.tolist()


def sft(toy, path, callbacks):
    args = trl.SFTConfig(
        str(path),
        use_cpu=True,
        bf16=False,
        activation_checkpointing=False,
        logging_steps=1,
        save_strategy="steps",
        save_steps=10,
        report_to=[],
        dataloader_num_workers=0,
        seed=0,
        disable_tqdm=True,
        max_steps=20,
        per_device_train_batch_size=8,
        learning_rate=3e-3,
        max_length=64,
        packing=False,
    )
    texts = toy.world.distraction_texts(n=64)
    return trl.SFTTrainer(
        model=copy.deepcopy(toy.base),
        args=args,
        processing_class=toy.tokenizer,
        train_dataset=datasets.Dataset.from_dict({"text": texts}),
        callbacks=callbacks,
    )


def test_sft_trajectory_equals_plain_loops_and_survives_a_resume(toy, tmp_path):
    base = evaluate(toy.base, toy.tokenizer, toy.probes, show_progress=False).correct.tolist()
    recorder = Recorder(toy, every=4)
    whole = ForgetWatchCallback(toy.probes, eval_steps=4)
    trainer = sft(toy, tmp_path / "whole", [whole, recorder])
    trainer.train()

    steps = [0, 4, 8, 12, 16, 20]
    rows = [[base[i]] + [recorder.columns[s][i] for s in steps[1:]] for i in range(len(base))]
    assert_matches_plain_loops(whole.trajectory, rows, steps, list(whole.trajectory.categories))
    assert sum(map(plain_events, rows)) > 0  # the run forgot something worth counting

    # each evaluation's logged figures: events so far and persistent share, at that step
    logged = {e["step"]: e for e in trainer.state.log_history if "forgetwatch/forgetting_events" in e}
    assert sorted(logged) == steps[1:]
    for t, step in enumerate(steps[1:], start=1):
        so_far = [r[: t + 1] for r in rows]
        assert logged[step]["forgetwatch/forgetting_events"] == sum(map(plain_events, so_far))
        if t >= 2:
            assert logged[step]["forgetwatch/forgetting_persistent"] == pytest.approx(
                sum(map(plain_persistent, so_far)) / len(rows)
            )
        else:
            assert "forgetwatch/forgetting_persistent" not in logged[step]
        for cat in whole.trajectory.categories:
            mine = [r for r, c in zip(so_far, whole.trajectory.categories) if c == cat]
            assert logged[step][f"forgetwatch/{cat}/forgetting_events"] == sum(map(plain_events, mine))

    # the run directory holds it: read back whole
    assert load_trajectory(tmp_path / "whole" / "forgetwatch").correct.tolist() == rows

    # killed at step 15, resumed from checkpoint-10: the same trajectory as the whole run
    run = tmp_path / "killed"
    with pytest.raises(RuntimeError, match="killed"):
        sft(toy, run, [ForgetWatchCallback(toy.probes, eval_steps=4), KillAt(15)]).train()
    resumed = ForgetWatchCallback(toy.probes, eval_steps=4)
    sft(toy, run, [resumed]).train(resume_from_checkpoint=str(run / "checkpoint-10"))
    assert_matches_plain_loops(resumed.trajectory, rows, steps, list(whole.trajectory.categories))
    assert load_trajectory(run / "forgetwatch").correct.tolist() == rows
    np.testing.assert_array_equal(resumed.trajectory.signal, whole.trajectory.signal)  # as stored, to the bit
    assert [r["step"] for r in read_history(run / "forgetwatch" / "history.jsonl")] == steps[1:]
    for (_, a), (_, b) in zip(whole.history, resumed.history):
        assert metric_values(a) == metric_values(b)


def test_a_history_without_columns_gives_correctness_from_its_ids(toy, train_data, tmp_path):
    cb = ForgetWatchCallback(toy.probes, eval_steps=10, output=Output(verbose=False))
    make_trainer(toy, train_data, tmp_path, [cb], max_steps=20).train()
    path = tmp_path / "forgetwatch" / "history.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for r in records:
        del r["columns"]  # as an older version wrote them
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    old = load_trajectory(tmp_path / "forgetwatch")
    assert old.correct.tolist() == cb.trajectory.correct.tolist()
    assert np.isnan(old.signal[:, 1:]).all() and not np.isnan(cb.trajectory.signal[:, 1:]).all()


def at_risk_outcomes(callback):
    """Pooled over evaluations t: of the base-correct probes still right at t, how many of the
    at-risk ones and of the others are wrong at some later evaluation."""
    t = callback.trajectory
    index = {pid: i for i, pid in enumerate(t.ids)}
    counts = {"at_risk": [0, 0], "other": [0, 0]}  # [forgotten later, total]
    for col, (_, report) in enumerate(callback.history[:-1], start=1):
        risky = {index[pid] for pid in report.at_risk_ids}
        later_wrong = ~t.correct[:, col + 1 :].all(axis=1)
        for i in np.flatnonzero(t.correct[:, 0] & t.correct[:, col]):
            group = counts["at_risk" if i in risky else "other"]
            group[0] += int(later_wrong[i])
            group[1] += 1
    return {k: (forgotten / total, total) for k, (forgotten, total) in counts.items()}


def test_at_risk_probes_are_forgotten_later_more_often_than_the_others(toy, tmp_path):
    cb = ForgetWatchCallback(toy.probes, eval_steps=2, output=Output(verbose=False))
    sft(toy, tmp_path, [cb]).train()
    outcomes = at_risk_outcomes(cb)
    (risky_rate, n_risky), (other_rate, n_other) = outcomes["at_risk"], outcomes["other"]
    print(f"forgotten later: at risk {risky_rate:.1%} of {n_risky}, others {other_rate:.1%} of {n_other}")
    assert n_risky >= 20 and n_other >= 20
    assert risky_rate > 1.5 * other_rate


def test_a_history_of_another_probe_set_is_refused(toy, train_data, tmp_path):
    cb = ForgetWatchCallback(toy.probes, eval_steps=10, output=Output(verbose=False))
    make_trainer(toy, train_data, tmp_path, [cb], max_steps=10).train()
    other = cb.base_answers
    other.probe_fingerprint = "0" * 16  # the same size, another probe set
    with pytest.raises(ValueError, match="another probe set"):
        Trajectory.from_history(other, read_history(tmp_path / "forgetwatch" / "history.jsonl"))
