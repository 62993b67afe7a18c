"""The attribution benchmark runs end to end on a tiny budget and writes every figure (its figures are the
benchmark's business, not a test's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.slow
def test_a_quick_run_writes_each_ranking_the_counterfactual_and_the_cost(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_attribution as bench

    threads, out = torch.get_num_threads(), tmp_path / "attribution.json"
    try:
        assert bench.main(["--quick", "--json", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    data = json.loads(out.read_text())
    (run,) = data["runs"]
    assert run["rows"] == 44 and run["planted"] <= 4
    assert len(run["head_ranks"]) == len(run["tracin_ranks"]) == run["planted_forgotten"]
    assert all(1 <= r <= run["rows"] for r in run["head_ranks"] + run["tracin_ranks"])
    assert run["train_seconds_captured"] > 0 and run["train_seconds_plain"] > 0
    assert set(run["head_ranks_to_planted_answer"]) <= set(run["head_ranks"])
    assert set(data["summary"]) == {
        "head_to_planted_answer",
        "head",
        "tracin",
        "random",
        "prevented_by_top_k",
        "prevented_by_random_k",
        "capture_overhead",
    }
