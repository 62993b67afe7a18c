"""Multi-turn probes (CapTrack's H4): a probe may give ``messages`` (earlier turns, ending with the user's) instead of a
question; it is built with the model's chat template and judged on the reply, as a plain rendering and decoding loop
would; a malformed conversation is one error naming the file, line and field."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from test_probes import load_error

from forgetwatch import ProbeSet, Scorer, Scoring, evaluate

TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"


@pytest.fixture(scope="module")
def chat(toy):
    """The toy tokenizer with a chat template of the test's own (the session's tokenizer is left as it is)."""
    tokenizer = copy.deepcopy(toy.tokenizer)
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def conversation_rows(toy):
    """Each country's capital asked after an earlier exchange about another country, and a behaviour probe."""
    rows = []
    for i, (c, other) in enumerate(zip(toy.world.known[:6], toy.world.known[1:7])):
        rows.append(
            {
                "id": f"talk-{i}",
                "messages": [
                    {"role": "system", "content": "Answer briefly."},
                    {"role": "user", "content": f"The capital of {other.name} is"},
                    {"role": "assistant", "content": other.capital},
                    {"role": "user", "content": f"The capital of {c.name} is"},
                ],
                "answer": c.capital,
                "category": "talk",
            }
        )
    rows.append({"id": "talk-check", "messages": [{"role": "user", "content": "Say hi"}], "check": {"max_words": 50}})
    return rows


def rendered_by_hand(messages):
    return "".join(f"<{m['role']}>{m['content']}\n" for m in messages) + "<assistant>"


def greedy_by_hand(model, tokenizer, ids, max_new_tokens, stop="\n"):
    ids, new = list(ids), []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            token = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            if token == tokenizer.eos_token_id:
                break
            ids.append(token)
            new.append(token)
            if stop and stop in tokenizer.decode(new, skip_special_tokens=True):
                break
    text = tokenizer.decode(new, skip_special_tokens=True)
    return text.split(stop)[0] if stop else text


@pytest.mark.slow
def test_a_conversation_is_rendered_by_the_chat_template_and_judged_on_the_reply(toy, chat):
    rows = conversation_rows(toy)
    probes = ProbeSet.from_records(rows)
    answers = evaluate(
        toy.base, chat, probes, show_progress=False, scoring=Scoring(max_new_tokens=6, behaviour_max_new_tokens=6)
    )
    encoded = Scorer(chat, probes).encoded
    for i, (row, probe) in enumerate(zip(rows, probes)):
        by_hand = chat(rendered_by_hand(row["messages"]))["input_ids"]
        assert list(encoded[i].prompt) == by_hand, probe.id
        assert probe.question == row["messages"][-1]["content"]
        stop = "" if "check" in row else "\n"
        assert answers.outputs[i] == greedy_by_hand(toy.base, chat, by_hand, 6, stop), probe.id
        if "answer" in row:  # judged on the reply
            assert answers.correct[i] == (answers.outputs[i].strip() == row["answer"]), probe.id
    assert ProbeSet.from_records(probes.to_records()).to_records() == probes.to_records()


def test_a_tokenizer_without_a_chat_template_is_refused_before_any_model_work(toy):
    probes = ProbeSet.from_records(conversation_rows(toy)[:1])
    with pytest.raises(ValueError, match="'talk-0' .* is a conversation .* this tokenizer has none"):
        Scorer(toy.tokenizer, probes).prepare(toy.base)


@pytest.mark.parametrize(
    "change, field, names",  # names: the values the error must name, if any
    [
        (
            {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
            "messages[1].role",
            "",
        ),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role", "system, user, assistant"),
        ({"messages": [{"role": "user", "content": ""}]}, "messages[0].content", ""),
        ({"messages": [{"role": "user", "text": "hi"}]}, "messages[0]", "'text'"),
        ({"messages": "hi"}, "messages", ""),
        ({"question": "The capital is"}, "messages", ""),
        ({"choices": ["a", "b"], "answer": 0}, "messages", "'choices'"),
    ],
)
def test_a_malformed_conversation_is_one_error_naming_the_line_and_field(toy, tmp_path, change, field, names):
    rows = conversation_rows(toy)
    err, path = load_error(tmp_path, [json.dumps(rows[1]), json.dumps({**rows[0], **change})])
    messages = [e.message for e in err.errors if e[:3] == (path, 2, field)]  # beside what follows from it
    assert any(names in m for m in messages)
