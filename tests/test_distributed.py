"""Two real processes (torchrun, gloo on CPU): sharded evaluation in lockstep, under DDP
(TRL's SFTTrainer) and under FSDP1 / FSDP2, checked against single-process scoring."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from forgetwatch import ProbeSet, Scorer, Scoring, compare, merge_sweep
from forgetwatch.toy import ToyWorld

# trains models (or runs several processes, or a browser): pytest -m "not slow" leaves them out
pytestmark = pytest.mark.slow

pytest.importorskip("trl")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_ranks(mode: str, out: Path, timeout: int = 300) -> list[dict]:
    script = Path(__file__).with_name("distributed_run.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    launch = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(free_port()),
            str(script),
            mode,
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        _, stderr = launch.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:  # ranks out of step hang in a collective: fail, leave nothing behind
        os.killpg(launch.pid, signal.SIGKILL)
        launch.communicate()
        pytest.fail(f"{mode}: the ranks hung (out of step in a collective)")
    assert launch.returncode == 0, stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def about_half(share: int, total: int) -> bool:
    return 0.3 * total <= share <= 0.7 * total


@pytest.mark.parametrize("mode", ["sft", "zero3"])
def test_sft_on_two_ranks_matches_single_process_scoring(tmp_path, mode):
    if mode == "zero3":
        pytest.importorskip("deepspeed")
    r0, r1 = run_two_ranks(mode, tmp_path)
    assert r0["world_size"] == 2
    assert r0["sharded"] is (mode == "zero3")
    # lockstep: same evaluations, same stop, identical results on both ranks
    for key in ("steps", "global_step", "stopped", "forgotten_ids", "gained_ids", "correct_base"):
        assert r0[key] == r1[key], key
    assert len(r0["steps"]) >= 2
    # each rank scored its own share of the probes, at the snapshot and every evaluation
    assert len(r0["shares"]) == len(r0["steps"])
    for a, b in zip(r0["shares"], r1["shares"]):
        assert a + b == r0["n_probes"] and about_half(a, r0["n_probes"])

    # independently: one process scores the saved weights of each evaluation
    probes = ProbeSet.from_records(ToyWorld(seed=0).probe_records(generative=True))
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / f"step-{r0['steps'][0]}")  # saved by the trainer
    scorer = Scorer(tokenizer, probes, scoring=Scoring(max_new_tokens=6))
    base = scorer(AutoModelForCausalLM.from_pretrained(tmp_path / "step-0"), batch_size=8, show_progress=False)
    assert base.correct.tolist() == r0["correct_base"]
    for i, step in enumerate(r0["steps"]):
        model = AutoModelForCausalLM.from_pretrained(tmp_path / f"step-{step}")
        expected = compare(base, scorer(model, batch_size=8, show_progress=False))
        assert expected.forgotten_ids == r0["forgotten_ids"][i], step
        assert expected.gained_ids == r0["gained_ids"][i], step
    if mode == "sft":  # the merge at the end: the same on both ranks, as one process sweeps the final weights
        assert r0["merge"] == r1["merge"] and r0["sweep_written"]
        final = AutoModelForCausalLM.from_pretrained(tmp_path / f"step-{r0['steps'][-1]}")
        texts = ToyWorld(seed=0).distraction_texts(n=6, seed=7)
        alone = merge_sweep(
            AutoModelForCausalLM.from_pretrained(tmp_path / "step-0"),
            final,
            tokenizer,
            probes,
            target=texts,
            alphas=[0.5],
            scoring=Scoring(max_new_tokens=6),
        )
        best = alone.best(0.9)
        assert r0["merge"]["forgetwatch/merge/alpha"] == best
        assert r0["merge"]["forgetwatch/merge/forgetting"] == pytest.approx(alone.forgetting(alone.alphas.index(best)))


SHARDED = ["fsdp1", "fsdp2", "oom", "prefixes", "prefixes-fsdp2", "sampled"]


@pytest.fixture(scope="module")
def sharded_runs(tmp_path_factory) -> Path:
    """Every sharded mode, and the ZeRO-3 weights key where DeepSpeed is installed, one after another in one 2-rank
    launch (a launch costs seconds)."""
    out = tmp_path_factory.mktemp("sharded")
    run_two_ranks(",".join(SHARDED + (["zero3key"] if importlib.util.find_spec("deepspeed") else [])), out)
    return out


@pytest.mark.parametrize("mode", SHARDED)
def test_sharded_models_score_like_one_process(sharded_runs, mode):
    ranks = [json.loads((sharded_runs / f"rank{r}-{mode}.json").read_text()) for r in (0, 1)]
    if mode.startswith("prefixes"):  # a shared block is read from the cache unless forwards must line up
        assert all(rank["read_prefixes"] is (mode == "prefixes") for rank in ranks)
    if mode == "oom":  # only rank 1 ran out of memory, yet both shrank their batches alike
        assert ranks[0]["row_cap"] == ranks[1]["row_cap"] == 2
        assert len(ranks[0]["rows"]) == len(ranks[1]["rows"])
    if mode == "sampled":  # each answer drawn with its own seed: the same on two ranks as on one
        assert ranks[0]["alone_samples"] is not None and len(ranks[0]["alone_samples"][0]) == 3
    for rank in ranks:
        assert rank["together_correct"] == rank["alone_correct"]
        assert rank["together_outputs"] == rank["alone_outputs"]  # generation in lockstep, ranks
        assert rank["together_samples"] == rank["alone_samples"]
        assert rank["max_logprob_diff"] < 1e-5  # finishing at different times
        assert about_half(rank["scored_here"], rank["work"])


def test_weights_key_under_zero3_reads_the_partitions_not_the_placeholders(sharded_runs):
    pytest.importorskip("deepspeed")
    r0, r1 = [json.loads((sharded_runs / f"rank{r}-zero3key.json").read_text()) for r in (0, 1)]
    assert r0["held"] == [0, 0, 0]  # every parameter is an empty placeholder on each rank
    assert r0["keys"] == r1["keys"]
    same_a, same_b, other = r0["keys"]
    assert same_a == same_b and other != same_a


def test_a_failure_on_one_rank_switches_replay_off_on_every_rank_in_step(replay_runs):
    r0, r1 = replay_runs("replay-fails")  # would hang in the all-reduce if only rank 1 went on
    assert r0["off"] == "RuntimeError: replay failed (injected)" and r1["off"].endswith("replay failed on another rank")
    assert r0["checksum"] == r1["checksum"] and r0["first"] == r1["first"]  # the ranks' parameters stay identical
    assert r0["drawn"] == r1["drawn"] == 10
    assert r0["replay_losses"] == r1["replay_losses"] and len(r0["replay_losses"]) == 1  # steps 1-2, then nothing


def test_replay_keeps_the_ranks_parameters_identical(replay_runs):
    r0, r1 = replay_runs("replay")
    assert r0["world_size"] == 2 and r0["drawn"] == r1["drawn"] == 10  # one replay batch per optimizer step
    assert r0["checksum"] == r1["checksum"] and r0["first"] == r1["first"]  # bit for bit
    assert r0["replay_losses"] == r1["replay_losses"] and len(r0["replay_losses"]) == 2
    # drawn alike on every rank: the same state everywhere
    assert r0["state"] == r1["state"] and r0["state"]["select"] == "uniform" and r0["state"]["tokens"] > 0
    assert r0["encoded"] == r1["encoded"] and len(r0["answered"]) == 9  # every prompt answered, shared
    # the train-KL signal: each rank measures its share of rank 0's rows, and both get the same sum
    assert r0["train_kl"] == r1["train_kl"] == r0["train_kl_kept"] and len(r0["train_kl"]) == 2
    assert r0["train_kl_rows"] == r1["train_kl_rows"] == 128 and 0 < r0["train_kl"][0] < r0["train_kl"][1]
