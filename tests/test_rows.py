"""One row collector (forgetwatch.common.rows.Rows) for every row file: probe files and replay pools
get the same checks, with the same messages, from the same code."""

from __future__ import annotations

import json

import pytest

from forgetwatch import ProbeError, ProbeSet, ReplayPool, ReplayPoolError
from forgetwatch.common.problems import InputError
from forgetwatch.common.rows import Rows

PROBE = {"id": "a", "question": "2 + 2 =", "answer": "4"}
POOL_ROW = {"id": "a", "text": "Paris is in France."}
KINDS = {"probes": (ProbeSet, ProbeError, PROBE), "pool": (ReplayPool, ReplayPoolError, POOL_ROW)}


def text_parser(row):
    return row["id"] if isinstance(row.get("text"), str) else [("text", "must be text")]


def test_a_parser_of_ones_own_gets_every_shared_check():
    rows = Rows("mine", "record", text_parser, InputError, "nothing here")
    rows.add(1, {"id": "x", "text": "t"})
    rows.add(2, ["not", "a", "row"])
    rows.add(3, {"id": "x", "text": 3})  # a duplicate with a problem of its own
    rows.add(4, {"id": "y", "text": float("nan")})  # never parsed: strict JSON cannot keep it
    rows.problem(5, "column", "missing")
    with pytest.raises(InputError) as info:
        rows.finish()
    assert [(e.line, e.key, e.message) for e in info.value.errors] == [
        (2, None, "expected a mapping (dict), got list"),
        (3, "id", "duplicate id 'x' (first used on record 1); ids must be unique"),
        (3, "text", "must be text"),
        (4, "text", "is nan, which strict JSON cannot hold; write None (null), or the value as a string"),
        (5, "column", "missing"),
    ]
    assert info.value.unit == "record"


def test_no_rows_is_the_callers_message():
    with pytest.raises(InputError, match="^mine: nothing here$"):
        Rows("mine", "record", text_parser, InputError, "nothing here").read_records([])


def test_a_duplicate_of_a_valid_row_is_not_kept():
    rows = Rows("mine", "record", text_parser, InputError, "none")
    assert rows.read_records([{"id": "x", "text": "t"}, {"id": "y", "text": "u"}]) == ["x", "y"]
    with pytest.raises(InputError, match="record 2: key 'id': duplicate id 'x'"):
        Rows("mine", "record", text_parser, InputError, "none").read_records([{"id": "x", "text": "t"}] * 2)


@pytest.mark.parametrize("kind", KINDS)
def test_probe_and_pool_files_say_the_same_of_the_same_lines(tmp_path, kind):
    loader, error, good = KINDS[kind]
    path = tmp_path / "rows.jsonl"
    lines = ["\ufeff" + json.dumps(good), "", "[1, 2]", "{not json", '{"id": "b", "n": NaN}', json.dumps(good)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(error) as info:
        loader.from_jsonl(path)
    assert [f"{e.line}: {e.key}: {e.message}" for e in info.value.errors] == [
        "3: None: expected a JSON object ({...}), got list",
        (
            "4: None: invalid JSON (Expecting property name enclosed in double quotes at column 2); "
            "each non-blank line must be one JSON object"
        ),
        "5: n: NaN is not JSON (strict JSON has no NaN or Infinity); write null, or the value as a string",
        "6: id: duplicate id 'a' (first used on line 1); ids must be unique",
    ]


@pytest.mark.parametrize("kind", KINDS)
def test_probe_and_pool_records_say_the_same_of_the_same_records(kind):
    loader, error, good = KINDS[kind]
    with pytest.raises(error) as info:
        loader.from_records([good, "text", {**good, "id": "b", "category": float("inf")}, good], source="mine")
    assert str(info.value).splitlines() == [
        "mine: record 2: expected a mapping (dict), got str",
        (
            "mine: record 3: field 'category': is inf, which strict JSON cannot hold; write None (null), "
            "or the value as a string"
        ),
        "mine: record 4: field 'id': duplicate id 'a' (first used on record 1); ids must be unique",
    ]
