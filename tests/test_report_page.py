"""`forgetwatch report`: one self-contained page, rendered in a real headless Chromium with the
network cut off, for one run and for three; its tables checked against plain loops."""

from __future__ import annotations

import html
import itertools
import os
import re
import shutil
import subprocess

import pytest

from forgetwatch import Output, Watch
from forgetwatch.cli import main
from forgetwatch.cli.demo import run_demo
from forgetwatch.page.html import (
    _behaviour,
    _curves,
    _group_forgetting,
    _groups,
    _heatmap,
    _page,
    _probe_tables,
    load_run,
    write_report,
)
from forgetwatch.probes import Probe
from forgetwatch.results.answers import Answers
from forgetwatch.store.read import read_history

# trains models (or runs several processes, or a browser): pytest -m "not slow" leaves them out
pytestmark = pytest.mark.slow

pytest.importorskip("plotly")
pytest.importorskip("trl")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# CI installs Chromium (.ci/run): there a missing browser is a failure, not a skip
needs_browser = pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("CI"), reason="no Chromium here (apt-get install chromium)"
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    for name, steps in (("lr-a", 20), ("lr-b", 30), ("lr-c", 10)):
        run_demo(root / name, steps=steps, eval_steps=5)
    return [root / "lr-a", root / "lr-b", root / "lr-c"]


@pytest.fixture(scope="module")
def one_evaluation(tmp_path_factory):
    out = tmp_path_factory.mktemp("one") / "run"
    run_demo(out, steps=5, eval_steps=5)
    assert [r["step"] for r in read_history(out / "history.jsonl")] == [5]
    return out


def rendered_dom(page, tmp_path):
    """The page's DOM after its scripts ran in headless Chromium, every host unreachable."""
    assert CHROMIUM is not None, "Chromium is needed: apt-get install chromium"
    out = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--virtual-time-budget=20000",
            "--dump-dom",
            page.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def plain_events(row):
    return sum(1 for a, b in zip(row, row[1:]) if a and not b)


def plain_flips(row):
    return sum(1 for a, b in itertools.pairwise(row) if a != b)


def plain_regained(row):
    """Right, then wrong, then right again, somewhere along the row."""
    seen_right = seen_lost = False
    for c in row:
        if c and seen_lost:
            return True
        seen_lost |= seen_right and not c
        seen_right |= c
    return False


def table_rows(page, title):
    """The cells (as text) of each row of the table under ``title`` in a page or a piece of one."""
    table = page.split(title)[1].split("</table>")[0]
    rows = re.findall(r"<tr><td class=\"id\">.*?</tr>", table, flags=re.DOTALL)
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", r, flags=re.DOTALL) for r in rows]
    return [[html.unescape(re.sub(r"<[^>]+>", "", c)) for c in row] for row in cells]


def drawn_lines(dom):
    """The path of every curve plotly drew (not the legend's samples)."""
    return re.findall(r'class="js-line" d="([^"]*)" style="vector-effect', dom)


@needs_browser
def test_one_run_renders_offline_with_its_charts_and_tables(runs, tmp_path):
    page = write_report([runs[0]], tmp_path / "report.html")
    text = page.read_text(encoding="utf-8")
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", text)  # everything inline
    dom = rendered_dom(page, tmp_path)
    # curves, survival and heatmap drawn by plotly from the inline script, with no network
    assert dom.count('class="main-svg"') >= 3 * 2  # plotly draws two layers of svg per chart
    assert "Survival" in dom and "Forgetting by category" in dom

    # "forgotten most often": of the probes wrong now, those with the most events, from a plain
    # loop over the history
    run = load_run(runs[0])
    rows = dict(zip(run.trajectory.ids, run.trajectory.correct.tolist()))
    candidates = sorted((plain_events(r) for r in rows.values() if plain_events(r) and not r[-1]), reverse=True)
    listed = [r[0] for r in table_rows(dom, "Forgotten most often")]
    assert listed and [plain_events(rows[pid]) for pid in listed] == candidates[: len(listed)]
    # and the summary's last figures are the history's
    last = read_history(runs[0] / "history.jsonl")[-1]["report"]
    assert f"{100 * last['forgetting']:.1f}%" in dom.split("Over training")[0]


@needs_browser
def test_three_runs_are_overlaid(runs, tmp_path):
    page = tmp_path / "sweep.html"
    assert main(["report", *map(str, runs), "--out", str(page)]) == 0
    dom = rendered_dom(page, tmp_path)
    for name in ("lr-a", "lr-b", "lr-c"):
        assert f"{name}: forgetting" in dom  # one curve per run in the shared chart
        assert f"Forgetting by category ({name})" in dom


@needs_browser
def test_one_evaluation_draws_lines_from_the_base(one_evaluation, tmp_path):
    page = write_report([one_evaluation], tmp_path / "one.html")
    lines = drawn_lines(rendered_dom(page, tmp_path))
    # every curve goes from the base to the evaluation: a move and at least one segment, not a dot
    assert len(lines) >= 5 and all(re.fullmatch(r"M[\d.,]+([LHV][\d.,]+)+", d) for d in lines), lines


def test_curves_start_at_the_base(one_evaluation, runs):
    for paths in ([one_evaluation], runs):
        loaded = [load_run(p) for p in paths]
        for run in loaded:
            base_accuracy = float(Answers.load(run.dir / "base_answers.npz").correct.mean())
            traces = [
                t
                for spec in _curves(loaded)
                for t in spec["data"]
                if len(loaded) == 1 or t["name"].startswith(run.name)
            ]
            assert traces
            for t in traces:
                assert t["x"] == [0, *run.steps]
                if "accuracy" in t["name"] or t["name"] == run.name:  # a run's accuracy curve
                    assert t["y"][0] == pytest.approx(base_accuracy)
                elif "noise" not in t["name"]:
                    assert t["y"][0] == 0, t["name"]  # forgetting and transfer against the base itself
    # the drift curves too: at the base, the responses are the base's (length ratio 1)
    run = with_a_behaviour_probe(load_run(one_evaluation))
    traces = {t["name"]: t for t in _behaviour([run])["data"]}
    assert traces["length in words vs the base"]["x"] == [0, 5]
    assert traces["length in words vs the base"]["y"][0] == 1.0
    assert traces["refusals"]["y"][0] == traces["refusals (base)"]["y"][0] == traces["refusals (base)"]["y"][1]


def with_a_behaviour_probe(run):
    """``run`` with one of its generative probes read as a behaviour probe (a check, no answer)."""
    pid = next(p.id for p in run.probes.values() if p.choices is None)
    run.probes[pid] = Probe(pid, run.probes[pid].question, None, check={"max_words": 5})
    return run


def test_behaviour_chart_only_with_behaviour_probes(runs):
    run = load_run(runs[0])
    # the demo's generative probes give the history drift figures, but it has no behaviour probe
    assert run.records[-1]["report"].get("behaviour") and not any(p.is_behaviour for p in run.probes.values())
    assert "Behaviour drift" not in _page([run], 5)
    assert "Behaviour drift" not in _page([load_run(p) for p in runs], 5)
    # one probe with a check: the chart is drawn
    assert "Behaviour drift" in _page([with_a_behaviour_probe(run)], 5)


def wrong_for(row):
    """How many evaluations at the end of the row the probe has been wrong."""
    return len(row) - max([k + 1 for k, c in enumerate(row) if c], default=0)


def test_forgotten_and_flickering_are_different_lists(runs):
    run = load_run(runs[1])  # 30 steps, 6 evaluations: probes forgotten for good and some that came back
    rows = dict(zip(run.trajectory.ids, run.trajectory.correct.tolist()))
    tables = _probe_tables(run, 1000)
    forgotten = [r[0] for r in table_rows(tables, "Forgotten most often")]
    flickering = [r[0] for r in table_rows(tables, "Flickering")]
    # forgotten: at least one forgetting event and wrong at the last evaluation; most events
    # first, then those wrong the longest
    assert forgotten == sorted(
        (p for p, r in rows.items() if plain_events(r) and not r[-1]),
        key=lambda p: (-plain_events(rows[p]), -wrong_for(rows[p])),
    )
    # flickering: right, wrong, then right again; most flips first
    assert flickering == sorted(
        (p for p, r in rows.items() if plain_regained(r)), key=lambda p: (-plain_flips(rows[p]), -plain_events(rows[p]))
    )
    assert forgotten and flickering and set(forgotten) != set(flickering)
    # a probe is in both only when it meets both definitions: it came back, then went again
    for pid in set(forgotten) & set(flickering):
        assert plain_regained(rows[pid]) and not rows[pid][-1]


def cut(text, n=40):
    return text if len(text) <= n else text[: n - 1] + "…"


def test_tables_show_the_gold_the_base_and_the_current_answer(runs, tmp_path):
    run = load_run(runs[1])
    base = Answers.load(run.dir / "base_answers.npz")
    latest = Answers.load(run.dir / "answers_latest.npz")  # the callback keeps the last evaluation's answers
    index = {pid: i for i, pid in enumerate(base.ids)}
    assert latest.meta["step"] == run.steps[-1] == 30
    assert latest.correct.tolist() == run.trajectory.correct[:, -1].tolist()

    def shown(answers, pid):  # what the W&B flips table shows: the choice's text, or the raw output
        probe, i = run.probes[pid], index[pid]
        return probe.choices[answers.predicted[i]] if probe.choices else answers.outputs[i]

    listed = []
    for title in ("Forgotten most often", "Flickering"):
        for pid, _category, _question, gold, then, now, *_ in table_rows(_probe_tables(run, 1000), title):
            assert gold == cut(run.probes[pid].answer_text)
            assert then == cut(shown(base, pid))
            assert now == cut(shown(latest, pid))
            if title.startswith("Forgotten"):
                assert now != gold  # wrong now: another choice, or another output
            listed.append(pid)
    assert len(listed) > 5
    assert any(run.probes[pid].choices for pid in listed) and any(not run.probes[pid].choices for pid in listed)

    # answers of another step than the last record's (a resumed run not evaluated since): right or wrong only
    stale = tmp_path / "stale"
    shutil.copytree(run.dir, stale)
    lines = (stale / "history.jsonl").read_text().splitlines(keepends=True)
    (stale / "history.jsonl").write_text("".join(lines[:-1]))
    older = load_run(stale)
    assert older.latest is None
    right_then = older.trajectory.correct[:, -1]
    for pid, *_, now, _events, _flips, _line, _margin in table_rows(_probe_tables(older, 1000), "Forgotten most often"):
        assert now == ("right" if right_then[index[pid]] else "wrong")


def test_report_errors_are_one_line(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nothing"), "--out", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("forgetwatch: error:") and "history.jsonl" in err and "\n" not in err


def test_names_cannot_break_out_of_the_page_scripts(runs):
    from forgetwatch.page.html import _page

    run = load_run(runs[0])
    run.name = "</script><!--<script>alert(1)"
    run.trajectory.categories = [run.name if c == "colors" else c for c in run.trajectory.categories]
    page = _page([run], 5)
    scripts = re.findall(r"<script>\(function\(\)\{(.*?)\}\)\(\);</script>", page, flags=re.S)
    assert scripts and not any(x in s for s in scripts for x in ("<", ">"))
    assert "&lt;/script&gt;&lt;!--&lt;script&gt;alert(1)" in page  # shown as text in the tables


def test_groups_get_a_heatmap_of_their_own_and_long_names_fit(toy, tmp_path):
    long = "high_school_government_and_politics"  # "ublic relations": the margin cut the names
    category_map = {"capitals": f"{long}_group", "colors": f"{long}_group", "rivers": "rivers"}
    watch = Watch(toy.probes, output_dir=tmp_path / "run", eval_steps=1, output=Output(category_map=category_map))
    watch.start(toy.base, toy.tokenizer)
    watch.evaluate(toy.tuned, 1)
    run = load_run(tmp_path / "run")
    assert _groups(run) == {f"{long}_group": ["capitals", "colors"], "rivers": ["rivers"]}
    # a group's rate is its categories' forgotten over their probes
    report = run.history[-1][1]
    kids = [report.by_category[c] for c in ("capitals", "colors")]
    groups = {g: _group_forgetting(run, cs) for g, cs in _groups(run).items()}
    assert groups[f"{long}_group"] == [sum(k.forgotten for k in kids) / sum(k.n for k in kids)]
    page = write_report([tmp_path / "run"], tmp_path / "report.html").read_text(encoding="utf-8")
    assert "Forgetting by group" in page and "Forgetting by category" in page
    for spec in (_heatmap(run, groups, "group"), _heatmap(run, {long: [0.1]}, "category")):
        # plotly sizes the left margin to the longest name, and reads none as a number
        assert spec["layout"]["yaxis"] == {"type": "category", "automargin": True}


@needs_browser
def test_a_run_directory_with_a_merge_sweep_shows_it(one_evaluation, tmp_path):
    import json
    import shutil

    run = tmp_path / "run"
    shutil.copytree(one_evaluation, run)
    rows = [
        {"alpha": a, "forgotten": f, "gained": 0, "forgetting": f / 10, "forgetting_adjusted": None, "gain": g}
        for a, f, g in ((0.0, 0, 0.0), (0.5, 1, 0.95), (1.0, 3, 1.0))
    ]
    (run / "sweep.json").write_text(json.dumps({"target_kind": "loss", "keep": 0.9, "best": 0.5, "rows": rows}))
    dom = rendered_dom(write_report([run], tmp_path / "page.html"), tmp_path)
    assert "merging base (alpha 0) and tuned (alpha 1) weights" in dom
    assert "chosen: alpha 0.5, keeping 90% of the gain" in dom


@pytest.mark.parametrize(
    ("table", "field"),
    [
        ({"target_kind": "loss", "keep": 0.9, "best": 0.5}, "field 'rows'"),
        ({"keep": 0.9, "best": 0.5, "rows": [{"alpha": 0.5, "forgetting": "x"}]}, "field 'rows[0].forgetting'"),
        ({"keep": 0.9, "best": 0.7, "rows": [{"alpha": 0.5, "forgetting": 0.1}]}, "field 'best'"),
    ],
)
def test_a_sweep_json_the_page_cannot_draw_is_one_line_naming_it(one_evaluation, tmp_path, capsys, table, field):
    import json
    import shutil

    run = tmp_path / "run"
    shutil.copytree(one_evaluation, run)
    (run / "sweep.json").write_text(json.dumps(table))
    assert main(["report", str(run), "--out", str(tmp_path / "page.html")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"forgetwatch: error: {run / 'sweep.json'}: {field}") and err.count("\n") == 1
