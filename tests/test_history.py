"""history.jsonl: the record format and its one reader (the callback's and the plots')."""

from __future__ import annotations

import json
import logging
import math

import pytest

from forgetwatch.history import HistoryError, history_record, read_history, report_from_record
from forgetwatch.plot import load_history
from forgetwatch.report import TransitionReport

CATEGORY_OF = {"q1": "math", "q2": "math", "q3": "law", "q4": "law"}


def report() -> TransitionReport:
    return TransitionReport(
        n=4, forgotten=2, gained=1, kept=1, forgetting=0.5, choice_kl=math.inf,
        forgotten_ids=["q1", "q3"], gained_ids=["q4"],
        by_category={
            "math": TransitionReport(n=2, forgotten=1, kept=1, forgotten_ids=["q1"]),
            "law": TransitionReport(n=2, forgotten=1, gained=1, forgotten_ids=["q3"], gained_ids=["q4"]),
        },
    )


def write(path, *lines, end="\n"):
    path.write_text("\n".join(lines) + end, encoding="utf-8")
    return path


def test_record_keeps_ids_once_and_reads_back_per_category(tmp_path):
    record = history_record(30, report(), time=1718000000.12345, seconds=1.234567, trigger="schedule",
                            stop="forgetting above 10%")
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
    good = json.dumps({"step": 10, "report": {}})
    path = write(tmp_path / "history.jsonl", good, good.replace("10", "20"), '{"step": 30, "rep', end="")
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        assert [r["step"] for r in read_history(path)] == [10, 20]
        # the plots read with the same rule (they used to raise here)
        assert [r["step"] for r in load_history(path)] == [10, 20]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and "history.jsonl, line 3: dropping an incomplete last line" in warnings[0].message


def test_blank_lines_and_an_empty_file(tmp_path):
    good = json.dumps({"step": 10, "report": {}})
    assert [r["step"] for r in read_history(write(tmp_path / "h.jsonl", "", good, "  ", good, ""))] == [10, 10]
    assert read_history(write(tmp_path / "empty.jsonl", end="")) == []


@pytest.mark.parametrize("bad, why", [
    ('{"step": 20, "report": {', "not valid JSON"),
    ("[1, 2]", "expected a JSON object, got \\[1, 2\\] \\(list\\)"),
    ('{"step": 20}', "record has no 'report'"),
    ('{"report": {}}', "record has no 'step'"),
    ('{"step": "20", "report": {}}', "'step' must be an integer, got '20' \\(str\\)"),
    ('{"step": 2.5, "report": {}}', "'step' must be an integer"),
    ('{"step": true, "report": {}}', "'step' must be an integer, got True \\(bool\\)"),
    ('{"step": 20, "report": [1]}', "'report' must be a JSON object, got \\[1\\] \\(list\\)"),
    ('{"step": 20, "report": {"by_category": {"math": 3}}}', "'report.by_category' must map"),
    (b'{"step": 20, "report": {"x": "\xff"}}', "not UTF-8 text"),
])
def test_damaged_lines_raise_history_error_naming_file_and_line(tmp_path, bad, why):
    path = tmp_path / "history.jsonl"
    good = json.dumps({"step": 10, "report": {}}).encode()
    path.write_bytes(good + b"\n\n" + (bad if isinstance(bad, bytes) else bad.encode()) + b"\n" + good + b"\n")
    for reader in (read_history, load_history):
        with pytest.raises(HistoryError, match=rf"history\.jsonl, line 3: {why}.*fix or delete that line"):
            reader(path)
    assert issubclass(HistoryError, ValueError)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_history(tmp_path / "nope.jsonl")
