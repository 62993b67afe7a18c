"""Answers: construction, compatibility checks, and JSON/npz persistence."""

from __future__ import annotations

import json
import math
import os
import re

import numpy as np
import pytest

from forgetwatch import Answers, AnswersMismatchError, ProbeSet
from forgetwatch.results.answers import AnswersFileError, chosen_text
from forgetwatch.sinks.tables import markdown, shown_answer

SCORING = {"normalize": "none", "max_new_tokens": 32, "batch_size": 8, "device": "cpu"}
SAMPLES = [
    dict(
        id="mc1",
        category="math",
        correct=True,
        predicted=1,
        choice_logprobs=[-2.5, -0.25, -4.0],
        gold_logprob=-0.25,
        n_choices=3,
    ),
    dict(
        id="mc2",
        category="history",
        correct=False,
        predicted=0,
        choice_logprobs=[-0.5, -1.5],
        gold_logprob=-1.5,
        n_choices=2,
    ),
    dict(
        id="gen1",
        category="math",
        correct=True,
        predicted="1234",
        output="Let's see…\n  1000 + 234 = 1234 ✓\n#### 1,234",
    ),
    dict(id="gen2", correct=False, predicted=None, output="Je ne sais pas — désolé 🤷\n"),
    dict(id="gen3", correct=False, predicted="", output=""),
]


def make(samples=SAMPLES, fingerprint="fp-1", scoring=SCORING) -> Answers:
    return Answers.from_samples(
        fingerprint, scoring, samples, model="org/model-7b", meta={"step": 100, "note": "ünïcode", "tags": ["a", "b"]}
    )


def assert_same(a: Answers, b: Answers) -> None:
    assert b.ids == a.ids
    np.testing.assert_array_equal(b.correct, a.correct)
    assert b.correct.dtype == bool
    assert b.predicted == a.predicted
    assert [type(p) for p in b.predicted] == [type(p) for p in a.predicted]
    assert len(b.choice_logprobs) == len(a.choice_logprobs)
    for x, y in zip(a.choice_logprobs, b.choice_logprobs):
        np.testing.assert_array_equal(y, x)
    np.testing.assert_array_equal(b.gold_logprob, a.gold_logprob)  # NaN == NaN here
    np.testing.assert_array_equal(b.n_choices, a.n_choices)
    assert b.categories == a.categories
    assert b.outputs == a.outputs
    assert b.probe_fingerprint == a.probe_fingerprint
    assert b.scoring == a.scoring
    assert b.model == a.model
    assert b.meta == a.meta


def test_from_samples_defaults():
    a = make()
    assert len(a) == 5
    assert a.categories == ["math", "history", "math", "all", "all"]
    np.testing.assert_array_equal(a.n_choices, [3, 2, 0, 0, 0])
    assert math.isnan(a.gold_logprob[2]) and a.gold_logprob[0] == -0.25
    assert a.outputs[:2] == [None, None]
    assert a.choice_logprobs[2].shape == (0,)
    assert a.accuracy == pytest.approx(2 / 5)


@pytest.mark.parametrize("suffix", [".json", ".npz"])
def test_round_trip(tmp_path, suffix):
    a = make()
    path = a.save(tmp_path / f"answers{suffix}")
    assert path == tmp_path / f"answers{suffix}"
    assert_same(a, Answers.load(path))
    assert_same(a, Answers.load(str(path)))


@pytest.mark.parametrize("suffix", [".json", ".npz"])
def test_round_trip_empty(tmp_path, suffix):
    a = make(samples=[])
    b = Answers.load(a.save(tmp_path / f"empty{suffix}"))
    assert_same(a, b)
    assert len(b) == 0 and math.isnan(b.accuracy)


def test_npz_has_no_pickled_objects(tmp_path):
    path = make().save(tmp_path / "a.npz")
    with np.load(path, allow_pickle=False) as z:
        for name in z.files:
            assert z[name].dtype != object, name


def test_json_is_strict(tmp_path):
    path = make().save(tmp_path / "a.json")

    def refuse(constant):
        raise AssertionError(f"non-standard JSON constant {constant}")

    doc = json.loads(path.read_text(encoding="utf-8"), parse_constant=refuse)
    assert doc["samples"][2]["gold_logprob"] is None
    assert doc["samples"][2]["output"] == SAMPLES[2]["output"]


def test_unsupported_suffix(tmp_path):
    path = tmp_path / "answers.pkl"
    with pytest.raises(ValueError, match="answers.pkl"):
        make().save(path)
    assert not path.exists()


def test_load_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.json"):
        Answers.load(tmp_path / "nope.json")


def _truncated_npz(tmp_path):
    data = make().save(tmp_path / "good.npz").read_bytes()
    return data[: len(data) // 2]


def _header_changed(**changes):
    def build(tmp_path):
        doc = json.loads(make().save(tmp_path / "good.json").read_text(encoding="utf-8"))
        return json.dumps({**doc, **changes}).encode()

    return build


@pytest.mark.parametrize(
    "name, content",
    [
        ("list.json", lambda tmp: b"[1, 2, 3]"),
        ("object.json", lambda tmp: b'{"hello": "world"}'),
        ("broken.json", lambda tmp: b'{"format": "forgetwatch.answers", '),
        ("empty.json", lambda tmp: b""),
        ("binary.json", lambda tmp: b"\xff\xfe\x00garbage"),
        ("format.json", _header_changed(format="something.else")),
        ("version.json", _header_changed(version=99)),
        (
            "no_samples.json",
            lambda tmp: json.dumps({"format": "forgetwatch.answers", "version": 1, "probe_fingerprint": "x"}).encode(),
        ),
        ("truncated.npz", _truncated_npz),
        ("empty.npz", lambda tmp: b""),
        ("text.npz", lambda tmp: b"not an archive at all"),
    ],
)
def test_load_corrupt_or_foreign(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content(tmp_path))
    with pytest.raises(ValueError, match=name) as info:
        Answers.load(path)
    assert not isinstance(info.value, AnswersMismatchError)


def edit_npz(path, edit):
    """Rewrite the JSON document an npz answers file holds with ``edit(doc)``."""
    with np.load(path, allow_pickle=False) as z:
        doc = json.loads(z["answers"].tobytes())
    edit(doc)
    np.savez(path, answers=np.frombuffer(json.dumps(doc).encode(), dtype=np.uint8))


@pytest.mark.parametrize("field, value", [("format", "other"), ("version", 99)])
def test_load_npz_with_foreign_header(tmp_path, field, value):
    path = make().save(tmp_path / "a.npz")
    edit_npz(path, lambda doc: doc.update({field: value}))
    with pytest.raises(ValueError, match=f"a.npz.*{field}"):
        Answers.load(path)


def test_failed_save_keeps_old_file_and_leaves_no_temp_files(tmp_path, monkeypatch):
    path = make(fingerprint="old").save(tmp_path / "a.json")
    before = path.read_bytes()

    def disk_full(fd):  # the new file written into the temporary one, but not onto the disk
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="disk full"):
        make(fingerprint="new").save(path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["a.json"]


def test_failed_npz_save_keeps_old_file(tmp_path, monkeypatch):
    path = make(fingerprint="old").save(tmp_path / "a.npz")
    before = path.read_bytes()

    def fail(f, **arrays):
        f.write(b"PK\x03\x04partial")
        raise RuntimeError("interrupted")

    monkeypatch.setattr(np, "savez_compressed", fail)
    with pytest.raises(RuntimeError):
        make(fingerprint="new").save(path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["a.npz"]


def test_successful_saves_leave_no_temp_files(tmp_path):
    a = make()
    for _ in range(2):  # the second save replaces the first
        a.save(tmp_path / "a.json")
        a.save(tmp_path / "sub" / "a.npz")
    assert sorted(os.listdir(tmp_path)) == ["a.json", "sub"]
    assert os.listdir(tmp_path / "sub") == ["a.npz"]


def test_check_compatible_accepts_same_probes_and_options():
    make().check_compatible(make())
    make().check_compatible(make(scoring={**SCORING, "batch_size": 64, "device": "cuda:1"}))


@pytest.mark.parametrize(
    "other",
    [
        make(fingerprint="fp-2"),
        make(samples=[{**s, "id": s["id"] + "x"} for s in SAMPLES]),
        make(samples=SAMPLES[:-1]),
        make(scoring={**SCORING, "normalize": "chars"}),
        make(scoring={**SCORING, "max_new_tokens": 64}),
        make(scoring={k: v for k, v in SCORING.items() if k != "normalize"}),
    ],
    ids=["fingerprint", "ids", "fewer-ids", "normalize", "max_new_tokens", "missing-option"],
)
def test_check_compatible_rejects(other):
    with pytest.raises(AnswersMismatchError):
        make().check_compatible(other)
    with pytest.raises(AnswersMismatchError):
        other.check_compatible(make())


def test_load_checks_probe_set(tmp_path):
    records = [
        {"id": "q1", "question": "2 + 2 =", "choices": ["3", "4"], "answer": 1},
        {"id": "q2", "question": "Capital of France?", "answer": "Paris"},
    ]
    probes = ProbeSet.from_records(records)
    other = ProbeSet.from_records([{**records[0], "answer": 0}, records[1]])
    assert probes.fingerprint() != other.fingerprint()
    samples = [
        dict(id="q1", correct=True, predicted=1, choice_logprobs=[-3.0, -0.1], gold_logprob=-0.1, n_choices=2),
        dict(id="q2", correct=True, predicted="Paris", output="Paris"),
    ]
    for suffix in (".json", ".npz"):
        path = Answers.from_samples(probes.fingerprint(), {}, samples).save(tmp_path / f"a{suffix}")
        assert Answers.load(path, probes=probes).ids == ["q1", "q2"]
        with pytest.raises(AnswersMismatchError):
            Answers.load(path, probes=other)


@pytest.mark.parametrize(
    "field", ["correct", "predicted", "choice_logprobs", "gold_logprob", "n_choices", "categories", "outputs"]
)
def test_misaligned_fields_rejected(field):
    fields = dict(
        ids=["a", "b"],
        correct=[True, False],
        predicted=[0, 1],
        choice_logprobs=[[-1.0, -2.0], [-1.0, -2.0]],
        gold_logprob=[-1.0, -2.0],
        n_choices=[2, 2],
        categories=["all", "all"],
        outputs=[None, None],
        probe_fingerprint="fp",
    )
    Answers(**fields)  # aligned: fine
    fields[field] = fields[field][:1]
    with pytest.raises(ValueError, match=field):
        Answers(**fields)


def test_accuracy():
    assert math.isnan(make(samples=[]).accuracy)
    assert make(samples=SAMPLES[:1]).accuracy == 1.0
    assert make(samples=SAMPLES[1:2]).accuracy == 0.0


def test_infinite_logprobs_survive_json_and_npz(tmp_path):
    # a model that masks part of its vocabulary with -inf gives -inf log-probabilities
    answers = Answers.from_samples(
        "fp",
        {},
        [
            dict(id="a", correct=True, predicted=0, choice_logprobs=[-0.5, -math.inf], gold_logprob=-0.5, n_choices=2),
            dict(
                id="b",
                correct=False,
                predicted=0,
                choice_logprobs=[-1.0, -math.inf],
                gold_logprob=-math.inf,
                n_choices=2,
            ),
        ],
    )
    for suffix in (".json", ".npz"):
        loaded = Answers.load(answers.save(tmp_path / f"inf{suffix}"))
        assert loaded.gold_logprob.tolist() == [-0.5, -math.inf]
        assert [x.tolist() for x in loaded.choice_logprobs] == [[-0.5, -math.inf], [-1.0, -math.inf]]


def test_saved_files_have_ordinary_permissions(tmp_path):
    answers = Answers.from_samples(
        "fp", {}, [dict(id="a", correct=True, predicted=0, choice_logprobs=[0.0, -1.0], gold_logprob=0.0, n_choices=2)]
    )
    umask = os.umask(0)
    os.umask(umask)
    path = answers.save(tmp_path / "a.json")
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
    path.chmod(0o640)
    answers.save(path)
    assert path.stat().st_mode & 0o777 == 0o640  # overwriting keeps the file's permissions


# -- why answers cannot serve as a base ----------------------------------------------------------

IDS = [s["id"] for s in SAMPLES]


@pytest.mark.parametrize(
    "kwargs, reason",
    [
        (dict(fingerprint="fp-1", scoring=SCORING, ids=IDS, meta={"note": "ünïcode"}), None),
        (dict(fingerprint="fp-1", scoring={**SCORING, "batch_size": 1, "device": "cuda"}), None),
        (dict(fingerprint="fp-2", scoring=SCORING), "another probe set"),
        (dict(fingerprint="fp-1", ids=IDS + ["q3", "q4"]), "other probe ids (2 missing, e.g. 'q3')"),
        (dict(fingerprint="fp-1", ids=IDS[:-1]), "other probe ids (1 extra, e.g. 'gen3')"),
        (dict(fingerprint="fp-1", ids=IDS[::-1]), "other probe ids (the same ids in another order)"),
        (dict(fingerprint="fp-1", scoring={**SCORING, "normalize": "chars"}), "other scoring options ("),
        (dict(fingerprint="fp-1", meta={"model_key": "abc"}), "another model"),
        (dict(fingerprint="fp-1", meta={"weights_key": "abc"}), "other weights"),
    ],
)
def test_mismatch_says_why(kwargs, reason):
    got = make().mismatch(**kwargs)
    if reason is None:
        assert got is None
    else:
        assert got.startswith(reason)


def _probe_set(n):
    return ProbeSet.from_records(
        [{"id": f"q{i}", "question": f"{i} + 1 =", "choices": [str(i), str(i + 1)], "answer": 1} for i in range(n)]
    )


def _answers_for(probes, ids):
    return Answers.from_samples(
        probes.fingerprint(),
        SCORING,
        [
            dict(id=i, correct=True, predicted=1, choice_logprobs=[-2.0, -0.1], gold_logprob=-0.1, n_choices=2)
            for i in ids
        ],
    )


@pytest.mark.parametrize("suffix", [".json", ".npz"])
@pytest.mark.parametrize(
    "change, reason",  # reason: what the error must say of the ids
    [
        (lambda ids: ids[:3] + ids[13:], "10 missing.*'q3'"),  # how many, and one of them
        (lambda ids: ids[::-1], "order"),
    ],
)
def test_base_file_is_checked_by_its_ids(tmp_path, suffix, change, reason):
    # the header's fingerprint matches, but probes were deleted or reordered: this passed
    # start-up and crashed training at the first evaluation
    probes = _probe_set(20)
    path = _answers_for(probes, change(probes.ids)).save(tmp_path / f"base{suffix}")
    with pytest.raises(AnswersMismatchError, match=reason):
        Answers.load(path, probes=probes)
    assert Answers.load(_answers_for(probes, probes.ids).save(tmp_path / f"ok{suffix}"), probes=probes)


# -- checksum: a hand-edited file is refused ---------------------------------------------------


def test_edited_json_is_refused(tmp_path):
    path = make().save(tmp_path / "a.json")
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert len(doc["checksum"]) == 16
    doc["samples"][0]["correct"] = False  # a "fix" by hand
    path.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(AnswersFileError, match=re.escape(str(path))):
        Answers.load(path)
    del doc["samples"][1:3]  # probes deleted by hand
    path.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(AnswersFileError, match=re.escape(str(path))):
        Answers.load(path)


def test_reformatted_json_still_loads(tmp_path):
    path = make().save(tmp_path / "a.json")
    path.write_text(json.dumps(json.loads(path.read_text(encoding="utf-8")), indent=2), encoding="utf-8")
    assert_same(make(), Answers.load(path))


def test_edited_npz_is_refused(tmp_path):
    path = make().save(tmp_path / "a.npz")
    edit_npz(path, lambda doc: doc["samples"][0].update(correct=False))
    with pytest.raises(AnswersFileError, match=re.escape(str(path))):
        Answers.load(path)


# -- npz text as UTF-8 ---------------------------------------------------------------------------


def test_npz_text_is_utf8_not_fixed_width(tmp_path):
    # one 100k-character id among thousands: as fixed-width unicode every id took 400 kB
    # (20k probes took 7.9 GB); as UTF-8 each costs its own length
    odd = ["trailing space  ", "tab\t", " lead", "ünïcödé 🤷", "nul\x00", "", "q\r\n"]
    ids = [f"q{i}" for i in range(3000)] + odd + ["x" * 100_000]
    samples = [
        dict(id=i, category=f"cät {i[-3:]} ", correct=True, predicted=f"ans {i[:5]} ", output=f"out {i[:10]}\n")
        for i in ids
    ]
    a = Answers.from_samples("fp", {}, samples)
    path = a.save(tmp_path / "big.npz")
    assert path.stat().st_size < 300_000
    with np.load(path, allow_pickle=False) as z:
        assert sum(z[k].nbytes for k in z.files) < 2_000_000  # in memory too, not only compressed
    b = Answers.load(path)
    assert_same(a, b)
    assert b.ids[3000 : 3000 + len(odd)] == odd


def test_text_round_trips_exactly_in_both_formats(tmp_path):
    odd = ["trailing space  ", "tab\t", "ünïcödé 🤷", "nul\x00", "", "\r"]
    a = Answers.from_samples(
        "fp", {}, [dict(id=t + str(i), category=t, correct=False, predicted=t, output=t) for i, t in enumerate(odd)]
    )
    for suffix in (".json", ".npz"):
        assert_same(a, Answers.load(a.save(tmp_path / f"odd{suffix}")))


# -- damaged files say so ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "write",
    [
        lambda p: np.savez(p, header=np.array("{}"), ids=np.array(["a", 1], dtype=object)),
        lambda p: p.write_bytes(b"\x80\x04K\x01."),
    ],
    ids=["object-array", "pickle"],  # a pickle (of 1), named .npz: read as a zip, never unpickled
)
def test_pickled_content_is_damaged_never_allow_pickle_advice(tmp_path, write):
    path = tmp_path / "a.npz"
    write(path)
    with pytest.raises(AnswersFileError) as info:
        Answers.load(path)
    message = str(info.value)
    assert str(path) in message
    assert "allow_pickle" not in message and "unsafely" not in message  # never the advice to unpickle


def test_damaged_snapshot_says_damaged_and_what_to_do(tmp_path):
    from forgetwatch.store import SNAPSHOT
    from forgetwatch.store.read import read_snapshot

    assert read_snapshot(tmp_path) is None  # none: not an error
    data = make().save(tmp_path / SNAPSHOT).read_bytes()
    (tmp_path / SNAPSHOT).write_bytes(data[: len(data) // 2])
    with pytest.raises(AnswersFileError) as info:
        read_snapshot(tmp_path)
    message = str(info.value)
    assert message.startswith(f"{tmp_path / SNAPSHOT}: damaged")
    assert "delete it" in message and "base=" in message
    assert "not found" not in message


def test_damaged_file_error_does_not_chain_numpys_message(tmp_path):
    path = tmp_path / "a.npz"
    np.savez(path, header=np.array("{}"), ids=np.array(["a", 1], dtype=object))
    with pytest.raises(AnswersFileError) as info:
        Answers.load(path)
    assert info.value.__cause__ is None and info.value.__suppress_context__  # a traceback shows no "allow_pickle"


def test_the_answer_shown_is_the_chosen_choice_or_the_output():
    assert chosen_text(1, ["Paris", "Rome"]) == "Rome"
    assert [chosen_text(p, ["Paris", "Rome"]) for p in (None, True, 2, -1)] == [None] * 4
    samples = [dict(id="q1", correct=False, predicted=1, n_choices=2), dict(id="q2", correct=True, output="Lyon")]
    a = Answers.from_samples("fp", {}, samples)
    assert shown_answer(a, 0, ["Paris", "Lyon"]) == "Lyon" and shown_answer(a, 1, None) == "Lyon"


def test_a_markdown_table_keeps_its_cells_on_one_row():
    assert markdown(["a", "b"], [[1, "x|y\nz"], [None, ""]]).splitlines() == [
        "| a | b |",
        "|---|---|",
        "| 1 | x\\|y z |",
        "|  |  |",
    ]
