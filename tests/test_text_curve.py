"""The demo's console curve of a history: a line per evaluation, bars proportional to forgetting."""

from __future__ import annotations

import json
import math
import random
import re

import pytest

from forgetwatch.cli.demo import text_curve
from forgetwatch.results.answers import Answers
from forgetwatch.results.metrics import compare
from forgetwatch.store.read import read_history

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
    return Answers.from_samples("fp-curve", {}, samples)


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


def test_null_and_nan_rates_show_as_dashes():
    history = make_history()
    empty = compare(answers([], []), answers([], [])).to_dict()  # n = 0: every rate null
    history.insert(2, {"step": 30, "report": empty})
    history[1]["report"]["forgetting"] = None
    assert "step 30  F    -  BT    -" in text_curve(history).splitlines()[2]
    assert text_curve([{"step": 5, "report": empty}]) == "step 5  F    -  BT    -"


def test_a_history_file_reads_as_its_records(tmp_path):
    records = make_history()
    path = write_jsonl(tmp_path / "history.jsonl", records)
    assert text_curve(read_history(path)) == text_curve(records)


def test_an_empty_history_is_an_error(tmp_path):
    empty_file = tmp_path / "history.jsonl"
    empty_file.write_text("\n\n")
    for history in ([], read_history(empty_file)):
        with pytest.raises(ValueError, match="no evaluations"):
            text_curve(history)


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
