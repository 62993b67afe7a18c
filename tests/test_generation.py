"""generate_sharded: greedy answers in batches, with their token ids, equal to one prompt at a time."""

from __future__ import annotations

import copy
import logging

import pytest
import torch

from forgetwatch import Scorer, Scoring
from forgetwatch.scoring.generation import (
    Generated,
    PromptTooLongError,
    cut_at_stop,
    fit_prompts,
    generate_sharded,
)


def answer(model, tokenizer, ids, max_new_tokens=64, stop=(), **kwargs):
    prompts = fit_prompts(model, tokenizer, {f"r{i + 1}": p for i, p in enumerate(ids)}, max_new_tokens, stop)
    return generate_sharded(model, tokenizer, prompts, **kwargs)


def prompts_of(toy) -> list[str]:
    """Questions of several lengths: known and unknown capitals, rivers, sums."""
    countries = toy.world.countries
    return (
        [f"The capital of {c.name} is" for c in countries[:3] + countries[-3:]]
        + [f"{c.name} has" for c in countries[10:16]]
        + ["Compute 12 plus 30. The sum is", "Compute 5 plus 7."]
    )


def one_at_a_time(model, tokenizer, ids: list[int], max_new_tokens: int) -> tuple[list[int], bool]:
    """The reference: ``model.generate`` greedy on one prompt; the tokens before the first EOS,
    and whether there was one."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    new = out[0, len(ids) :].tolist()
    eos = tokenizer.eos_token_id
    return (new[: new.index(eos)], True) if eos in new else (new, False)


def test_ids_equal_a_greedy_loop_one_prompt_at_a_time(toy):
    tokenizer, model = toy.tokenizer, toy.base
    ids = tokenizer(prompts_of(toy))["input_ids"]
    got = answer(model, tokenizer, ids, max_new_tokens=6, rows_per_batch=5, return_ids=True)
    assert all(isinstance(g, Generated) for g in got) and len(got) == len(ids)
    for prompt, g in zip(ids, got):
        expected, ended = one_at_a_time(model, tokenizer, prompt, 6)
        assert list(g.ids) == expected and g.ended == ended
        assert g.text == tokenizer.decode(expected, skip_special_tokens=True)
    # some answers end with EOS, some run out of tokens first
    assert {g.ended for g in got} == {True, False}
    # without return_ids: the same texts, no ids
    plain = answer(model, tokenizer, ids, max_new_tokens=6, rows_per_batch=3)
    assert [(g.text, g.ids, g.ended) for g in plain] == [(g.text, None, g.ended) for g in got]


def test_a_stop_string_cuts_the_text_and_the_ids_that_hold_it(toy):
    tokenizer, model = toy.tokenizer, toy.base
    ids = tokenizer(prompts_of(toy))["input_ids"]
    stop = ("i", " r")
    got = answer(model, tokenizer, ids, max_new_tokens=10, stop=stop, rows_per_batch=4, return_ids=True)
    straddled = exact = 0
    for prompt, g in zip(ids, got):
        tokens, ended = one_at_a_time(model, tokenizer, prompt, 10)
        whole = tokenizer.decode(tokens, skip_special_tokens=True)
        text = cut_at_stop(whole, stop)
        assert g.text == text
        if text == whole:  # no stop string: as without one
            assert list(g.ids) == tokens and g.ended == ended
            continue
        # the fewest tokens whose decoding reaches as far as the text
        k = next(k for k in range(len(tokens) + 1) if len(tokenizer.decode(tokens[:k])) >= len(text))
        assert list(g.ids) == tokens[:k] and not g.ended
        decoded = tokenizer.decode(list(g.ids))
        assert decoded.startswith(text)
        straddled += decoded != text  # the stop string starts inside a token: that token is kept
        exact += decoded == text
    assert straddled and exact


def test_texts_equal_the_scorers(toy):
    probes = toy.probes.subset(lambda p: not p.is_multiple_choice)
    scorer = Scorer(toy.tokenizer, probes, scoring=Scoring(max_new_tokens=8))
    answers = scorer(toy.base, batch_size=7, show_progress=False)
    prompts = [e.prompt for e in scorer.encoded]
    got = answer(toy.base, toy.tokenizer, prompts, max_new_tokens=8, stop=("\n",), rows_per_batch=5)
    assert [g.text for g in got] == answers.outputs


def test_responses_are_cut_to_the_context_and_a_full_prompt_is_refused(toy, caplog):
    tokenizer, model = toy.tokenizer, toy.base
    context = model.config.max_position_embeddings
    short = tokenizer("Vouzapu has")["input_ids"]
    long = (short * context)[: context - 3]
    with caplog.at_level(logging.WARNING):
        got = answer(model, tokenizer, [short, long], max_new_tokens=8, return_ids=True)
    assert "1 of 2 prompt(s) leave less than max_new_tokens=8" in caplog.text
    assert len(got[1].ids) <= 3
    with pytest.raises(PromptTooLongError, match="'r2'"):
        answer(model, tokenizer, [short, short * context])


def test_the_model_is_handed_back_as_found(toy):
    model = copy.deepcopy(toy.base)
    model.train()
    model.model.layers[0].eval()  # a part in another mode stays so
    torch.manual_seed(3)
    rng = torch.get_rng_state()
    ids = toy.tokenizer(prompts_of(toy)[:4])["input_ids"]
    answer(model, toy.tokenizer, ids, max_new_tokens=4)
    assert model.training and not model.model.layers[0].training
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(p.grad is None for p in model.parameters())


def test_out_of_memory_halves_the_batch_with_the_same_answers(toy, caplog):
    tokenizer = toy.tokenizer
    ids = tokenizer(prompts_of(toy))["input_ids"]
    reference = answer(toy.base, tokenizer, ids, max_new_tokens=6, rows_per_batch=8, return_ids=True)
    model = copy.deepcopy(toy.base)
    real, sizes = model.generate, []

    def generate(**kwargs):
        sizes.append(kwargs["input_ids"].shape[0])
        if sizes[-1] > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
        return real(**kwargs)

    model.generate = generate
    with caplog.at_level(logging.WARNING):
        got = answer(model, tokenizer, ids, max_new_tokens=6, rows_per_batch=8, return_ids=True)
    assert sizes[:3] == [8, 4, 2] and max(sizes[3:]) == 2
    assert got == reference
    assert "out of memory with 8 sequences per batch; retrying with 4" in caplog.text
