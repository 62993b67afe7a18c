"""Two real processes (torchrun, gloo on CPU): ranks evaluate and stop in lockstep."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ranks_agree_on_when_to_evaluate_and_when_to_stop(tmp_path):
    script = Path(__file__).with_name("distributed_run.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    launch = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
         "--master_port", str(free_port()), str(script), str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        _, stderr = launch.communicate(timeout=300)
    except subprocess.TimeoutExpired:  # ranks out of step hang in a collective: fail, leave nothing behind
        os.killpg(launch.pid, signal.SIGKILL)
        launch.communicate()
        pytest.fail("the ranks hung: they disagreed on when to evaluate or to stop")
    assert launch.returncode == 0, stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["world_size"] == 2
    assert ranks[0]["steps"] == ranks[1]["steps"] and len(ranks[0]["steps"]) >= 2
    assert ranks[0]["global_step"] == ranks[1]["global_step"]
    assert ranks[0]["stopped"] == ranks[1]["stopped"]
    assert ranks[0]["forgotten"] == ranks[1]["forgotten"]  # same weights, same answers
