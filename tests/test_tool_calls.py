"""Tool-call probes (CapTrack's H3) on a tiny chat model the test trains with a tool-aware template: the prompt, the
call read from the reply and the verdict equal a plain rendering, decoding and parsing loop; the parser reads the
usual formats; a malformed row is one error naming the file, line and field."""

from __future__ import annotations

import copy
import json
import shutil

import pytest
from test_multiturn import TEMPLATE, greedy_by_hand
from test_probes import load_error

from forgetwatch import ProbeKind, ProbeSet, Scorer, Scoring, evaluate
from forgetwatch.cli import main
from forgetwatch.probes.tool_calls import calls_match, json_equal, parse_call
from forgetwatch.toy import TOOL_TEMPLATE, TOOLS


def rendered_by_hand(question):
    return f"<tools>{json.dumps(TOOLS, ensure_ascii=False)}</tools>\n<user>{question}\n<assistant>\n"


@pytest.fixture(scope="module")
def chat_model(toy):
    """A toy chat model taught to call get_capital for 16 countries (the other probes' countries it never saw)."""
    tokenizer, model = toy.world.tool_use(taught=16)
    return model, tokenizer


def probe_rows(toy):
    rows = toy.world.tool_probe_records(toy.world.countries[12:20])  # four taught, four not
    rows.append(
        {
            "id": "any-country",
            "question": "What is the capital of Vouzapu?",
            "tools": TOOLS,
            "answer": {"name": "get_capital", "arguments": {}},
            "arguments_match": "subset",
        }
    )
    return rows


def call_by_hand(text):
    """The first balanced {...} of the reply that loads as JSON with a name."""
    for start in [i for i, ch in enumerate(text) if ch == "{"]:
        depth = 0
        for end in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            if depth == 0:
                try:
                    value = json.loads(text[start : end + 1])
                except ValueError:
                    break
                if isinstance(value, dict) and isinstance(value.get("name"), str):
                    return {"name": value["name"], "arguments": value.get("arguments", {})}
                break
    return None


@pytest.mark.slow
def test_calls_are_read_and_judged_as_a_plain_loop_does(toy, chat_model):
    model, tokenizer = chat_model
    rows = probe_rows(toy)
    probes = ProbeSet.from_records(rows)
    assert {p.kind for p in probes} == {ProbeKind.TOOL_CALL}
    answers = evaluate(model, tokenizer, probes, show_progress=False, scoring=Scoring(behaviour_max_new_tokens=40))
    encoded = Scorer(tokenizer, probes).encoded
    for i, row in enumerate(rows):
        question = row["messages"][0]["content"] if "messages" in row else row["question"]
        ids = tokenizer(rendered_by_hand(question))["input_ids"]
        assert list(encoded[i].prompt) == ids, row["id"]
        text = greedy_by_hand(model, tokenizer, ids, 40, stop="")
        assert answers.outputs[i] == text, row["id"]
        call = call_by_hand(text)
        expected = row["answer"]
        if row.get("arguments_match") == "subset":
            right = call is not None and call["name"] == expected["name"]
        else:
            right = call == expected
        assert answers.correct[i] == right, (row["id"], text)
        assert answers.predicted[i] == (None if call is None else json.dumps(call, sort_keys=True))
    assert 0 < answers.correct.sum() < len(rows)  # some calls right (taught), some not


def test_the_parser_reads_the_usual_formats():
    want = {"name": "f", "arguments": {"x": 1}}
    for text in (
        '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>',  # Hermes, Qwen
        '{"name": "f", "parameters": {"x": 1}}',  # Llama 3.1
        '[TOOL_CALLS] [{"name": "f", "arguments": {"x": 1}}]',  # Mistral
        'Sure.\n```json\n{"type": "function", "function": {"name": "f", "arguments": "{\\"x\\": 1}"}}\n```',  # OpenAI
        'I will call it: {"note": 1} then {"name": "f", "arguments": {"x": 1}}',
    ):
        assert parse_call(text) == want, text
    assert parse_call("no call here {not json}") is None and parse_call(None) is None


def test_arguments_match_as_json_values():
    expected = {"name": "f", "arguments": {"n": 1, "flag": True, "items": [1, 2]}}
    assert calls_match(expected, {"name": "f", "arguments": {"n": 1.0, "flag": True, "items": [1, 2]}})
    assert not calls_match(expected, {"name": "f", "arguments": {"n": 1, "flag": 1, "items": [1, 2]}})  # true is not 1
    assert not calls_match(expected, {"name": "f", "arguments": {"n": 1, "flag": True, "items": [2, 1]}})
    assert not calls_match(expected, {"name": "g", "arguments": expected["arguments"]})
    more = {"name": "f", "arguments": {**expected["arguments"], "extra": "x"}}
    assert not calls_match(expected, more) and calls_match(expected, more, "subset")
    assert json_equal({"a": [1, {"b": None}]}, {"a": [1.0, {"b": None}]}) and not json_equal("1", 1)


@pytest.mark.parametrize(
    "change, field, names",  # names: the values the error must name, if any
    [
        ({"tools": ["get_capital"]}, "tools[0]", ""),
        ({"tools": [{"type": "function", "function": {}}]}, "tools[0]", ""),
        ({"tools": []}, "tools", ""),
        ({"answer": {"arguments": {}}}, "answer.name", ""),
        ({"answer": {"name": "get_weather", "arguments": {}}}, "answer.name", "'get_weather'"),
        ({"answer": {"name": "get_capital", "arguments": "x"}}, "answer.arguments", ""),
        ({"answer": "get_capital"}, "answer", ""),
        ({"arguments_match": "loose"}, "arguments_match", "exact, subset"),  # the ones allowed
        ({"messages": [{"role": "assistant", "content": "hi"}]}, "messages[0].role", ""),
    ],
)
def test_a_malformed_tool_call_row_is_one_error_naming_the_line_and_field(toy, tmp_path, change, field, names):
    rows = probe_rows(toy)
    err, path = load_error(tmp_path, [json.dumps(rows[1]), json.dumps({**rows[0], **change})])
    messages = [e.message for e in err.errors if e[:3] == (path, 2, field)]  # beside what follows from it
    assert any(names in m for m in messages)


def test_a_tokenizer_without_a_chat_template_is_refused_before_any_model_work(toy):
    probes = ProbeSet.from_records(probe_rows(toy)[:1])
    with pytest.raises(ValueError, match="asks for a tool call .* this tokenizer has none"):
        Scorer(toy.tokenizer, probes).prepare(toy.base)


@pytest.fixture(scope="module")
def templated(toy):
    """The toy tokenizer with a chat template of the test's own (the session's tokenizer is left as it is)."""

    def tokenizer(template):
        copied = copy.deepcopy(toy.tokenizer)
        copied.chat_template = template
        return copied

    return tokenizer


RAISES = "{% if tools %}{{ raise_exception('tools are not supported') }}{% endif %}" + TEMPLATE


@pytest.mark.parametrize("template, field", [(TEMPLATE, "not in the prompt"), (RAISES, "tools are not supported")])
def test_a_template_that_cannot_show_the_tools_is_one_error_naming_the_probe(toy, templated, template, field):
    rows = probe_rows(toy)
    probes = ProbeSet.from_records([{"id": "plain", "question": "Hi", "check": {"max_words": 5}}, *rows[:2]], "mine")
    with pytest.raises(ValueError, match="^probe 'call/.*' of mine: ") as err:
        Scorer(templated(template), probes).prepare(toy.base)
    assert field in str(err.value)
    # the tool-aware template shows them: the prompt is the rendering with the tools
    tokenizer = templated(TOOL_TEMPLATE)
    prompt = Scorer(tokenizer, probes).prepare(toy.base)[0].encoded[1].prompt
    assert tokenizer.decode(prompt) == tokenizer.bos_token + rendered_by_hand(rows[0]["messages"][0]["content"])


def test_the_command_line_refuses_a_template_that_raises_with_exit_code_2(toy, templated, tmp_path, capsys):
    shutil.copytree(toy.base_dir, tmp_path / "model")
    templated(RAISES).save_pretrained(tmp_path / "model")
    ProbeSet.from_records(probe_rows(toy)[:1]).to_jsonl(tmp_path / "probes.jsonl")
    argv = ["evaluate", "--model", str(tmp_path / "model"), "--probes", str(tmp_path / "probes.jsonl")]
    assert main([*argv, "--out", str(tmp_path / "a.json"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "call/" in err and "tools are not supported" in err and "Traceback" not in err
