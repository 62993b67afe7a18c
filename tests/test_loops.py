"""The examples' own training loops, driven by ``Watch`` alone: a plain PyTorch loop in this
process and an ``accelerate launch`` loop on two CPU processes. At every evaluation the counts
in the history equal a recount from the checkpoint's weights; both processes stop at the same
step; a loop resumed from a checkpoint writes the same history as the loop that ran through."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from test_examples import EXAMPLES, example
from transformers import AutoModelForCausalLM

from forgetwatch import compare, evaluate

pytestmark = pytest.mark.slow

COUNTS = ("forgotten", "gained", "kept", "never")


@pytest.fixture(scope="module")
def files(toy, tmp_path_factory):
    folder = tmp_path_factory.mktemp("loop-files")
    toy.probes.to_jsonl(folder / "probes.jsonl")
    (folder / "train.txt").write_text("\n".join(toy.world.distraction_texts()) + "\n")
    return folder


def options(toy, files, out, *more):
    return [
        "--model",
        toy.base_dir,
        "--probes",
        str(files / "probes.jsonl"),
        "--text",
        str(files / "train.txt"),
        "--output-dir",
        str(out),
        "--max-steps",
        "8",
        "--eval-steps",
        "2",
        "--save-steps",
        "2",
        "--max-forgetting",
        "0.03",
        *more,
    ]


def history(out):
    return [json.loads(line) for line in (out / "forgetwatch" / "history.jsonl").read_text().splitlines()]


def check_against_recount(toy, out, records):
    base = evaluate(toy.base, toy.tokenizer, toy.probes)
    for record in records:
        model = AutoModelForCausalLM.from_pretrained(out / f"checkpoint-{record['step']}")
        recount = compare(base, evaluate(model, toy.tokenizer, toy.probes))
        assert {k: record["report"][k] for k in COUNTS} == {k: getattr(recount, k) for k in COUNTS}, record["step"]


def without_timing(records):
    return [{k: v for k, v in r.items() if k not in ("time", "seconds")} for r in records]


def test_a_plain_pytorch_loop_counts_stops_and_resumes_exactly(toy, files, tmp_path):
    loop = example("custom_loop")
    out = tmp_path / "run"
    loop.main(options(toy, files, out))
    records = history(out)
    assert [r["step"] for r in records] == [2, 4, 6] and "stop" in records[-1]  # 5.6 % forgotten > 3 %
    assert not (out / "checkpoint-8").exists()
    check_against_recount(toy, out, records)

    again = tmp_path / "again"
    shutil.copytree(out, again)
    loop.main(options(toy, files, again, "--resume-from", str(again / "checkpoint-4")))
    assert without_timing(history(again)) == without_timing(records)


def accelerate_launch(*args: str) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(free_port()),
        str(EXAMPLES / "accelerate_loop.py"),
        "--cpu",
        *args,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def free_port() -> int:
    from test_distributed import free_port as port

    return port()


def test_an_accelerate_loop_on_two_processes_counts_stops_together_and_resumes_exactly(toy, files, tmp_path):
    out = tmp_path / "run"
    done = accelerate_launch(*options(toy, files, out))
    assert "[rank 0] forgetwatch stopped training at step 6" in done.stdout
    assert "[rank 1] forgetwatch stopped training at step 6" in done.stdout
    records = history(out)
    assert [r["step"] for r in records] == [2, 4, 6]
    check_against_recount(toy, out, records)

    again = tmp_path / "again"
    shutil.copytree(out, again)
    accelerate_launch(*options(toy, files, again, "--resume-from", str(again / "checkpoint-4")))
    assert without_timing(history(again)) == without_timing(records)
