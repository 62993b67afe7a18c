"""history.jsonl: the record format and its one reader (the callback's, the report's and the plots')."""

from __future__ import annotations

import json
import logging
import math
import re

import pytest

from forgetwatch.results.history import HistoryError, history_record, report_from_record
from forgetwatch.results.report import TransitionReport
from forgetwatch.store.read import read_history

CATEGORY_OF = {"q1": "math", "q2": "math", "q3": "law", "q4": "law"}
COUNTS = {"n": 0, "forgotten": 0, "gained": 0, "kept": 0, "never": 0}  # the least a report holds


def line(step, **extra):
    """One history line: a record of ``step`` with an empty report's counts."""
    return json.dumps({"step": step, "report": dict(COUNTS), **extra})


def report() -> TransitionReport:
    return TransitionReport(
        n=4,
        forgotten=2,
        gained=1,
        kept=1,
        forgetting=0.5,
        choice_kl=math.inf,
        forgotten_ids=["q1", "q3"],
        gained_ids=["q4"],
        by_category={
            "math": TransitionReport(n=2, forgotten=1, kept=1, forgotten_ids=["q1"]),
            "law": TransitionReport(n=2, forgotten=1, gained=1, forgotten_ids=["q3"], gained_ids=["q4"]),
        },
    )


def write(path, *lines, end="\n"):
    path.write_text("\n".join(lines) + end, encoding="utf-8")
    return path


def test_record_keeps_ids_once_and_reads_back_per_category(tmp_path):
    record = history_record(
        30, report(), time=1718000000.12345, seconds=1.234567, trigger="schedule", stop="forgetting above 10%"
    )
    assert record["step"] == 30 and record["trigger"] == "schedule" and record["stop"] == "forgetting above 10%"
    assert record["time"] == 1718000000.123 and record["seconds"] == 1.2346
    assert record["report"]["forgotten_ids"] == ["q1", "q3"]
    for child in record["report"]["by_category"].values():
        assert not {"forgotten_ids", "gained_ids", "by_category"} & set(child)
    assert "stop" not in history_record(30, report(), time=0.0, seconds=0.0, trigger="evaluate")

    path = write(tmp_path / "history.jsonl", json.dumps(record, allow_nan=False))
    again = report_from_record(read_history(path)[0], CATEGORY_OF)
    assert again.by_category["math"].forgotten_ids == ["q1"]
    assert again.by_category["law"].forgotten_ids == ["q3"] and again.by_category["law"].gained_ids == ["q4"]
    assert again.forgotten_ids == ["q1", "q3"] and again.forgetting == 0.5
    assert math.isnan(again.choice_kl)  # infinite: null in strict JSON, NaN again


def test_torn_last_line_is_dropped_with_a_warning(tmp_path, caplog):
    path = write(tmp_path / "history.jsonl", line(10), line(20), '{"step": 30, "rep', end="")
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        assert [r["step"] for r in read_history(path)] == [10, 20]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "history.jsonl, line 3: dropping an incomplete last line" in warnings[0].message


def test_blank_lines_and_an_empty_file(tmp_path):
    assert [r["step"] for r in read_history(write(tmp_path / "h.jsonl", "", line(10), "  ", line(20), ""))] == [10, 20]
    assert read_history(write(tmp_path / "empty.jsonl", end="")) == []


@pytest.mark.parametrize(
    "bad, why",
    [
        ('{"step": 20, "report": {', "not valid JSON"),
        ("[1, 2]", "must be a JSON object, got \\[1, 2\\] \\(list\\)"),
        ('{"step": 20}', "field 'report': missing"),
        ('{"report": {}}', "field 'step': missing"),
        ('{"step": "20", "report": {}}', "field 'step': must be a whole number 0 or more, got '20' \\(str\\)"),
        ('{"step": 2.5, "report": {}}', "field 'step': must be a whole number"),
        ('{"step": true, "report": {}}', "field 'step': must be a whole number 0 or more, got True \\(bool\\)"),
        ('{"step": 20, "report": [1]}', "field 'report': must be a JSON object, got \\[1\\] \\(list\\)"),
        (
            '{"step": 20, "report": {"by_category": {"math": 3}}}',
            "field 'report.by_category': must be a JSON object by category",
        ),
        (b'{"step": 20, "report": {"x": "\xff"}}', "not UTF-8 text"),
    ],
)
def test_damaged_lines_raise_history_error_naming_file_and_line(tmp_path, bad, why):
    path = tmp_path / "history.jsonl"
    path.write_bytes(
        line(10).encode()
        + b"\n\n"
        + (bad if isinstance(bad, bytes) else bad.encode())
        + b"\n"
        + line(30).encode()
        + b"\n"
    )
    with pytest.raises(HistoryError) as info:
        read_history(path)
    assert (info.value.path, info.value.line) == (path, 3) and re.search(why, str(info.value))
    assert issubclass(HistoryError, ValueError)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_history(tmp_path / "nope.jsonl")


# -- trajectory columns, checked wherever a history is read --------------------------------------

N = 15  # probes of the run below


def base_answers():
    from forgetwatch.results.answers import Answers

    return Answers.from_samples(
        "fp",
        {},
        [
            {"id": f"q{i}", "correct": i % 2 == 0, "predicted": 0, "choice_logprobs": [-0.1, -2.0], "n_choices": 2}
            for i in range(N)
        ],
    )


def column(n=N, fingerprint="fp"):
    import numpy as np

    from forgetwatch.results.history import encode_column

    return encode_column(fingerprint, np.arange(n) % 3 == 0, np.linspace(-1, 1, n))


def zlib_b64(data: bytes) -> str:
    import base64
    import zlib

    return base64.b64encode(zlib.compress(data)).decode()


DAMAGED_COLUMNS = [
    (lambda c: {**c, "correct": "%%%%"}, "columns.correct", "not base64 text"),
    (lambda c: {**c, "signal": "AAAA"}, "columns.signal", "not zlib-compressed data"),
    (lambda c: {**c, "signal": c["signal"][:-8] + "A" * 8}, "columns.signal", "not zlib|cut short"),
    (lambda c: {**c, "signal": zlib_b64(b"\0" * (2 * N - 1))}, "columns.signal", "float16 values take 2 each"),
    (lambda c: {**c, "correct": 7}, "columns.correct", r"must be text, got 7 \(int\)"),
    (lambda c: {k: v for k, v in c.items() if k != "signal"}, "columns.signal", "missing"),
    (lambda c: [c], "columns", "must be a JSON object"),
    (lambda c: {**c, "correct": zlib_b64(b"\xff")}, "columns.correct", "holds 8 bits, not the 15 probes of its signal"),
    (lambda c: {**c, "correct": zlib_b64(b"\xff\xff")}, "columns.correct", "not the 15 probes"),  # a padding bit set
    (lambda c: column(40), "columns.correct", "holds more than the 15 probes of this run"),  # 40 events, not 15
    (lambda c: {**column(40), "correct": c["correct"]}, "columns.signal", "holds more than the 15 probes"),
    (lambda c: {**c, "signal": zlib_b64(b"\0" * 10**8)}, "columns.signal", "more than the 15 probes"),  # a zip bomb
    (lambda c: column(fingerprint="other"), "columns.probes", "another probe set"),
]


@pytest.mark.parametrize("damage, field, why", DAMAGED_COLUMNS)
def test_a_damaged_column_names_file_line_and_field_wherever_it_is_read(tmp_path, capsys, damage, field, why):
    from forgetwatch.cli import main
    from forgetwatch.store.read import load_trajectory, read_run

    run = tmp_path / "forgetwatch"
    run.mkdir()
    base_answers().save(run / "base_answers.npz")
    write(run / "history.jsonl", line(10, columns=column()), line(20, columns=damage(column())))
    where = rf"history\.jsonl, line 2, field '{field}': .*{why}"
    for read in (
        lambda: read_history(run / "history.jsonl", probes=N, fingerprint="fp"),
        lambda: read_run(tmp_path),
        lambda: load_trajectory(run),
    ):
        with pytest.raises(HistoryError, match=where):
            read()
    assert main(["report", str(run), "--out", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert re.search(where, err) and err.count("\n") == 1


def test_columns_decode_to_the_trajectory_they_were_made_from(tmp_path):
    from forgetwatch.results.trajectory import Trajectory
    from forgetwatch.store.read import read_run

    run = tmp_path / "forgetwatch"
    run.mkdir()
    base = base_answers()
    base.save(run / "base_answers.npz")
    t = Trajectory.start(base).plus(10, base)
    write(run / "history.jsonl", line(10, columns=t.column()))
    again = read_run(run).trajectory
    assert again.correct.tolist() == t.correct.tolist() and again.steps.tolist() == [0, 10]


@pytest.mark.parametrize(
    "lines, field, why",
    [
        ([line(10), line(10)], "step", "10 after step 10: steps must increase"),  # a line repeated
        ([line(20), line(10)], "step", "10 after step 20"),  # going backwards
        ([line(-5)], "step", "must be a whole number 0 or more"),
        (['{"step": 10, "report": {}}'], "report.n", "missing"),  # an empty report
        (
            [line(10).replace('"kept": 0', '"kept": 3')],
            "report.n",
            r"forgotten \+ gained \+ kept \+ never = 3, not n = 0",
        ),
        ([line(10).replace('"n": 0', '"n": -1')], "report.n", "must be a whole number 0 or more"),
        ([line(10).replace('"n": 0', '"n": 0, "forgetting": "high"')], "report.forgetting", "must be a number or null"),
        ([line(10).replace('"n": 0', '"n": 0, "forgetting": NaN')], "report.forgetting", "NaN is not JSON"),
        (
            [line(10).replace('"n": 0', '"n": 0, "forgotten_ids": [1]')],
            "report.forgotten_ids",
            "must be a list of probe ids",
        ),
        (
            [line(10).replace('"n": 0', '"n": 0, "forgetting_ci": [0.1]')],
            "report.forgetting_ci",
            r"must be \[low, high\]",
        ),
        (
            [line(10).replace('"n": 0', '"n": 0, "by_category": {"math": {"n": 2}}')],
            "report.by_category.math.forgotten",
            "missing",
        ),
        ([line(10, stop=3)], "stop", "must be text"),
    ],
)
def test_repeated_backward_and_empty_records_are_refused(tmp_path, lines, field, why):
    # never written so: the writer's steps increase (a resume cuts and rewrites the history), and
    # a report holds its counts; which of two records of one step is true cannot be told
    path = write(tmp_path / "history.jsonl", *lines)
    with pytest.raises(HistoryError) as info:
        read_history(path)
    e = info.value
    assert (e.path, e.line, e.field) == (path, len(lines), field) and re.search(why, e.reason)


def test_step_zero_is_a_record_too(tmp_path):  # eval_on_start evaluates at step 0
    assert [r["step"] for r in read_history(write(tmp_path / "h.jsonl", line(0), line(5)))] == [0, 5]


# -- what a resume keeps -------------------------------------------------------------------------
