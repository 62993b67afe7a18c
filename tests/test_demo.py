"""``forgetwatch demo``: runs offline on a CPU and leaves a curve, a PNG and the history."""

from __future__ import annotations

import json

import pytest

from forgetwatch.cli import main

pytest.importorskip("trl")


def test_demo_command_writes_curve_png_and_history(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    assert main(["demo", "--out", str(tmp_path), "--steps", "10", "--eval-steps", "5"]) == 0
    out = capsys.readouterr().out
    assert "step 10" in out and "overall" in out  # the text curve and the final table
    history = [json.loads(x) for x in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert [r["step"] for r in history] == [5, 10]
    assert (tmp_path / "forgetting.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "base_answers.npz").is_file() and (tmp_path / "probes.jsonl").is_file()


def test_demo_rejects_bad_arguments(capsys):
    assert main(["demo", "--steps", "0"]) == 2
    assert "at least 1" in capsys.readouterr().err
