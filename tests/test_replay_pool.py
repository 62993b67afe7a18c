"""ReplayPool: rows validated like probe files, and never holding a probe's question."""

from __future__ import annotations

import json
import random
import unicodedata

import pytest

from forgetwatch import ProbeSet, ReplayPool, ReplayPoolError
from forgetwatch.config import ConfigError
from forgetwatch.replay.pool import Answering


def write(path, lines):
    path.write_text(
        "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines), encoding="utf-8"
    )
    return path


def places(err: ReplayPoolError) -> list[tuple]:
    """Where each of an error's problems is: (line, field)."""
    return [(e.line, e.key) for e in err.errors]


def names_both(err: ValueError, row_id: str, probe_id: str) -> bool:
    """Whether the leak error names the row and the probe whose question it holds."""
    return f"'{row_id}'" in str(err) and f"'{probe_id}'" in str(err)


def test_a_pool_file_loads_text_and_chats(tmp_path):
    path = write(
        tmp_path / "pool.jsonl",
        [
            {"id": "r1", "text": "Zeta lies north of Vo.", "category": "capitals"},
            "",
            {"id": "r2", "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]},
        ],
    )
    pool = ReplayPool.from_jsonl(path)
    assert [r.id for r in pool] == ["r1", "r2"] and pool.categories == ["all", "capitals"]
    assert pool[1].plain_text == "Hi\nHello"


def test_every_bad_row_is_named_by_file_line_and_field(tmp_path):
    path = write(
        tmp_path / "pool.jsonl",
        [
            {"id": "r1", "text": "fine"},
            {"id": "r2"},  # neither text nor messages
            {"id": "r3", "text": "a", "messages": [{"role": "user", "content": "b"}]},  # both
            {"id": 4, "text": "x"},  # id not a string
            {"id": "r5", "messages": [{"role": "bot", "content": "?"}]},  # unknown role
            {"id": "r1", "text": "again"},  # repeated id
            "{not json",
            {"id": "r8", "text": "x", "categry": "a"},  # unknown field
            {"id": "r9", "text": "   "},  # empty text
        ],
    )
    with pytest.raises(ReplayPoolError) as info:
        ReplayPool.from_jsonl(path)
    assert places(info.value) == [
        (2, None),
        (3, None),
        (4, "id"),
        (5, "messages"),
        (6, "id"),
        (7, None),
        (8, None),
        (9, "text"),
    ]
    assert {e.source for e in info.value.errors} == {str(path)}
    assert "line 1" in info.value.errors[4].message  # the repeated id's first use


def test_from_records_and_from_hf(tmp_path):
    datasets = pytest.importorskip("datasets")
    pool = ReplayPool.from_records([{"id": "a", "text": "t"}])
    assert pool[0].text == "t"
    with pytest.raises(ReplayPoolError) as info:
        ReplayPool.from_records([{"id": "a", "text": 3}])
    assert places(info.value) == [(1, "text")] and info.value.unit == "record"
    data = datasets.Dataset.from_dict({"body": ["one", "two"], "key": ["k1", "k2"]})
    pool = ReplayPool.from_hf(data, text="body", id="key", category="wiki")
    assert [(r.id, r.text, r.category) for r in pool] == [("k1", "one", "wiki"), ("k2", "two", "wiki")]
    with pytest.raises(ValueError, match="text=.*messages="):
        ReplayPool.from_hf(data)


def test_chat_rows_are_rendered_with_the_chat_template(toy):
    tokenizer = toy.world.tokenizer()
    tokenizer.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    row = ReplayPool.from_records([{"id": "c", "messages": [{"role": "user", "content": "Hi"}]}])[0]
    assert row.render(tokenizer) == "<user>Hi\n"
    tokenizer.chat_template = None
    with pytest.raises(ValueError, match="chat template"):
        row.render(tokenizer)


def plain_overlaps(rows, probes):
    """Brute force: every (row, probe) whose text holds the question as words, case aside."""

    def norm(text):
        return " " + " ".join(text.lower().split()) + " "

    return [(r["id"], p["id"]) for r in rows for p in probes if norm(p["question"]) in norm(r["text"])]


def test_the_overlap_check_equals_a_brute_force_search():
    rng = random.Random(0)
    vocab = [f"w{i}" for i in range(40)]
    probes = [
        {"id": f"p{i}", "question": " ".join(rng.choice(vocab) for _ in range(rng.randint(2, 14))), "answer": "x"}
        for i in range(60)
    ]
    rows = []
    for i in range(300):
        words = [rng.choice(vocab) for _ in range(rng.randint(5, 60))]
        if i % 7 == 0:  # plant a probe's question, in other case and spacing
            p = rng.choice(probes)["question"].upper().split()
            at = rng.randint(0, len(words))
            words[at:at] = p
        rows.append({"id": f"r{i}", "text": "  ".join(words) if i % 2 else "\n".join(words)})
    expected = plain_overlaps(rows, probes)
    assert len(expected) >= 40
    pool, probe_set = ReplayPool.from_records(rows), ProbeSet.from_records(probes)
    with pytest.raises(ValueError) as info:
        pool.check_disjoint(probe_set)
    assert all(names_both(info.value, row_id, probe_id) for row_id, probe_id in expected[:20])
    from forgetwatch.replay.pool import overlaps

    assert sorted(overlaps(pool, probe_set)) == sorted(expected)
    clean = ReplayPool.from_records([r for r in rows if r["id"] not in {x for x, _ in expected}])
    clean.check_disjoint(probe_set)  # nothing left to refuse


def test_a_word_inside_another_is_not_an_overlap():
    pool = ReplayPool.from_records([{"id": "r", "text": "The capital of Zetaland is Vo"}])
    pool.check_disjoint(ProbeSet.from_records([{"id": "p", "question": "capital of Zeta", "answer": "Vo"}]))


QUESTION = "Q: Which river flows through Zéta, the old capital? A:"
LATIN_TO_CYRILLIC = str.maketrans("aceopxy", "асеорху")


@pytest.mark.parametrize(
    "form",
    [
        lambda q: unicodedata.normalize("NFD", q),  # decomposed accents
        lambda q: "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in q),  # full-width letters
        lambda q: q.translate(LATIN_TO_CYRILLIC),  # Cyrillic look-alikes
        lambda q: q.replace("iv", "i\u200bv").replace("cap", "ca\u00adp").replace("old", "o\u2060ld"),  # invisible
        lambda q: q.replace(": ", ":").replace(", ", ",").replace("? ", "?"),  # punctuation glued to words
        lambda q: q.upper().replace("RIVER", "R\uff29VER"),  # case and a full-width capital
    ],
    ids=["nfd", "fullwidth", "cyrillic", "zero-width-and-soft-hyphen", "glued-punctuation", "upper"],
)
def test_the_leak_check_sees_the_question_in_any_written_form(form):
    probes = ProbeSet.from_records([{"id": "p", "question": QUESTION, "answer": "Vo"}])
    hidden = form(QUESTION)
    assert hidden.split() != QUESTION.split()
    pool = ReplayPool.from_records(
        [{"id": "ok", "text": "Rivers: the Vo flows north."}, {"id": "r", "text": f"Notes.{hidden} The Vo."}]
    )
    with pytest.raises(ValueError) as info:
        pool.check_disjoint(probes)
    assert names_both(info.value, "r", "p") and "'ok'" not in str(info.value)


def test_folding_keeps_words_apart_that_differ():
    from forgetwatch.replay.overlap import normalized

    assert normalized("Q:The ｃａｐｉｔａｌ of Zet\u0430\u00ad is: Vo") == [
        "q",
        "the",
        "capital",
        "of",
        "zeta",
        "is",
        "vo",
    ]
    assert normalized("café") == normalized("cafe\u0301") != normalized("cafe")
    assert normalized("Straße") == normalized("STRASSE")
    # a question in another script still matches itself in any case
    assert normalized("Какая РЕКА течёт через Зету?") == normalized("какая река ТЕЧЁТ через зету")
    pool = ReplayPool.from_records([{"id": "r", "text": "The capital of Zetaland is Vo; cafe au lait."}])
    pool.check_disjoint(
        ProbeSet.from_records(
            [
                {"id": "p1", "question": "capital of Zeta", "answer": "Vo"},
                {"id": "p2", "question": "café au lait", "answer": "x"},
            ]
        )
    )


def test_lone_surrogates_and_values_that_cannot_be_kept_are_refused_at_load(tmp_path):
    path = tmp_path / "pool.jsonl"
    path.write_text(
        "\n".join(
            [
                '{"id": "r\\ud800", "text": "fine"}',
                '{"id": "r2", "text": "half a pair \\udfff"}',
                '{"id": "r3", "messages": [{"role": "user", "content": "\\ud83d"}]}',
                '{"id": "r4", "messages": [{"role": "user", "content": "hi", "name": "\\udc00"}]}',
                '{"id": "r5", "text": "ok", "category": "\\ud800"}',
                '{"id": "r6\\u0000", "text": "ok"}',
                '{"id": "r7", "messages": [{"role": "user", "content": "hi", "meta": ' + "9" * 700 + "}]}",
                '{"id": "r8", "text": "fine"}',
            ]
        )
        + "\n",
        encoding="utf-8",
    )
    with pytest.raises(ReplayPoolError) as info:
        ReplayPool.from_jsonl(path)
    assert places(info.value) == [
        (1, "id"),
        (2, "text"),
        (3, "messages[0].content"),
        (4, "messages[0].name"),
        (5, "category"),
        (6, "id"),
        (7, "messages[0].meta"),
    ]
    assert "U+D800" in info.value.errors[0].message and "700 digits" in info.value.errors[6].message  # the values
    with pytest.raises(ReplayPoolError) as info:
        ReplayPool.from_records([{"id": "a", "messages": [{"role": "user", "content": "c", "x": [float("nan")]}]}])
    assert places(info.value) == [(1, "messages[0].x[0]")]


# -- prompt rows: answered by the base model when training begins ------------------------------


def test_from_prompts_takes_strings_dicts_and_a_mapping_of_categories():
    pool = ReplayPool.from_prompts(["Name a river.", "What is 2 + 3?"])
    assert [(r.id, r.prompt, r.category, r.text) for r in pool] == [
        ("p0", "Name a river.", "all", None),
        ("p1", "What is 2 + 3?", "all", None),
    ]
    assert pool.answering == Answering(max_new_tokens=64, chat_template=False, stop=())
    assert pool[0].plain_text == "Name a river." and pool.source == "<prompts>"
    pool = ReplayPool.from_prompts(
        ["Name a river.", {"id": "sum", "prompt": "What is 2 + 3?", "category": "math"}, {"prompt": "Hi."}],
        category="geo",
        max_new_tokens=16,
        chat_template=True,
        stop=["\n"],
    )
    assert [(r.id, r.category) for r in pool] == [("p0", "geo"), ("sum", "math"), ("p2", "geo")]
    assert pool.answering.as_dict() == {"max_new_tokens": 16, "chat_template": True, "stop": ["\n"]}
    pool = ReplayPool.from_prompts({"geo": ["Name a river.", "Name a lake."], "math": ("What is 2 + 3?",)})
    assert [(r.id, r.category) for r in pool] == [("p0", "geo"), ("p1", "geo"), ("p2", "math")]
    assert pool.categories == ["geo", "math"] and pool[1:].answering == pool.answering
    # what a prompt row trains on is not known before the base model answers it
    with pytest.raises(ValueError, match="'p0'"):
        pool[0].render(None)
    # a pool without prompt rows has no answering settings
    assert ReplayPool.from_records([{"id": "r", "text": "t"}], max_new_tokens=8).answering is None


def test_from_prompts_refuses_what_is_no_list_of_prompts():
    with pytest.raises(TypeError):
        ReplayPool.from_prompts("Name a river.")
    with pytest.raises(TypeError, match="'geo'"):
        ReplayPool.from_prompts({"geo": "Name a river."})
    with pytest.raises(ValueError, match="category="):
        ReplayPool.from_prompts({"geo": ["Name a river."]}, category="geo")
    with pytest.raises(ValueError, match="category="):
        ReplayPool.from_prompts(["Name a river."], category=" ")
    with pytest.raises(ReplayPoolError) as info:
        ReplayPool.from_prompts([])
    assert places(info.value) == [(None, None)] and info.value.errors[0].source == "<prompts>"
    with pytest.raises(ReplayPoolError) as info:
        ReplayPool.from_prompts(
            [
                "fine",
                {"id": "p0", "prompt": "again"},  # the id the first one was given
                {"id": "x", "text": "trained on as written"},  # no prompt
                7,
                "  ",
                {"prompt": "ok", "category": ""},
            ]
        )
    assert places(info.value) == [(1, "id"), (2, None), (2, None), (3, None), (4, "prompt"), (5, "category")]
    assert info.value.unit == "prompt" and {e.source for e in info.value.errors} == {"<prompts>"}
    first_use, no_prompt, unknown, _, _, _ = info.value.errors
    assert "prompt 0" in first_use.message and "'text'" in unknown.message  # the first use; the unknown field


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("max_new_tokens", 0),
        ("max_new_tokens", 5000),
        ("max_new_tokens", 8.0),
        ("chat_template", "yes"),
        ("stop", [""]),
        ("stop", 3),
    ],
)
def test_bad_answering_settings_are_named(setting, value):
    for build in (
        lambda: ReplayPool.from_prompts(["Name a river."], **{setting: value}),
        lambda: ReplayPool.from_records([{"id": "r", "text": "t"}], **{setting: value}),  # with or without prompts
    ):
        with pytest.raises(ConfigError) as info:
            build()
        assert [(p.source, p.key) for p in info.value.errors] == [("Answering", setting)]


def test_a_prompt_holding_a_probe_question_is_refused_naming_both():
    probes = ProbeSet.from_records(
        [
            {"id": "cap/zeta", "question": "The capital of Zeta is", "answer": "Vo"},
            {"id": "x", "question": "Q", "answer": "a"},
        ]
    )
    pool = ReplayPool.from_prompts({"geo": ["Name a river of Zeta.", "Complete: the CAPITAL of zeta is"]})
    with pytest.raises(ValueError) as info:
        pool.check_disjoint(probes)
    assert names_both(info.value, "p1", "cap/zeta") and "'p0'" not in str(info.value)
    ReplayPool.from_prompts(["Name a river of Zeta."]).check_disjoint(probes)


def test_a_pool_file_holds_prompt_rows_among_the_others(tmp_path):
    path = write(
        tmp_path / "pool.jsonl",
        [
            {"id": "r1", "text": "Zeta lies north of Vo.", "category": "capitals"},
            {"id": "q1", "prompt": "Name a river of Zeta.", "category": "rivers"},
            {"id": "c1", "messages": [{"role": "user", "content": "Hi"}]},  # a chat is trained on as written
        ],
    )
    pool = ReplayPool.from_jsonl(path, max_new_tokens=24, stop=["\n"])
    assert [(r.id, r.prompt is not None) for r in pool] == [("r1", False), ("q1", True), ("c1", False)]
    assert pool.answering == Answering(max_new_tokens=24, stop=["\n"])
    bad = write(
        tmp_path / "bad.jsonl",
        [
            {"id": "q1", "prompt": "fine"},
            {"id": "q2", "prompt": "a", "text": "b"},  # two things to train on
            {"id": "q3", "prompt": ["a list"]},
            {"id": "q4", "prompt": "   "},
            {"id": "q5", "prompt": "ok", "answer": "no"},  # unknown field
            {"id": "q6", "prompt": "bell \u0007"},  # cannot be kept
            {"id": "q7"},
        ],
    )
    with pytest.raises(ReplayPoolError) as info:
        ReplayPool.from_jsonl(bad)
    assert places(info.value) == [(2, None), (3, "prompt"), (4, "prompt"), (5, None), (6, "prompt"), (7, None)]
    two, _, _, unknown, _, _ = info.value.errors
    assert "'text' and 'prompt'" in two.message and "'answer'" in unknown.message  # the fields it found


def test_the_fingerprint_covers_prompts_and_how_they_are_answered():
    def fingerprint(**settings):
        return ReplayPool.from_prompts(["Name a river."], **settings).fingerprint()

    base = fingerprint()
    assert fingerprint() == base
    assert len({base, fingerprint(max_new_tokens=32), fingerprint(chat_template=True), fingerprint(stop=["\n"])}) == 4
    assert ReplayPool.from_records([{"id": "p0", "text": "Name a river."}]).fingerprint() != base
    # a pool of text rows hashes as before prompt rows existed, whatever answering settings it is given
    assert ReplayPool.from_records([{"id": "r1", "text": "t"}], max_new_tokens=8).fingerprint() == "1a77ffe96941ceb7"


def test_a_prompt_s_model_input_as_token_ids():
    from forgetwatch.toy import ToyWorld

    tokenizer = ToyWorld(seed=0).tokenizer()
    pool = ReplayPool.from_records(
        [{"id": "r", "text": "Zeta lies north."}, {"id": "q", "prompt": "The capital of Zeta is"}]
    )
    ids = tokenizer("The capital of Zeta is")["input_ids"]
    assert ids[0] == tokenizer.bos_token_id
    assert pool.prompt_ids(tokenizer) == {"q": ids}
    # as a chat: the prompt is a user turn, followed by the generation prompt; BOS once
    chat = ReplayPool.from_records([{"id": "q", "prompt": "Hi"}], chat_template=True)
    with pytest.raises(ValueError, match=r"'q'.*chat template"):
        chat.prompt_ids(tokenizer)
    tokenizer.chat_template = (
        "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    ids = chat.prompt_ids(tokenizer)["q"]
    assert ids == tokenizer("<s><user>Hi\n<assistant>", add_special_tokens=False)["input_ids"]
    assert ids.count(tokenizer.bos_token_id) == 1


def test_from_hf_reads_a_column_of_prompts():
    datasets = pytest.importorskip("datasets")
    data = datasets.Dataset.from_dict({"instruction": ["Name a river.", "Add 2 and 3."]})
    pool = ReplayPool.from_hf(data, prompt="instruction", category="mixed", max_new_tokens=12)
    assert [(r.id, r.prompt, r.category) for r in pool] == [
        ("0", "Name a river.", "mixed"),
        ("1", "Add 2 and 3.", "mixed"),
    ]
    assert pool.answering.max_new_tokens == 12
    with pytest.raises(ValueError, match="prompt="):
        ReplayPool.from_hf(data, text="instruction", prompt="instruction")
