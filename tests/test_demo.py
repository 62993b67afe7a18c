"""``forgetwatch demo``: runs offline on a CPU and leaves a curve, a PNG and the history."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from forgetwatch.cli import main
from forgetwatch.cli.demo import DEFAULT_OUT, TAKES

# trains models (or runs several processes, or a browser): pytest -m "not slow" leaves them out
pytestmark = pytest.mark.slow

pytest.importorskip("trl")


def test_demo_command_writes_its_report_and_history(tmp_path):
    pytest.importorskip("plotly")
    # a process of its own: deepspeed (where installed) says its line once per process, on import
    done = subprocess.run(
        [sys.executable, "-m", "forgetwatch", "demo", "--out", str(tmp_path), "--steps", "10", "--eval-steps", "5"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout + done.stderr
    assert "step 10" in out and "overall" in out  # the text curve and the final table
    # neither deepspeed's notice nor a progress bar per pass of TRL over the demo's data
    assert "Setting accelerator to CPU" not in out
    assert "examples/s" not in out and "train dataset" not in out
    history = [json.loads(x) for x in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert [r["step"] for r in history] == [5, 10]
    assert "<html" in (tmp_path / "report.html").read_text()
    assert (tmp_path / "base_answers.npz").is_file() and (tmp_path / "probes.jsonl").is_file()


def test_demo_rejects_bad_arguments(capsys):
    with pytest.raises(SystemExit) as exc:  # argparse's usage error: one line, exit code 2
        main(["demo", "--steps", "0"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "argument --steps:" in err and "given 0 (int)" in err and len(err.splitlines()) == 1


def test_the_demo_takes_what_readme_and_help_say(capsys):
    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    assert f"it takes {TAKES}" in readme
    with pytest.raises(SystemExit):
        main(["--help"])
    assert TAKES in " ".join(capsys.readouterr().out.split())


def test_the_demo_output_folder_is_git_ignored():
    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists() or not shutil.which("git"):
        pytest.skip("not a git checkout")
    done = subprocess.run(["git", "-C", str(root), "check-ignore", "-q", f"{DEFAULT_OUT}/history.jsonl"])
    assert done.returncode == 0, f"{DEFAULT_OUT}/ is not in .gitignore"


def test_demo_replay_shows_both_runs_side_by_side(tmp_path, capsys):
    pytest.importorskip("plotly")
    assert main(["demo", "--out", str(tmp_path), "--steps", "10", "--eval-steps", "5", "--replay"]) == 0
    out = capsys.readouterr().out
    assert "without replay" in out and "with replay" in out
    plain, repaired = (
        [json.loads(x) for x in (tmp_path / run / "history.jsonl").read_text().splitlines()]
        for run in ("without-replay", "with-replay")
    )
    assert [r["step"] for r in plain] == [r["step"] for r in repaired] == [5, 10]
    assert "replay" in repaired[-1] and "replay" not in plain[-1]  # the draws, the weight, the loss
    for line in out.splitlines():  # the table's rows are those two histories' forgetting
        if line.strip().startswith("10 "):
            assert line.split()[1:] == [
                f"{100 * plain[-1]['report']['forgetting']:.1f}%",
                f"{100 * repaired[-1]['report']['forgetting']:.1f}%",
            ]
    assert (tmp_path / "report.html").is_file()
