"""The replay benchmark runs end to end on a tiny budget and writes every arm, and the
void check, to its JSON (its figures are the benchmark's business, not a test's)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.slow
def test_a_quick_run_writes_every_arm_and_the_void_check(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_replay as bench
    import transformers

    threads, verbosity = torch.get_num_threads(), transformers.logging.get_verbosity()
    out = tmp_path / "replay.json"
    argv = ["--quick", "--seeds", "1", "--steps", "4", "--eval-steps", "2", "--pretrain-steps", "30", "--hidden", "32"]
    argv += ["--no-train-kl", "--jobs", "1", "--out", str(tmp_path / "work"), "--json", str(out)]
    try:
        status = bench.main(argv)
    finally:  # one process, one thread: the benchmark's setting, not the rest of the session's
        torch.set_num_threads(threads)
        transformers.logging.set_verbosity(verbosity)
    data = json.loads(out.read_text())
    assert status == (2 if data["void"] else 0)
    assert isinstance(data["void"], bool) and set(data["void_check"]) == {"sft"}
    assert {r["arm"] for r in data["runs"]} == set(bench.ARMS)
    assert {r["rows"] for r in data["runs"] if r["arm"] in ("uniform", "category")} == {2, 8}
    assert all(r["tokens"] > 0 for r in data["runs"] if r["arm"] != "none")
    assert all(r["target_loss"] > 0 and r["base_target_loss"] > 0 for r in data["runs"])
    assert all(len(r["curve"]) == 2 for r in data["runs"])  # evaluations at steps 2 and 4
    assert len(list((tmp_path / "work" / "bases").iterdir())) == 1  # one base, kept for the next run
    # the plot draws from what the JSON keeps (a void run draws nothing itself)
    args = bench.parse_args(argv)
    goals = {"sft": bench.goal(data["runs"], "sft", args.rows)}
    bench.draw(data["runs"], args, goals, str(tmp_path / "pareto.png"))
    assert (tmp_path / "pareto.png").stat().st_size > 0
    assert "bench_replay" in sys.modules
