"""Whatever a model replies, it is judged (a verdict, never an exception), and a failure to score while training is
a warning: the run goes on and its other evaluations are logged."""

from __future__ import annotations

import copy
import json
import logging
import re

import numpy as np
import pytest
from trainers import CPU_QUIET

from forgetwatch import Answers, ProbeSet, Scoring, Watch
from forgetwatch.probes.tool_calls import MAX_CALL_DEPTH, MAX_SEARCHED, parse_call
from forgetwatch.scoring.kinds import SCORE, Measured, Rules
from forgetwatch.toy import TOOLS

CALL = '{"name": "get_capital", "arguments": {"country": "Zeta"}}'
HOSTILE = {
    "brackets": "[" * 1500,
    "many brackets": "[" * 100_000,
    "braces": '{"a": ' * 3000,
    "quoted brackets": '["' * 10_000,
    "argument of brackets": '{"name": "get_capital", "arguments": "' + "[" * 3000 + '"}',
    "long": "Answer: B " * 10_000,
    "replacement characters": "\ufffd" * 5000 + "\x00\x1b[2J",
    "unclosed": "[[]" * 7000,
}
ROWS = [
    {"id": "number", "question": "6 * 7 =", "answer": "42", "extract": "number"},
    {"id": "letter", "question": "Pick:", "answer": "B", "extract": "letter"},
    {"id": "line", "question": "Pick:", "answer": "B", "extract": "answer_line"},
    {"id": "exact", "question": "Say:", "answer": "yes", "extract": "exact"},
    {"id": "regex", "question": "Say:", "answer": "7", "extract": r"n=(\d+)"},
    *(
        {"id": f"check-{name}", "question": "Reply:", "check": {name: value}}
        for name, value in {
            "refuses": True,
            "max_words": 3,
            "min_words": 2,
            "max_sentences": 1,
            "regex": r"(a+)+$",
            "not_regex": r"\[",
            "contains": ["x"],
            "not_contains": ["["],
            "json": True,
            "starts_with": "{",
            "lowercase": True,
            "uppercase": True,
            "bullets": 2,
        }.items()
    ),
    {
        "id": "call",
        "messages": [{"role": "user", "content": "What is the capital of Zeta?"}],
        "tools": TOOLS,
        "answer": {"name": "get_capital", "arguments": {"country": "Zeta"}},
    },
]


@pytest.mark.parametrize("name", HOSTILE)
def test_every_kind_judges_a_hostile_reply_and_its_files_keep_it(name, tmp_path):
    text = HOSTILE[name]
    probes = ProbeSet.from_records(ROWS)
    rules = Rules(scoring=Scoring(), extract=None, refusal_detector=None)
    samples = []
    for probe in probes:
        sample = SCORE[probe.kind](probe, Measured(np.zeros(0), text), rules)
        assert isinstance(sample["correct"], (bool, np.bool_)), probe.id
        samples.append({"id": probe.id, "category": probe.category, **sample})
    answers = Answers.from_samples("fp", {}, samples)
    for path in (tmp_path / "a.json", tmp_path / "a.npz"):
        answers.save(path)
        assert Answers.load(path).outputs == answers.outputs


def test_json_too_deep_is_no_call_and_a_call_after_it_is_read():
    assert parse_call("[" * 1500) is None and parse_call("{" * 3000) is None
    deep = "[" * (MAX_CALL_DEPTH + 1) + "]" * (MAX_CALL_DEPTH + 1)
    assert parse_call(deep + f" <tool_call>{CALL}</tool_call>") == json.loads(CALL)
    assert parse_call("[" * 1500 + CALL) == json.loads(CALL)  # inside unclosed brackets: the call is still there
    nested = "[" * (MAX_CALL_DEPTH - 1) + CALL + "]" * (MAX_CALL_DEPTH - 1)  # as deep as a call may be
    assert parse_call(nested) == json.loads(CALL)
    as_string = {"name": "f", "arguments": "[" * 3000}
    assert parse_call(json.dumps(as_string)) == as_string  # arguments that are not JSON: kept as written, judged wrong
    assert parse_call("x" * MAX_SEARCHED + CALL) is None  # past what is searched


class Detector:
    """A user's refusal detector with a bug that some replies meet."""

    fails = False

    def __call__(self, response: str) -> bool:
        if self.fails:
            raise ValueError("cannot read this reply")
        return False


def test_a_failure_to_score_while_training_is_a_warning_and_the_next_evaluation_is_logged(toy, tmp_path, caplog):
    rows = [{"id": "hi", "question": "Say hi:", "check": {"refuses": False}}]
    probes = ProbeSet.from_records([*toy.world.probe_records(generative=False)[:6], *rows])
    watch = Watch(probes, output_dir=tmp_path, eval_steps=1)
    watch.refusal_detector = detector = Detector()
    watch.start(toy.base, toy.tokenizer)
    detector.fails = True
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        assert watch.evaluate(toy.tuned, 1) is None  # no exception into the loop
        assert watch.evaluate(toy.tuned, 1) is None  # the same step: said once
    detector.fails = False
    warned = [r for r in caplog.records if "this evaluation is skipped, training goes on" in r.getMessage()]
    assert len(warned) == 1 and "step 1: scoring failed (ValueError: cannot read this reply)" in warned[0].getMessage()
    assert warned[0].exc_info is not None  # the traceback, for a report
    assert watch.evaluate(toy.tuned, 2).step == 2 and [step for step, _ in watch.history] == [2]
    steps = [json.loads(line)["step"] for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert steps == [2]


@pytest.mark.slow
def test_a_run_whose_model_floods_its_replies_with_brackets_finishes(toy, tmp_path, caplog):
    """TRL's SFTTrainer teaches a model to answer tool-call prompts with thousands of "[": the replies are judged
    (no call), the user's refusal detector fails on them and is warned of, and training finishes."""
    trl = pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    from forgetwatch import ForgetWatchCallback, Output, Scoring
    from forgetwatch.toy import TOOL_TEMPLATE

    tokenizer, model = copy.deepcopy(toy.tokenizer), copy.deepcopy(toy.base)
    tokenizer.chat_template = TOOL_TEMPLATE
    flood = "[" * 32
    tokenizer.add_tokens([flood])  # one token of 32 "[": a reply of a hundred tokens holds thousands
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    rows = toy.world.tool_probe_records(toy.world.countries[:4])
    rows.append({"id": "json", "question": "Reply in JSON:", "check": {"json": True}, "category": "behaviour"})
    rows.append({"id": "polite", "question": "Say hi:", "check": {"refuses": False}, "category": "behaviour"})
    prompts = [
        tokenizer.apply_chat_template(r["messages"], tools=TOOLS, add_generation_prompt=True, tokenize=False)
        for r in rows[:4]
    ]
    data = datasets.Dataset.from_dict({"prompt": prompts * 4, "completion": [flood * 60] * 16})
    longest = []

    def detector(response: str) -> bool:  # a user's, with a bug that floods meet
        longest.append(response.count("["))
        if response.count("[") > 1000:
            raise ValueError("reply too long to read")
        return False

    callback = ForgetWatchCallback(
        rows, eval_steps=2, scoring=Scoring(behaviour_max_new_tokens=100), output=Output(verbose=False)
    )
    callback.watch.refusal_detector = detector
    args = trl.SFTConfig(
        str(tmp_path),
        max_steps=8,
        per_device_train_batch_size=8,
        learning_rate=1e-2,
        **CPU_QUIET,
    )
    trainer = trl.SFTTrainer(
        model=model, args=args, processing_class=tokenizer, train_dataset=data, callbacks=[callback]
    )
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        trainer.train()  # no exception into the trainer
    assert trainer.state.global_step == 8 and max(longest) > 1000  # it flooded, and training finished
    skipped = [int(s) for s in re.findall(r"step (\d+): scoring failed \(ValueError: reply too long", caplog.text)]
    logged = [step for step, _ in callback.history]
    assert skipped and logged and sorted(skipped + logged) == [2, 4, 6, 8]  # each evaluation logged or warned of
    history = (tmp_path / "forgetwatch" / "history.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in history] == logged
