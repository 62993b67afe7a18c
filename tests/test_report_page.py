"""`forgetwatch report`: one self-contained page, rendered in a real headless Chromium with the
network cut off, for one run and for three; its tables checked against plain loops."""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess

import pytest

from forgetwatch.cli import main
from forgetwatch.demo import run_demo
from forgetwatch.history import read_history
from forgetwatch.report_page import load_run, write_report

pytest.importorskip("plotly")
pytest.importorskip("trl")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# CI installs Chromium (.ci/run): there a missing browser is a failure, not a skip
needs_browser = pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"),
                                   reason="no Chromium here (apt-get install chromium)")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    for name, steps in (("lr-a", 20), ("lr-b", 30), ("lr-c", 10)):
        run_demo(root / name, steps=steps, eval_steps=5, quiet=True)
    return [root / "lr-a", root / "lr-b", root / "lr-c"]


def rendered_dom(page, tmp_path):
    """The page's DOM after its scripts ran in headless Chromium, every host unreachable."""
    assert CHROMIUM is not None, "Chromium is needed: apt-get install chromium"
    out = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--host-resolver-rules=MAP * ~NOTFOUND",
         f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=20000", "--dump-dom",
         page.resolve().as_uri()],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def plain_events(row):
    return sum(1 for a, b in zip(row, row[1:]) if a and not b)


@needs_browser
def test_one_run_renders_offline_with_its_charts_and_tables(runs, tmp_path):
    page = write_report([runs[0]], tmp_path / "report.html")
    text = page.read_text(encoding="utf-8")
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", text)  # everything inline
    dom = rendered_dom(page, tmp_path)
    # curves, survival and heatmap drawn by plotly from the inline script, with no network
    assert dom.count('class="main-svg"') >= 3 * 2  # plotly draws two layers of svg per chart
    assert "Survival" in dom and "Forgetting by category" in dom

    # "forgotten most often": the probes with the most events, from a plain loop over the history
    run = load_run(runs[0])
    rows = run.trajectory.correct.tolist()
    events = {pid: plain_events(r) for pid, r in zip(run.trajectory.ids, rows)}
    table = dom.split("Forgotten most often")[1].split("</table>")[0]
    listed = [html.unescape(m) for m in re.findall(r'<td class="id">([^<]+)</td>', table)]
    assert listed and [events[pid] for pid in listed] == sorted(events.values(), reverse=True)[:len(listed)]
    # and the summary's last figures are the history's
    last = read_history(runs[0] / "history.jsonl")[-1]["report"]
    assert f"{100 * last['forgetting']:.1f}%" in dom.split("Over training")[0]


@needs_browser
def test_three_runs_are_overlaid(runs, tmp_path):
    page = tmp_path / "sweep.html"
    assert main(["report", *map(str, runs), "--out", str(page), "--png", str(tmp_path / "sweep.png")]) == 0
    dom = rendered_dom(page, tmp_path)
    for name in ("lr-a", "lr-b", "lr-c"):
        assert f"{name}: forgetting" in dom  # one curve per run in the shared chart
        assert f"Forgetting by category ({name})" in dom
    assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_errors_are_one_line(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nothing"), "--out", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("forgetwatch: error:") and "history.jsonl" in err and "\n" not in err


def test_names_cannot_break_out_of_the_page_scripts(runs):
    from forgetwatch.report_page import _page

    run = load_run(runs[0])
    run.name = "</script><!--<script>alert(1)"
    run.trajectory.categories = [run.name if c == "colors" else c for c in run.trajectory.categories]
    page = _page([run], 5)
    scripts = re.findall(r"<script>\(function\(\)\{(.*?)\}\)\(\);</script>", page, flags=re.S)
    assert scripts and not any(x in s for s in scripts for x in ("<", ">"))
    assert "&lt;/script&gt;&lt;!--&lt;script&gt;alert(1)" in page  # shown as text in the tables
