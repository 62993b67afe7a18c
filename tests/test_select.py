"""forgetwatch select: a watched run's checkpoints with the forgetting at their step and the loss logged by then,
the front of the two, and the checkpoint to take."""

from __future__ import annotations

import json
import random

import pytest

from forgetwatch.cli import main
from forgetwatch.merge.checkpoints import SavedCheckpoint, choose, pareto_front


def brute_front(points):
    whole = [(i, p) for i, p in enumerate(points) if None not in p]
    return {i for i, p in whole if all(not (q[0] <= p[0] and q[1] <= p[1] and q != p) for _, q in whole)}


def test_the_front_is_what_no_other_point_beats_on_both():
    rng = random.Random(0)
    for _ in range(200):
        points = [(rng.choice([None, *range(4)]), rng.choice([None, *range(4)])) for _ in range(rng.randint(0, 7))]
        assert pareto_front(points) == brute_front(points)


def test_choose_keeps_the_loss_fall_it_is_asked_for_with_the_least_forgetting(tmp_path):
    # loss falls 2.0 -> 1.0 (binary fractions: no rounding at the threshold); keep 0.9 needs loss <= 1.1
    data = [(5, 0.00, 2.0), (10, 0.05, 1.5), (15, 0.10, 1.0625), (20, 0.30, 1.0), (25, 0.20, 1.03125)]
    rows = [SavedCheckpoint(s, tmp_path / f"checkpoint-{s}", f, 1, loss) for s, f, loss in data]
    front = pareto_front([(r.forgetting, r.target) for r in rows])
    rows = [SavedCheckpoint(**{**vars(r), "on_front": i in front}) for i, r in enumerate(rows)]
    assert choose(rows, 0.9).step == 15
    assert choose(rows, 1.0).step == 20
    assert choose(rows, 0.0).step == 5
    for keep in (0.5, 0.9, 0.95):  # what it picks is on the front and keeps the fall
        picked = choose(rows, keep)
        assert picked.on_front and (2.0 - picked.target) / 1.0 >= keep


@pytest.fixture(scope="module")
def run(toy, train_data, tmp_path_factory):
    """A watched run saving a checkpoint at each evaluation (steps 10, 20, 30)."""
    from trainers import make_trainer

    from forgetwatch.integrations.callback import ForgetWatchCallback

    folder = tmp_path_factory.mktemp("select-run")
    callback = ForgetWatchCallback(toy.probes, eval_steps=10)
    make_trainer(toy, train_data, folder, [callback], save_strategy="steps", save_steps=10, logging_steps=5).train()
    return folder


def printed_rows(printed):
    return {
        int(line.split()[0].split("-")[1]): line.split() for line in printed.splitlines() if "checkpoint-" in line[:17]
    }


@pytest.mark.slow
def test_select_reads_a_watched_runs_checkpoints(run, capsys):
    assert main(["select", str(run)]) == 0
    printed = capsys.readouterr().out
    history = {r["step"]: r["report"] for r in map(json.loads, (run / "forgetwatch" / "history.jsonl").open())}
    state = json.loads((run / "checkpoint-30" / "trainer_state.json").read_text())
    losses = {e["step"]: e["loss"] for e in state["log_history"] if "loss" in e}
    rows = printed_rows(printed)
    for step in (10, 20, 30):
        report = history[step]
        assert rows[step][1:4] == [
            str(report["forgotten"]),
            f"{report['forgetting_adjusted']:.1%}",
            f"{losses[step]:.4f}",
        ]
    assert printed.splitlines()[-1].startswith(f"take {run}/checkpoint-")


@pytest.mark.slow
def test_select_measures_a_target_on_each_checkpoint_from_the_base(toy, run, tmp_path, capsys):
    from test_merge import loss_per_token
    from transformers import AutoModelForCausalLM

    texts = toy.world.distraction_texts(n=6, seed=7)
    (tmp_path / "held_out.txt").write_text("\n".join(texts) + "\n")
    argv = ["select", str(run), "--target-texts", str(tmp_path / "held_out.txt"), "--base", toy.base_dir]
    assert main([*argv, "--keep", "0.5"]) == 0
    printed = capsys.readouterr().out
    rows = printed_rows(printed)
    start = loss_per_token(toy.base, toy.tokenizer, texts)
    loss = {
        step: loss_per_token(AutoModelForCausalLM.from_pretrained(run / f"checkpoint-{step}"), toy.tokenizer, texts)
        for step in (10, 20, 30)
    }
    for step in (10, 20, 30):
        assert float(rows[step][3]) == pytest.approx(loss[step], abs=1e-4)
    # the rule, recounted: least forgetting on the front among those keeping half the fall from the base
    best = min(loss.values())
    forgetting = {s: float(rows[s][2].rstrip("%")) for s in loss}
    kept = [s for s in loss if (start - loss[s]) / (start - best) >= 0.5 and rows[s][-1] == "*"]
    chosen = min(kept, key=lambda s: (forgetting[s], -s))
    assert printed.splitlines()[-1].startswith(f"take {run}/checkpoint-{chosen}:")
    assert f"(the base: {start:.4f})" in printed.splitlines()[-1]
    assert main(["select", str(run), "--base", toy.base_dir]) == 2  # a base without a target


def test_select_without_checkpoints_is_one_line(tmp_path, capsys):
    (tmp_path / "forgetwatch").mkdir()
    (tmp_path / "forgetwatch" / "history.jsonl").write_text("")
    assert main(["select", str(tmp_path)]) == 2
    assert "no checkpoint-<step> folders" in capsys.readouterr().err
    assert main(["select", str(tmp_path / "nowhere")]) == 2


def test_a_logged_loss_that_is_not_a_number_is_one_line_naming_the_file_and_field(tmp_path, capsys):
    (tmp_path / "forgetwatch").mkdir()
    (tmp_path / "forgetwatch" / "history.jsonl").write_text("")
    state = tmp_path / "checkpoint-10" / "trainer_state.json"
    state.parent.mkdir()
    state.write_text(json.dumps({"log_history": [{"step": 5, "loss": 1.5}, {"step": 10, "loss": "abc"}]}))
    assert main(["select", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"forgetwatch: error: {state}: key 'log_history[1].loss': expected a number, got 'abc'")
    assert len(err.strip().splitlines()) == 1
