"""Per-sample agreement of multiple-choice scoring with lm-evaluation-harness (acc, acc_norm)."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from forgetwatch import ProbeSet, Scoring, evaluate

lm_eval = pytest.importorskip("lm_eval")

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def lmeval_samples(model, tokenizer, records, tmp_path, *, chat=False, batch_size=8):
    """lm-eval's per-doc results on ``records`` through a local task: id -> (acc, acc_norm, lls)."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    (tmp_path / "task.yaml").write_text(
        "task: fw_agreement\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        "doc_to_text: question\n"
        "doc_to_choice: choices\n"
        "doc_to_target: answer\n"
        "metric_list:\n  - metric: acc\n  - metric: acc_norm\n",
        encoding="utf-8",
    )
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size)
    logging.getLogger("lm-eval").setLevel(logging.ERROR)
    out = simple_evaluate(
        model=lm,
        tasks=["fw_agreement"],
        log_samples=True,
        verbosity="ERROR",
        task_manager=TaskManager(include_path=str(tmp_path), include_defaults=False),
        apply_chat_template=chat,
    )
    result = {}
    for s in out["samples"]["fw_agreement"]:
        lls = [float(r[0][0]) for r in s["resps"]]
        result[s["doc"]["id"]] = (bool(s["acc"]), bool(s["acc_norm"]), np.array(lls))
    return result


def edge_records(world):
    """Probes that exercise lm-eval's tokenization rules."""
    c = world.countries[0]
    long_question = " ".join(world.fact_texts()[:60]) + f" The flag of {c.name} is"
    return [
        {"id": "trailing-space", "question": f"The flag of {c.name} is ", "choices": ["blue", "red"], "answer": 0},
        {
            "id": "trailing-newline",
            "question": f"The flag of {c.name} is\n",
            "choices": ["gold", "red", "green"],
            "answer": 1,
        },
        {
            "id": "tabs-and-spaces",
            "question": f"The capital of {c.name} is \t ",
            "choices": [c.capital, "Zu"],
            "answer": 0,
        },
        {
            "id": "unicode",
            "question": "Die Flagge von Zürich — ünïcødé ist",
            "choices": ["blüe", "röt ✓", "日本"],
            "answer": 2,
        },
        {
            "id": "long-truncated",
            "question": long_question,
            "choices": [c.color, "mauve", f"{c.capital} and more"],
            "answer": 0,
        },
        {
            "id": "punctuation-choice",
            "question": f"{c.name} has",
            "choices": [".", "? no", f"{c.rivers} rivers."],
            "answer": 2,
        },
        {
            "id": "uneven-lengths",
            "question": f"The capital of {c.name} is",
            "choices": ["B", c.capital, "Quite a long made-up capital name"],
            "answer": 1,
        },
    ]


def mc_records(world):
    return [r for r in world.probe_records(generative=False)] + edge_records(world)


def assert_agrees(ours, theirs, normalized=False):
    assert len(theirs) == len(ours.ids)
    for i, pid in enumerate(ours.ids):
        acc, acc_norm, lls = theirs[pid]
        np.testing.assert_allclose(ours.choice_logprobs[i], lls, rtol=1e-4, atol=1e-4, err_msg=pid)
        assert bool(ours.correct[i]) == (acc_norm if normalized else acc), pid


@pytest.mark.parametrize("normalize", [None, "chars"])
def test_agrees_with_lm_eval_llama_with_bos(toy, tmp_path, normalize):
    records = mc_records(toy.world)
    probes = ProbeSet.from_records(records)
    ours = evaluate(
        toy.base, toy.tokenizer, probes, batch_size=7, scoring=Scoring(normalize=normalize), show_progress=False
    )
    assert_agrees(ours, lmeval_samples(toy.base, toy.tokenizer, records, tmp_path), normalized=normalize == "chars")
    # the model knows something: neither all right nor all wrong
    assert 0.3 < ours.accuracy < 0.95


@pytest.mark.slow
def test_agrees_with_lm_eval_gpt2_without_bos(toy, tmp_path):
    tokenizer = toy.world.tokenizer(add_bos=False)
    model = toy.world.model(tokenizer, arch="gpt2")
    toy.world.train(model, tokenizer, toy.world.fact_texts(), steps=60)
    records = mc_records(toy.world)
    ours = evaluate(model, tokenizer, ProbeSet.from_records(records), batch_size=5, show_progress=False)
    assert_agrees(ours, lmeval_samples(model, tokenizer, records, tmp_path, batch_size=3))


def test_agrees_with_lm_eval_chat_template(toy, tmp_path):
    tokenizer = toy.world.tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    records = mc_records(toy.world)[:40] + edge_records(toy.world)
    ours = evaluate(
        toy.base,
        tokenizer,
        ProbeSet.from_records(records),
        scoring=Scoring(chat_template=True),
        batch_size=8,
        show_progress=False,
    )
    assert_agrees(ours, lmeval_samples(toy.base, tokenizer, records, tmp_path, chat=True))
