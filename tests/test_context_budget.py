"""Generation in a short context: the prompt kept whole, the response cut at what the context
leaves, the same in evaluate(), the callback and the command line; a prompt with no room refused."""

from __future__ import annotations

import copy
import json
import logging
import subprocess
import sys

import pytest
import torch

from forgetwatch import Output, ProbeSet, Scorer, evaluate
from forgetwatch.scoring.generation import PromptTooLongError, cut_at_stop, response_budgets

CONTEXT = 128


def short_context(model: torch.nn.Module, arch: str) -> torch.nn.Module:
    """``model`` with a 128-token context: a Llama told so (RoPE has no table to outgrow), or a
    fresh GPT-2 whose position table really ends there (a position past it fails)."""
    if arch == "llama":
        model = copy.deepcopy(model)
        model.config.max_position_embeddings = CONTEXT
        return model
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(
        GPT2Config(
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_positions=CONTEXT,
            vocab_size=model.config.vocab_size,
            bos_token_id=model.config.bos_token_id,
            eos_token_id=model.config.eos_token_id,
            pad_token_id=model.config.pad_token_id,
        )
    ).eval()  # no dropout


def probe_rows(toy) -> list[dict]:
    """Behaviour probes (default budget 256 tokens) and generative ones (64), all short prompts,
    and one that leaves fewer than 64 tokens."""
    world = toy.world
    rows = world.behaviour_probe_records(world.known[:1])
    rows += [r for r in world.probe_records() if r["category"] == "rivers"][:4]
    long = (
        " ".join(f"{c.name} has {c.rivers} rivers." for c in world.countries[:24]) + f" {world.countries[0].name} has"
    )
    rows.append({"id": "rivers/long", "question": long, "answer": str(world.countries[0].rivers), "extract": "number"})
    return rows


def by_hand(model, tokenizer, probes: ProbeSet) -> list[str]:
    """Each probe alone: its whole prompt, greedy generation of as many tokens as the budget
    allows within the context, decoded; a generative answer cut at the newline."""
    texts = []
    for p in probes:
        ids = tokenizer(p.question, return_tensors="pt")["input_ids"]
        budget = min(256 if p.check is not None else 64, CONTEXT - ids.shape[1])
        with torch.no_grad():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=budget,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
        assert out.shape[1] <= CONTEXT
        text = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        texts.append(text if p.check is not None else cut_at_stop(text, ["\n"]))
    return texts


def test_budgets_keep_the_prompt_and_cut_the_response():
    budgets, note = response_budgets(
        {"a": 7, "b": 20, "c": 127}, max_length=128, max_new_tokens=256, setting="behaviour_max_new_tokens"
    )
    assert budgets == {"a": 121, "b": 108, "c": 1}
    assert note == (
        "the model's context is 128 tokens: 3 of 3 prompt(s) leave less than "
        "behaviour_max_new_tokens=256 for the response, which is cut at what the context leaves "
        "(1 to 121 tokens)"
    )
    assert response_budgets({"a": 7}, max_length=2048, max_new_tokens=64) == ({"a": 64}, None)
    with pytest.raises(
        PromptTooLongError, match=r"2 prompt\(s\) fill .* 128 tokens.*'b' \(128 tokens\), 'c' \(more than 128 tokens\)"
    ):
        response_budgets({"a": 7, "b": 128, "c": 300}, max_length=128, max_new_tokens=64)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.slow
def test_a_short_context_scores_like_plain_generation_of_the_whole_prompt(toy, arch, caplog):
    model = short_context(toy.base, arch)
    probes = ProbeSet.from_records(probe_rows(toy))
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        scorer = Scorer(toy.tokenizer, probes)
        got = scorer(model, batch_size=4, show_progress=False)
        scorer.prepare(model)  # the same model again: warned once per setting
    assert got.outputs == by_hand(model, toy.tokenizer, probes)
    warnings = [r.getMessage() for r in caplog.records]
    assert sum("behaviour_max_new_tokens=256" in w for w in warnings) == 1
    assert sum("max_new_tokens=64 for the response" in w for w in warnings) == 1
    assert all("truncated" not in w for w in warnings)
    assert any("the model's context is 128 tokens: 4 of 4 prompt(s)" in w for w in warnings)  # behaviour
    assert any("the model's context is 128 tokens: 1 of 5 prompt(s)" in w for w in warnings)  # generative


@pytest.mark.slow
def test_the_callback_and_the_command_line_score_alike(toy, tmp_path):
    from transformers import Trainer, TrainingArguments

    from forgetwatch import Answers, ForgetWatchCallback

    model = short_context(toy.base, "llama")
    probes = ProbeSet.from_records(probe_rows(toy))
    expected = by_hand(model, toy.tokenizer, probes)
    callback = ForgetWatchCallback(probes, eval_steps=1, output_dir=str(tmp_path / "fw"), output=Output(verbose=False))
    data = [toy.tokenizer("Nothing to learn here.")] * 2
    args = TrainingArguments(
        str(tmp_path / "run"),
        max_steps=1,
        learning_rate=0.0,
        use_cpu=True,
        report_to=[],
        per_device_train_batch_size=1,
        save_strategy="no",
        disable_tqdm=True,
    )
    from transformers import DataCollatorForLanguageModeling

    Trainer(
        model=model,
        args=args,
        train_dataset=data,
        callbacks=[callback],
        processing_class=toy.tokenizer,
        data_collator=DataCollatorForLanguageModeling(toy.tokenizer, mlm=False),
    ).train()
    assert callback.base_answers.outputs == expected
    assert Answers.load(tmp_path / "fw" / "base_answers.npz").outputs == expected

    saved = tmp_path / "short"
    model.save_pretrained(saved)
    toy.tokenizer.save_pretrained(saved)
    probes.to_jsonl(tmp_path / "probes.jsonl")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "forgetwatch",
            "evaluate",
            "--model",
            str(saved),
            "--probes",
            str(tmp_path / "probes.jsonl"),
            "--out",
            str(tmp_path / "cli.json"),
            "--no-progress",
            "--device",
            "cpu",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert [s["output"] for s in json.loads((tmp_path / "cli.json").read_text())["samples"]] == expected
    assert "the model's context is 128 tokens" in done.stderr


def test_the_callback_refuses_a_prompt_with_no_room_before_training(toy, tmp_path):
    from transformers import Trainer, TrainingArguments

    from forgetwatch import ForgetWatchCallback

    long = " ".join(f"{c.name} has {c.rivers} rivers." for c in toy.world.countries[:36])  # 184 tokens
    probes = ProbeSet.from_records(
        probe_rows(toy)[:3] + [{"id": "too-long", "question": long, "check": {"refuses": False}}]
    )
    base = evaluate(toy.base, toy.tokenizer, probes, show_progress=False)  # it fits a 256-token context
    model = short_context(toy.base, "llama")
    # with the base given, nothing is scored at the start and the first evaluation would fail: refused up front
    callback = ForgetWatchCallback(
        probes, eval_steps=1, output_dir=str(tmp_path / "fw"), base=base, output=Output(verbose=False)
    )
    args = TrainingArguments(str(tmp_path / "run"), max_steps=1, use_cpu=True, report_to=[], save_strategy="no")
    trainer = Trainer(
        model=model, args=args, train_dataset=[toy.tokenizer("x")], callbacks=[callback], processing_class=toy.tokenizer
    )
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(PromptTooLongError, match="'too-long'"):
        trainer.train()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
