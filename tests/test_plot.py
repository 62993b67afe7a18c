"""Tests for forgetwatch.reporting.plot: history loading, the PNG curves and the console curve."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import random
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from forgetwatch.reporting.plot import LEGEND_MAX, _runs_figure, plot_history, plot_runs, text_curve
from forgetwatch.results.answers import Answers
from forgetwatch.results.metrics import compare
from forgetwatch.results.run_files import read_history

# the PNG tests need the optional matplotlib; the console curve does not
needs_mpl = pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason='needs "forgetwatch[plot]"')

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# -- realistic records, built the way the callback builds them -----------------------------------


def answers(correct, categories, k=4):
    samples = [
        {
            "id": f"q{i}",
            "correct": bool(c),
            "predicted": 0 if c else 1,
            "n_choices": k,
            "choice_logprobs": [0.0 if j == 0 else -1.0 for j in range(k)],
            "gold_logprob": 0.0,
            "category": cat,
        }
        for i, (c, cat) in enumerate(zip(correct, categories))
    ]
    return Answers.from_samples("fp-plot", {}, samples)


def make_history(steps=(0, 20, 40, 60, 80), n_categories=3, n=240, seed=0):
    """History records whose forgetting grows with the step, some categories faster."""
    rng = random.Random(seed)
    cats = [f"topic_{i % n_categories:02d}" for i in range(n)]
    before = [rng.random() < 0.7 for _ in range(n)]
    base = answers(before, cats)
    records = []
    for t, step in enumerate(steps):
        after = []
        for i, was in enumerate(before):
            speed = 0.04 * (1 + i % n_categories)  # category i forgets i+1 times as fast
            if was:
                after.append(rng.random() >= speed * t)
            else:
                after.append(rng.random() < 0.3)
        report = compare(base, answers(after, cats))
        records.append({"step": step, "time": 1.5 * t, "report": report.to_dict()})
    return records


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def read_png(path):
    import matplotlib.image

    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    return matplotlib.image.imread(path)


def assert_not_blank(img):
    background = img[0, 0]
    differs = np.abs(img[..., :3] - background[:3]).sum(axis=-1) > 0.1
    assert differs.mean() > 0.01, "image looks blank"


def legend_texts(fig):
    return [t.get_text() for t in fig.legends[0].get_texts()]


# -- PNG -----------------------------------------------------------------------------------------


@needs_mpl
def test_png_written_valid_and_not_blank(tmp_path):
    out = plot_history(make_history(), tmp_path / "sub" / "curve.png", title="toy run")
    assert out == tmp_path / "sub" / "curve.png"
    img = read_png(out)
    assert img.ndim == 3 and img.shape[2] in (3, 4)
    assert img.shape[1] == 1440 and 500 < img.shape[0] < 800  # 12 in wide at 120 dpi
    assert_not_blank(img)
    # atomic write: nothing left beside it
    assert sorted(p.name for p in out.parent.iterdir()) == ["curve.png"]


@needs_mpl
def test_overwrites_existing_file(tmp_path):
    out = tmp_path / "curve.png"
    out.write_bytes(b"old")
    plot_history(make_history(), out)
    assert out.read_bytes()[:8] == PNG_MAGIC


@needs_mpl
def test_figure_content():
    fig = _runs_figure([(None, make_history())], "my title")
    texts = legend_texts(fig)
    assert texts[:3] == ["overall", "overall, chance-adjusted", "overall, 95% interval"]
    # categories ordered by peak forgetting: topic_02 forgets fastest
    assert texts[3:] == ["topic_02", "topic_01", "topic_00"]
    left, right = fig.axes[:2]
    assert "Forgetting" in left.get_title() and "Backward transfer" in right.get_title()
    assert "my title" in fig._suptitle.get_text() and "240 probes" in fig._suptitle.get_text()
    # 3 categories + overall + adjusted per panel, all with markers at the 5 evaluated steps
    for ax in (left, right):
        assert len(ax.lines) == 5
        for line in ax.lines:
            assert line.get_marker() == "o"
            assert list(line.get_xdata()) == [0, 20, 40, 60, 80]
    # y axis in percent
    left.figure.canvas.draw()
    labels = [t.get_text() for t in left.get_yticklabels() if t.get_text()]
    assert labels and all(label.endswith("%") for label in labels)
    assert_all_data_visible(fig)
    # one y scale, so F and BT compare at a glance
    assert left.get_ylim() == right.get_ylim()


@needs_mpl
def test_many_categories_cap_the_legend(tmp_path):
    history = make_history(n_categories=30, n=600)
    fig = _runs_figure([(None, history)], None)
    texts = legend_texts(fig)
    assert len(texts) <= LEGEND_MAX
    assert texts[-1] == f"+{30 - (len(texts) - 4)} more categories"
    # every category is still drawn (grey or coloured), plus overall and adjusted
    assert len(fig.axes[0].lines) == 30 + 2
    # the named ones are those that forgot the most
    peak = {}
    for r in history:
        for cat, rep in r["report"]["by_category"].items():
            peak[cat] = max(peak.get(cat, -1.0), rep["forgetting"])
    named = texts[3:-1]
    assert min(peak[c] for c in named) >= max(peak[c] for c in peak if c not in named)

    img = read_png(plot_history(history, tmp_path / "many.png"))
    assert_not_blank(img)


@needs_mpl
def test_nan_and_null_values_tolerated(tmp_path):
    history = make_history()
    empty = compare(answers([], []), answers([], [])).to_dict()  # n = 0: every rate null
    history.insert(2, {"step": 30, "report": empty})
    history[1]["report"]["forgetting"] = None
    history[1]["report"]["forgetting_ci"] = [None, None]
    history[3]["report"]["by_category"].pop("topic_01")  # a category missing at one step
    history[3]["report"]["by_category"]["topic_00"]["backward_transfer"] = float("nan")
    out = plot_history(history, tmp_path / "nan.png")
    assert_not_blank(read_png(out))
    text = text_curve(history)
    assert "step 30  F    -  BT    -" in text.splitlines()[2]


@needs_mpl
def test_all_null_history_still_plots(tmp_path):
    empty = compare(answers([], []), answers([], [])).to_dict()
    out = plot_history([{"step": 5, "report": empty}], tmp_path / "null.png")
    assert read_png(out).shape[1] == 1440
    assert text_curve([{"step": 5, "report": empty}]) == "step 5  F    -  BT    -"


def assert_all_data_visible(fig):
    for ax in fig.axes[:2]:
        low, high = ax.get_ylim()
        assert low == 0.0
        for line in ax.lines:
            y = np.asarray(line.get_ydata(), dtype=float)
            assert np.all(y[np.isfinite(y)] <= high), (ax.get_title(), line.get_ydata(), high)


@needs_mpl
def test_single_evaluation(tmp_path):
    history = make_history(steps=(100,))  # step 0 of the generator: F = 0, BT > 0
    assert history[0]["report"]["backward_transfer"] > 0.05
    out = plot_history(history, tmp_path / "one.png")
    assert_not_blank(read_png(out))
    fig = _runs_figure([(None, history)], None)
    assert "1 evaluation," in fig._suptitle.get_text()
    assert_all_data_visible(fig)
    assert len(text_curve(history).splitlines()) == 1


@needs_mpl
@pytest.mark.parametrize("n_evaluations", [1, 4])
def test_curves_start_at_the_base(n_evaluations):
    # no record at step 0: the curves still start there, every rate 0 against the base itself,
    # so one evaluation is a line from the base, not a lone dot
    history = make_history()[1 : 1 + n_evaluations]
    steps = [r["step"] for r in history]
    assert steps[0] > 0 and history[-1]["report"]["forgetting"] > 0
    fig = _runs_figure([(None, history)], None)
    for ax in fig.axes[:2]:
        assert len(ax.lines) == 5  # 3 categories, overall and adjusted
        for line in ax.lines:
            assert list(line.get_xdata()) == [0, *steps]
            assert line.get_ydata()[0] == 0
    assert f"{n_evaluations} evaluation" in fig._suptitle.get_text()  # the base is not an evaluation
    assert_all_data_visible(fig)


@needs_mpl
@pytest.mark.slow
def test_several_runs_one_row_each_with_categories_and_one_y_axis_from_zero(tmp_path):
    runs = {"lr-a": make_history(seed=1)[1:], "lr-b": make_history(steps=(0, 10, 20), seed=2)[1:]}
    runs["lr-b"][-1]["report"]["forgetting"] = 0.6  # the highest rate of all, in the second run
    fig = _runs_figure(list(runs.items()), "sweep")
    assert len(fig.axes) == 4  # a row of two panels per run
    texts = legend_texts(fig)
    assert texts[0] == "overall" and sorted(texts[-3:]) == ["topic_00", "topic_01", "topic_02"]
    rows = [fig.axes[:2], fig.axes[2:]]
    for (name, history), (left, right) in zip(runs.items(), rows):
        assert name in left.get_ylabel()
        for ax in (left, right):
            assert len(ax.lines) == 5  # the same categories as one run's PNG, plus overall and adjusted
            for line in ax.lines:
                assert list(line.get_xdata()) == [0] + [r["step"] for r in history]
    # a category has one colour in every row
    assert [line.get_color() for line in rows[0][0].lines] == [line.get_color() for line in rows[1][0].lines]
    # one y axis for all, from 0, and every point visible
    assert len({ax.get_ylim() for ax in fig.axes}) == 1
    low, high = fig.axes[0].get_ylim()
    assert low == 0 and high >= 0.6
    assert "sweep" in fig._suptitle.get_text() and "2 runs" in fig._suptitle.get_text()
    out = plot_runs(runs, tmp_path / "sweep.png", title="sweep")
    img = read_png(out)
    assert img.shape[1] == 1440 and img.shape[0] > read_png(plot_history(runs["lr-a"], tmp_path / "a.png")).shape[0]
    assert_not_blank(img)


@needs_mpl
def test_single_category_is_not_drawn_twice():
    fig = _runs_figure([(None, make_history(n_categories=1))], None)
    assert legend_texts(fig)[3:] == []
    assert len(fig.axes[0].lines) == 2  # overall and adjusted


@needs_mpl
@pytest.mark.slow
def test_a_history_file_draws_as_its_records(tmp_path):
    records = make_history()
    path = write_jsonl(tmp_path / "history.jsonl", records)
    a = plot_history(read_history(path), tmp_path / "a.png")
    c = plot_history(records, tmp_path / "c.png")
    assert_not_blank(read_png(a))
    assert a.read_bytes() == c.read_bytes()  # same records, same picture
    assert text_curve(read_history(path)) == text_curve(records)


@needs_mpl
def test_pyplot_state_untouched(tmp_path):
    import matplotlib
    import matplotlib.pyplot as plt

    backend = matplotlib.get_backend()
    fig = plt.figure()
    try:
        nums = plt.get_fignums()
        plot_history(make_history(), tmp_path / "curve.png")
        assert plt.get_fignums() == nums
        assert plt.gcf() is fig
        assert matplotlib.get_backend() == backend
    finally:
        plt.close(fig)


@needs_mpl
@pytest.mark.slow
def test_pyplot_never_imported(tmp_path):
    path = write_jsonl(tmp_path / "history.jsonl", make_history())
    code = textwrap.dedent(f"""
        import sys
        from forgetwatch.reporting.plot import plot_history
        from forgetwatch.results.run_files import read_history
        plot_history(read_history({str(path)!r}), {str(tmp_path / "x.png")!r})
        assert "matplotlib.pyplot" not in sys.modules, "pyplot was imported"
    """)
    env = dict(os.environ, MPLBACKEND="")
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=300)


def test_missing_matplotlib_message(tmp_path, monkeypatch):
    for name in list(sys.modules):
        if name == "matplotlib" or name.startswith("matplotlib."):
            monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError, match=r'pip install "forgetwatch\[plot\]"'):
        plot_history(make_history(), tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()
    assert text_curve(make_history())  # the console curve needs no matplotlib


# -- errors -------------------------------------------------------------------------------------


@needs_mpl
def test_empty_history_errors(tmp_path):
    empty_file = tmp_path / "history.jsonl"
    empty_file.write_text("\n\n")
    for history in ([], read_history(empty_file)):
        with pytest.raises(ValueError, match="no evaluations"):
            plot_history(history, tmp_path / "x.png")
        with pytest.raises(ValueError, match="no evaluations"):
            text_curve(history)
    assert not (tmp_path / "x.png").exists()


# -- console curve -------------------------------------------------------------------------------

LINE = re.compile(r"^step +(\d+)  F +([\d.]+|-)%?  BT +([\d.]+|-)%?(?:  (#+))?$")


def test_text_curve_numbers_and_proportional_bars():
    history = make_history()
    text = text_curve(history, width=70)
    lines = text.splitlines()
    assert len(lines) == len(history)
    assert max(len(line) for line in lines) == 70  # the largest F fills the width
    bars = []
    for line, record in zip(lines, history):
        m = LINE.match(line)
        assert m, line
        rep = record["report"]
        assert int(m.group(1)) == record["step"]
        assert m.group(2) == f"{100 * rep['forgetting']:.1f}"
        assert m.group(3) == f"{100 * rep['backward_transfer']:.1f}"
        bars.append((len(m.group(4) or ""), rep["forgetting"]))
    top_len, top_f = max(bars, key=lambda b: b[1])
    assert bars[0] == (0, 0.0)  # step 0: nothing forgotten yet
    for length, f in bars:
        assert abs(length - top_len * f / top_f) <= 0.5 + 1e-9


def test_text_curve_example_format_and_order():
    history = [
        {"step": 40, "report": {"forgetting": 0.031, "backward_transfer": 0.008}},
        {"step": 0, "report": {"forgetting": 0.0, "backward_transfer": 0.0}},
        {"step": 40, "report": {"forgetting": 0.062, "backward_transfer": 0.008}},  # later wins
        {"step": 20, "report": {"forgetting": 0.031, "backward_transfer": 0.1234}},
    ]
    lines = text_curve(history, width=40).splitlines()
    assert [line.split()[1] for line in lines] == ["0", "20", "40"]
    assert lines[0] == "step  0  F  0.0%  BT  0.0%"
    assert lines[1].startswith("step 20  F  3.1%  BT 12.3%  #")
    assert lines[2].startswith("step 40  F  6.2%  BT  0.8%  #")
    assert lines[2].count("#") == 2 * lines[1].count("#")
    # narrow widths still get a readable bar
    assert text_curve(history, width=1).splitlines()[2].count("#") == 10


def test_text_curve_steps_aligned():
    history = make_history(steps=(5, 50, 500))
    lines = text_curve(history).splitlines()
    assert [line.index("F") for line in lines] == [lines[0].index("F")] * 3
    assert all(not math.isnan(float(LINE.match(x).group(2))) for x in lines)
