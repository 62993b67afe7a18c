"""Tests for forgetwatch.probes: loading, validation, presets, selection, saving."""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path

import pytest

from forgetwatch.common.problems import MAX_REPORTED as MAX_REPORTED_ERRORS
from forgetwatch.probes import Probe, ProbeError, ProbeKind, ProbeSet
from forgetwatch.probes.extract import extractor_for, reference_for

MC = {"id": "mc1", "question": "2 + 2 =", "choices": ["3", "4"], "answer": 1, "category": "math"}
GEN = {"id": "gen1", "question": "6 * 12 =", "answer": "72", "extract": "number"}


def write_lines(tmp_path: Path, lines: list[str | bytes], name: str = "probes.jsonl") -> Path:
    path = tmp_path / name
    path.write_bytes(b"\n".join(x if isinstance(x, bytes) else x.encode() for x in lines) + b"\n")
    return path


def row(**fields) -> str:
    return json.dumps(fields)


def load_error(tmp_path: Path, lines: list[str | bytes]) -> tuple[ProbeError, str]:
    """The error loading ``lines`` as a probe file raises, and the file's path."""
    path = write_lines(tmp_path, lines)
    with pytest.raises(ProbeError) as info:
        ProbeSet.from_jsonl(path)
    return info.value, str(path)


def places(err: ProbeError) -> list[tuple]:
    """Where each of an error's problems is: (source, line, field)."""
    return [p[:3] for p in err.errors]


def record_error(rows: list) -> ProbeError:
    with pytest.raises(ProbeError) as info:
        ProbeSet.from_records(rows)
    return info.value


# -- validation of JSONL files -------------------------------------------------------------------

# (bad row placed on line 2 after a good row, field named in the error, the fix the error suggests or None)
BAD_ROWS = [
    pytest.param(row(question="q", answer="a"), "id", None, id="missing-id"),
    pytest.param(row(id=7, question="q", answer="a"), "id", 'quote it: "7"', id="id-not-str"),
    pytest.param(row(id="x", answer="a"), "question", None, id="missing-question"),
    pytest.param(row(id="x", question="  \t", answer="a"), "question", None, id="blank-question"),
    pytest.param(row(id="x", question="q", choices="A or B", answer=0), "choices", None, id="choices-not-list"),
    pytest.param(row(id="x", question="q", choices=["only"], answer=0), "choices", None, id="one-choice"),
    pytest.param(row(id="x", question="q", choices=["a", " "], answer=0), "choices", None, id="blank-choice"),
    pytest.param(
        row(id="x", question="q", choices=["a", "b", 3], answer=0),
        "choices",
        None,
        id="non-str-choice",
    ),
    pytest.param(row(id="x", question="q", choices=["a", "b"]), "answer", None, id="mc-answer-missing"),
    pytest.param(row(id="x", question="q"), "answer", None, id="gen-answer-missing"),
    pytest.param(
        row(id="x", question="q", choices=["a", "b", "c"], answer="b"), "answer", "(0 to 2)", id="mc-answer-str"
    ),
    pytest.param(row(id="x", question="q", choices=["a", "b"], answer=True), "answer", None, id="mc-answer-bool"),
    pytest.param(
        row(id="x", question="q", choices=["a", "b", "c"], answer=3),
        "answer",
        "use 0 to 2",
        id="mc-answer-out-of-range",
    ),
    pytest.param(row(id="x", question="q", choices=["a", "b"], answer=-1), "answer", None, id="mc-answer-negative"),
    pytest.param(row(id="x", question="q", answer=72), "answer", 'quote it: "72"', id="gen-answer-not-str"),
    pytest.param(
        row(id="x", question="q", choices=["a", "b"], answer=0, extract="number"),
        "extract",
        None,
        id="extract-on-mc",
    ),
    pytest.param(row(id="x", question="q", answer="1", extract="numbr"), "extract", None, id="unknown-extract"),
    pytest.param(row(id="x", question="q", answer="1", extract="(\\d+"), "extract", None, id="regex-bad"),
    pytest.param(row(id="x", question="q", answer="1", extract="\\d+ apples"), "extract", None, id="regex-no-group"),
    pytest.param(
        row(id="x", question="q", answer="1", extract="(\\d+) (apples)"),
        "extract",
        None,
        id="regex-two-groups",
    ),
    pytest.param(row(id="x", question="q", answer="1", category=3), "category", None, id="category-not-str"),
]


@pytest.mark.parametrize("bad, fld, fix", BAD_ROWS)
def test_bad_row_error_names_file_line_and_field(tmp_path, bad, fld, fix):
    err, path = load_error(tmp_path, [json.dumps(MC), bad])
    assert places(err) == [(path, 2, fld)]
    assert fix is None or fix in err.errors[0].message


def test_the_message_names_file_line_and_field_on_each_line(tmp_path):
    err, path = load_error(tmp_path, [row(id="x", question="q"), row(question="q", answer="a")])  # the contract's words
    assert [line.split(": ")[:3] for line in str(err).splitlines()] == [
        [path, "line 1", "field 'answer'"],
        [path, "line 2", "field 'id'"],
    ]


def test_generative_answer_error_spots_a_choices_typo(tmp_path):
    err, path = load_error(tmp_path, [row(id="x", question="q", choises=["a", "b"], answer=1)])
    assert places(err) == [(path, 1, "answer")]
    assert "did you mean 'choices'" in err.errors[0].message  # the suggestion


def test_mc_answer_written_as_choice_text_suggests_index(tmp_path):
    err, path = load_error(tmp_path, [row(id="x", question="q", choices=["A", "B"], answer="B")])
    assert places(err) == [(path, 1, "answer")] and "index 1" in err.errors[0].message


@pytest.mark.parametrize(
    "line", ['{"id": "x", "question": }', '["id", "question"]'], ids=["invalid-json", "not-an-object"]
)
def test_a_line_that_is_no_json_object_is_named_by_its_number(tmp_path, line):
    err, path = load_error(tmp_path, [json.dumps(MC), line])
    assert places(err) == [(path, 2, None)]


def test_non_utf8_line_reports_its_line_number(tmp_path):
    latin1 = json.dumps({"id": "x", "question": "café", "answer": "1"}, ensure_ascii=False).encode("latin-1")
    err, path = load_error(tmp_path, [json.dumps(MC), "", latin1, json.dumps(GEN)])
    assert places(err) == [(path, 3, None)]


def test_duplicate_id_names_first_occurrence(tmp_path):
    err, path = load_error(tmp_path, [json.dumps(MC), json.dumps(GEN), json.dumps({**GEN, "answer": "7"})])
    assert places(err) == [(path, 3, "id")] and "line 2" in err.errors[0].message


@pytest.mark.parametrize("lines", [[], ["", "   ", "\t"]], ids=["empty", "blank-only"])
def test_file_without_probes_is_an_error(tmp_path, lines):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n".join(lines))
    with pytest.raises(ProbeError) as info:
        ProbeSet.from_jsonl(path)
    assert places(info.value) == [(str(path), None, None)]


def test_missing_file_is_file_not_found(tmp_path):
    path = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError) as info:
        ProbeSet.from_jsonl(path)
    assert not isinstance(info.value, ProbeError)
    assert str(path) in str(info.value)


def test_all_bad_rows_reported_together(tmp_path):
    lines = [
        json.dumps(MC),
        row(id="a", question="q", answer=1),  # line 2
        "not json",  # line 3
        json.dumps(GEN),
        row(id="b", question="", choices=["x"], answer="x"),  # line 5: question, choices, answer
        row(id="b", question="q", choices=["x", ""], answer=2),  # line 6: id (dup of a bad row), choices, answer
    ]
    err, _ = load_error(tmp_path, lines)
    assert [(e[1], e[2]) for e in err.errors] == [
        (2, "answer"),
        (3, None),
        (5, "question"),
        (5, "choices"),
        (5, "answer"),
        (6, "id"),
        (6, "choices"),
        (6, "answer"),
    ]
    assert "line 5" in err.errors[5].message  # the duplicate id's first use


def test_error_report_is_capped(tmp_path):
    lines = [row(id=f"q{i}", question="q", answer=i) for i in range(MAX_REPORTED_ERRORS + 5)]
    err, path = load_error(tmp_path, lines)
    assert places(err) == [(path, line, "answer") for line in range(1, MAX_REPORTED_ERRORS + 1)] + [(path, None, None)]
    assert "5 more" in err.errors[-1].message  # the count of those not shown


def test_valid_file_loads_with_blank_lines_bom_and_meta(tmp_path):
    path = write_lines(
        tmp_path,
        [
            b"\xef\xbb\xbf" + json.dumps(MC).encode(),
            "",
            "  ",
            json.dumps({**GEN, "source": "hand", "note": {"difficulty": 2}}),
            "\r",
        ],
    )
    probes = ProbeSet.from_jsonl(path)
    assert probes.ids == ["mc1", "gen1"] and probes.source == str(path)
    mc, gen = probes
    assert mc == Probe(id="mc1", question="2 + 2 =", answer=1, choices=("3", "4"), category="math")
    assert (gen.answer, gen.extract, gen.category, gen.choices) == ("72", "number", "all", None)
    assert gen.meta == {"source": "hand", "note": {"difficulty": 2}}
    assert probes.categories == ["all", "math"]


def test_regex_extract_with_one_group_is_accepted(tmp_path):
    probes = ProbeSet.from_records([{**GEN, "extract": r"answer is (?:about )?(\d+)"}])
    assert probes[0].extract == r"answer is (?:about )?(\d+)"


# -- from_records ----------------------------------------------------------------------------------


def test_from_records_errors_name_record_numbers():
    with pytest.raises(ProbeError) as info:
        ProbeSet.from_records([MC, {**GEN, "answer": 4}, "not a dict", MC], source="mine")
    err = info.value
    assert places(err) == [("mine", 2, "answer"), ("mine", 3, None), ("mine", 4, "id")]
    assert err.unit == "record" and "record 1" in err.errors[2].message  # the duplicate's first use
    assert "line" not in str(err)


# -- from_hf presets --------------------------------------------------------------------------------

MMLU_ROW = {
    "question": "  Find the degree of Q(sqrt(2)) over Q.\n",
    "subject": "abstract_algebra",
    "choices": ["0", "4", "2", "6"],
    "answer": 2,
}


def test_mmlu_preset():
    probes = ProbeSet.from_hf([MMLU_ROW, {**MMLU_ROW, "choices": ["yes", "no"], "answer": 0}], "mmlu")
    p = probes[0]
    assert p.question == (
        "The following are multiple choice questions (with answers) about abstract algebra.\n\n"
        "Find the degree of Q(sqrt(2)) over Q.\nA. 0\nB. 4\nC. 2\nD. 6\nAnswer:"
    )
    assert (p.choices, p.answer, p.category, p.id) == (
        ("A", "B", "C", "D"),
        2,
        "abstract_algebra",
        "mmlu/abstract_algebra/0",
    )
    assert probes[1].choices == ("A", "B") and probes[1].question.endswith("\nA. yes\nB. no\nAnswer:")
    assert probes[1].id == "mmlu/abstract_algebra/1"


def test_mmlu_cot_preset_asks_for_a_reasoned_answer_line():
    [p] = ProbeSet.from_hf([MMLU_ROW], "mmlu_cot")
    assert p.kind is ProbeKind.GENERATIVE and (p.answer, p.extract, p.id) == (
        "C",
        "answer_line",
        "mmlu_cot/abstract_algebra/0",
    )
    assert p.question.startswith("Answer the following multiple choice question. Think step by step")
    assert '"Answer: $LETTER" where LETTER is one of ABCD' in p.question
    assert p.question.endswith("Question: Find the degree of Q(sqrt(2)) over Q.\nA) 0\nB) 4\nC) 2\nD) 6")
    read = extractor_for(p.extract)
    assert read("Q(sqrt 2) has degree 2, option C.\nAnswer: C") == reference_for(p.extract, p.answer)
    assert read("It is 4.\nAnswer: B") != reference_for(p.extract, p.answer)


def test_arc_preset_with_letter_and_digit_keys():
    rows = [
        {
            "id": "Mercury_1",
            "question": "Which is a gas?",
            "answerKey": "C",
            "choices": {"text": ["rock", "water", "steam", "ice"], "label": ["A", "B", "C", "D"]},
        },
        {
            "id": "NYSEDREGENTS_2",
            "question": "Pick one.",
            "answerKey": "1",
            "choices": {"text": ["first", "second"], "label": ["1", "2"]},
        },
    ]
    probes = ProbeSet.from_hf(rows, "arc")
    assert probes[0] == Probe(
        id="Mercury_1",
        question="Question: Which is a gas?\nAnswer:",
        choices=("rock", "water", "steam", "ice"),
        answer=2,
        category="arc",
    )
    assert (probes[1].id, probes[1].answer) == ("NYSEDREGENTS_2", 0)
    assert ProbeSet.from_hf(rows, "arc", category="arc_easy").categories == ["arc_easy"]


def test_arc_answer_key_not_in_labels():
    bad = {"id": "a", "question": "q", "answerKey": "E", "choices": {"text": ["x", "y"], "label": ["A", "B"]}}
    with pytest.raises(ProbeError) as info:
        ProbeSet.from_hf([bad], "arc")
    assert places(info.value) == [("<dataset>", 0, "answerKey")] and info.value.unit == "dataset row"


HELLASWAG_ROW = {
    "ind": 24,
    "activity_label": "Roof shingle removal",
    "ctx_a": "A man is sitting on a roof.",
    "ctx_b": "he",
    "ctx": "unused",
    "endings": [
        "is using wrap to wrap a pair of skis.",
        "starts [header] pulling up roofing.",
        "is ripping level tiles off [title] Remove the rest.",
        "  is holding a rubik's cube. ",
    ],
    "label": "3",
}


def test_hellaswag_preset_preprocesses_like_lm_eval():
    row_title = {**HELLASWAG_ROW, "ctx_b": "then [title] he climbs", "ind": None}
    probes = ProbeSet.from_hf([HELLASWAG_ROW, row_title], "hellaswag")
    p = probes[0]
    assert p.question == "Roof shingle removal: A man is sitting on a roof. He"
    assert p.choices == (
        "is using wrap to wrap a pair of skis.",
        "starts pulling up roofing.",
        "is ripping level tiles off. Remove the rest.",
        "is holding a rubik's cube.",
    )
    assert (p.answer, p.category, p.id) == (3, "hellaswag", "hellaswag/24")
    # capitalize() lowercases the rest, then " [title]" becomes ". " and the double space collapses
    assert probes[1].question == "Roof shingle removal: A man is sitting on a roof. Then. he climbs"
    assert probes[1].id == "hellaswag/1"  # no ind: falls back to the row index


def test_hellaswag_unlabelled_row_is_an_error():
    with pytest.raises(ProbeError) as info:
        ProbeSet.from_hf([{**HELLASWAG_ROW, "label": ""}], "hellaswag")
    assert places(info.value) == [("<dataset>", 0, "label")]


def test_gsm8k_preset():
    rows = [
        {"question": "Janet has 1,000 ducks...", "answer": "She sells 1,234 - 0 = 1,234.\n#### 1,234"},
        {"question": "Two?", "answer": "a #### b\n#### -5 "},
    ]
    probes = ProbeSet.from_hf(rows, "gsm8k")
    p = probes[0]
    assert p == Probe(
        id="gsm8k/0",
        question="Question: Janet has 1,000 ducks...\nAnswer:",
        answer="1234",
        extract="number",
        category="gsm8k",
    )
    assert not p.is_multiple_choice
    assert (probes[1].id, probes[1].answer) == ("gsm8k/1", "-5")


def test_preset_missing_column_names_it_and_lists_row_columns():
    rows = [MMLU_ROW, {"question": "q", "choices": ["a", "b"], "answer": 0}, {**MMLU_ROW, "answer": 9}]
    with pytest.raises(ProbeError) as info:
        ProbeSet.from_hf(rows, "mmlu", source="cais/mmlu")
    assert places(info.value) == [("cais/mmlu", 1, "subject"), ("cais/mmlu", 2, "answer")]
    assert "question, choices, answer" in info.value.errors[0].message  # the columns the row has


def test_from_hf_with_a_real_dataset_and_limit():
    datasets = pytest.importorskip("datasets")
    rows = [{**MMLU_ROW, "subject": s} for s in ("anatomy", "virology", "anatomy")]
    ds = datasets.Dataset.from_list(rows)
    probes = ProbeSet.from_hf(ds, "mmlu", limit=2)
    assert probes.ids == ["mmlu/anatomy/0", "mmlu/virology/1"]
    assert probes[:].ids == ProbeSet.from_hf(rows[:2], "mmlu").ids
    assert [p.answer for p in probes] == [2, 2] and all(type(p.answer) is int for p in probes)


def test_from_hf_schema_rows_from_a_dataset_with_padded_columns():
    datasets = pytest.importorskip("datasets")
    # from_list takes its columns from the first row and pads the others' missing keys with None
    rows = [
        {"id": "gen2", "question": "q", "answer": "x", "category": "c", "src": "web"},
        {"id": "gen3", "question": "r", "answer": "y"},
    ]
    ds = datasets.Dataset.from_list(rows)
    probes = ProbeSet.from_hf(ds)
    assert list(probes) == list(ProbeSet.from_records(rows))
    assert [p.meta for p in probes] == [{"src": "web"}, {}]
    assert [p.category for p in probes] == ["c", "all"]
    assert ProbeSet.from_hf([MC, GEN], category="mine").categories == ["mine"]


def test_explicit_column_mapping_with_callable():
    rows = [
        {"uid": "u1", "prompt": "Pick.", "options": ["x", "y", "z"], "gold": "z", "topic": "t1"},
        {"uid": "u2", "prompt": "Pick again.", "options": ["x", "y"], "gold": "x", "topic": "t2"},
    ]
    columns = {
        "id": "uid",
        "question": "prompt",
        "choices": "options",
        "category": "topic",
        "answer": lambda r: r["options"].index(r["gold"]),
    }
    probes = ProbeSet.from_hf(rows, columns=columns)
    assert probes[0] == Probe(id="u1", question="Pick.", choices=("x", "y", "z"), answer=2, category="t1")
    assert probes.ids == ["u1", "u2"] and probes[1].answer == 0

    no_id = ProbeSet.from_hf(rows, columns={"question": "prompt", "answer": "gold"})
    assert no_id.ids == ["0", "1"] and no_id[0].answer == "z"


def test_column_mapping_problems_are_row_errors():
    rows = [{"prompt": "p", "gold": "a"}, {"text": "p", "gold": "b"}, {"prompt": "p"}]
    with pytest.raises(ProbeError) as info:
        ProbeSet.from_hf(rows, columns={"question": "prompt", "answer": lambda r: r["gold"]})
    assert places(info.value) == [("<dataset>", 1, "prompt"), ("<dataset>", 2, "answer")]
    missing, raised = info.value.errors
    assert "text, gold" in missing.message and "KeyError" in raised.message  # the columns it has; what was raised


def test_from_hf_argument_errors():
    with pytest.raises(ValueError, match="preset=.*columns="):
        ProbeSet.from_hf([MMLU_ROW], "mmlu", columns={"question": "question"})
    with pytest.raises(ValueError, match="'mmul'"):
        ProbeSet.from_hf([MMLU_ROW], "mmul")
    with pytest.raises(ValueError, match="'prompt'"):
        ProbeSet.from_hf([MMLU_ROW], columns={"prompt": "question"})
    with pytest.raises(TypeError, match="'test'"):  # a dataset dict: the split it could take
        ProbeSet.from_hf({"test": [MMLU_ROW]}, "mmlu")


# -- subset and sample -------------------------------------------------------------------------------


def make_set(counts: dict[str, int]) -> ProbeSet:
    records = [
        {"id": f"{cat}{i}", "question": "q", "answer": "a", "category": cat}
        for cat, n in counts.items()
        for i in range(n)
    ]
    # interleave categories so "original order" is not the same as "grouped by category"
    records.sort(key=lambda r: (int(r["id"].lstrip("abcdefghijklmnopqrstuvwxyz")), r["category"]))
    return ProbeSet.from_records(records, source="made")


def test_subset_by_ids_and_predicate_keeps_order():
    probes = make_set({"a": 3, "b": 3})
    assert probes.subset(["b2", "a0", "a2"]).ids == ["a0", "a2", "b2"]
    assert probes.subset(lambda p: p.category == "b").ids == ["b0", "b1", "b2"]
    assert probes.subset("a1").ids == ["a1"]
    with pytest.raises(KeyError, match="'zz'"):
        probes.subset(["a0", "zz"])


def test_sample_is_deterministic_ordered_and_seed_dependent():
    probes = make_set({"a": 30, "b": 30})
    first = probes.sample(10, seed=3)
    assert first.ids == probes.sample(10, seed=3).ids
    order = {pid: i for i, pid in enumerate(probes.ids)}
    assert [order[i] for i in first.ids] == sorted(order[i] for i in first.ids)
    assert len({tuple(probes.sample(10, seed=s).ids) for s in range(5)}) > 1
    assert len(probes.sample(7, stratify=False)) == 7


@pytest.mark.parametrize(
    "counts, n, expected",
    [
        ({"a": 60, "b": 30, "c": 10}, 10, {"a": 6, "b": 3, "c": 1}),
        ({"a": 50, "b": 30, "c": 20}, 7, {"a": 4, "b": 2, "c": 1}),  # quotas 3.5, 2.1, 1.4
        ({"a": 97, "b": 2, "c": 1}, 3, {"a": 1, "b": 1, "c": 1}),  # every category gets one
    ],
)
def test_sample_stratified_allocation(counts, n, expected):
    sample = make_set(counts).sample(n, seed=0)
    assert Counter(p.category for p in sample) == expected


def test_sample_bounds():
    probes = make_set({"a": 3})
    assert probes.sample(3).ids == probes.ids
    with pytest.raises(ValueError, match=r"\b4\b"):
        probes.sample(4)


# -- saving and fingerprints --------------------------------------------------------------------------


def test_jsonl_round_trip_keeps_probes_meta_and_fingerprint(tmp_path):
    records = [MC, {**GEN, "question": "Ünïcode \u2028 question?", "tags": ["x"], "n": 1}]
    probes = ProbeSet.from_records(records)
    path = probes.to_jsonl(tmp_path / "sub" / "out.jsonl")
    assert "Ünïcode" in path.read_text(encoding="utf-8")  # ensure_ascii=False
    again = ProbeSet.from_jsonl(path)
    assert list(again) == list(probes)
    assert [p.meta for p in again] == [{}, {"tags": ["x"], "n": 1}]
    assert again.to_records() == probes.to_records()
    assert ProbeSet.from_records(probes.to_records()).to_records() == probes.to_records()
    assert again.fingerprint() == probes.fingerprint()


def test_fingerprint_tracks_content_and_scoring_not_meta(tmp_path):
    path = write_lines(tmp_path, [json.dumps(MC), json.dumps(GEN)])
    fp = ProbeSet.from_jsonl(path).fingerprint()
    assert fp == ProbeSet.from_jsonl(path).fingerprint()
    assert fp == ProbeSet.from_records([{**MC, "note": "ignored"}, GEN]).fingerprint()
    assert fp != ProbeSet.from_records([{**MC, "answer": 0}, GEN]).fingerprint()
    assert fp != ProbeSet.from_records([MC, {**GEN, "extract": "exact"}]).fingerprint()
    assert fp != ProbeSet.from_jsonl(path).fingerprint({"max_new_tokens": 256})
    scored = ProbeSet.from_jsonl(path).fingerprint({"max_new_tokens": 256})
    assert scored != ProbeSet.from_jsonl(path).fingerprint({"max_new_tokens": 512})


# --- what a file cannot keep, rows that can never be right, bombs --------------------------------


@pytest.mark.parametrize(
    "row, field, token",  # token: the character or the index the error must name
    [
        ({"id": "a\x00", "question": "q", "answer": "1"}, "id", "U+0000"),
        ({"id": "a\tb", "question": "q", "answer": "1"}, "id", "U+0009"),
        ({"id": "a", "category": "x\ny", "question": "q", "answer": "1"}, "category", "U+000A"),
        ({"id": "a", "question": "q\x07", "answer": "1"}, "question", "U+0007"),
        ({"id": "a", "question": "q", "answer": "1\x1b"}, "answer", "U+001B"),
        ({"id": "a", "question": "q", "choices": ["x", "y\x00"], "answer": 0}, "choices", "index 1"),
        ({"id": "a\udc80", "question": "q", "answer": "1"}, "id", "U+DC80"),
        ({"id": "a", "question": "q\ud800", "answer": "1"}, "question", "U+D800"),
        ({"id": "a", "question": "q", "choices": ["x", "y", "x"], "answer": 2}, "choices", "index 2"),
        ({"id": "a", "question": "q", "answer": "about six", "extract": "number"}, "answer", "'about six'"),
        ({"id": "a", "question": "q", "answer": "B or C", "extract": "letter"}, "answer", "'B or C'"),
    ],
)
def test_rows_a_file_cannot_keep_or_that_can_never_be_right_are_refused(row, field, token):
    err = record_error([row])
    assert places(err) == [("<records>", 1, field)] and token in err.errors[0].message


def test_layout_in_prompts_and_the_usual_answers_stay_fine():
    probes = ProbeSet.from_records(
        [
            {"id": "a", "question": "Q:\n\tfirst\r\nA:", "answer": "1,234.5", "extract": "number"},
            {"id": "b", "question": "q", "answer": "(c)", "extract": "letter"},
            {"id": "c", "question": "q", "answer": "-$3", "extract": "number"},
        ]
    )
    assert probes.ids == ["a", "b", "c"]


def test_a_surrogate_escape_in_a_file_is_named_by_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": "a", "question": "q", "answer": "1"}\n{"id": "b\\ud800", "question": "q", "answer": "1"}\n')
    with pytest.raises(ProbeError) as info:
        ProbeSet.from_jsonl(path)
    assert places(info.value) == [(str(path), 2, "id")]


def test_reading_stops_at_a_line_without_end(tmp_path):
    with pytest.raises(ProbeError) as info:
        ProbeSet.from_jsonl("/dev/zero")  # read without limit before
    assert places(info.value) == [("/dev/zero", 1, None)] and "16 MiB" in str(info.value)  # the limit


def test_a_huge_question_loads_with_one_warning(caplog):
    rows = [{"id": f"q{i}", "question": "x" * 200_000 + f" {i}?", "answer": "1"} for i in range(3)]
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        probes = ProbeSet.from_records(rows)
    assert len(probes) == 3
    (warned,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "3 question" in warned.getMessage()  # how many


# --- values strict JSON cannot hold, or a later step could not handle (refused at load) ----------

BIG = "1" + "0" * 5000  # Python refuses to convert more than 4300 digits to or from text


@pytest.mark.parametrize(
    "extra, field, token",  # token: the value the error must name
    [
        (f'"n": {BIG}', "n", "5001 digits"),
        (f'"n": [1, -{BIG}]', "n[1]", "5001 digits"),
        ('"score": NaN', "score", "NaN"),
        ('"meta": {"lo": -Infinity}', "meta.lo", "-Infinity"),
        ('"x": 1e999', "x", "1e999"),
        ('"note": "a\\ud800"', "note", "U+D800"),
        ('"tags": {"\\udfff": 1}', "tags.\udfff", "U+DFFF"),
        ('"deep": ' + "[" * 150 + "]" * 150, "deep" + "[0]" * 5, "100"),
    ],
)
def test_a_value_strict_json_cannot_hold_is_refused_naming_line_and_field(tmp_path, extra, field, token):
    good = '{"id": "a", "question": "q", "answer": "1"}'
    err, path = load_error(tmp_path, [good, '{"id": "b", "question": "q", "answer": "1", ' + extra + "}"])
    (problem,) = err.errors
    assert problem.source == path and problem.line == 2 and problem.key.startswith(field) and token in problem.message


def test_brackets_thousands_deep_are_refused_not_a_recursion_error(tmp_path):
    err, path = load_error(
        tmp_path, ['{"id": "b", "question": "q", "answer": "1", "n": ' + "[" * 5000 + "]" * 5000 + "}"]
    )
    assert places(err) == [(path, 1, None)]


@pytest.mark.parametrize(
    "extra, field, token",  # token: the value the error must name
    [
        ({"score": float("nan")}, "score", "nan"),
        ({"meta": {"hi": [0.5, float("inf")]}}, "meta.hi[1]", "inf"),
        ({"n": 10**5000}, "n", "640 digits"),
        ({"note": "\udc80"}, "note", "U+DC80"),
        ({"when": object()}, "when", "(object)"),
    ],
)
def test_a_record_value_strict_json_cannot_hold_is_refused_naming_the_field(extra, field, token):
    err = record_error([{"id": "a", "question": "q", "answer": "1", **extra}])
    assert places(err) == [("<records>", 1, field)] and token in err.errors[0].message


def test_a_record_with_a_key_that_is_not_a_string_is_refused():
    err = record_error([{"id": "a", "question": "q", "answer": "1", 3: "x"}])
    assert places(err) == [("<records>", 1, None)] and "key 3" in err.errors[0].message


def test_an_answer_no_number_could_reach_is_refused_at_load(tmp_path):
    # written out in full, this number has 10**18 digits: it used to fill memory at load
    err, path = load_error(tmp_path, [row(id="a", question="q", answer="1e999999999999999999", extract="number")])
    assert places(err) == [(path, 1, "answer")]


def test_probes_are_written_as_strict_json(tmp_path):
    # a probe built in code is not validated: its NaN must not reach the run's probes.jsonl
    probes = ProbeSet([Probe(id="a", question="q", answer="1", meta={"score": float("nan"), "n": [float("inf")]})])
    path = probes.to_jsonl(tmp_path / "probes.jsonl")
    refuse = {"parse_constant": lambda name: pytest.fail(f"{name} written into {path}")}
    assert json.loads(path.read_text(encoding="utf-8"), **refuse)["score"] is None
