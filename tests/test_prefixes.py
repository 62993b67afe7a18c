"""Shared prompt prefixes computed once (a few-shot block): the same answers as scoring each probe
whole, in log-likelihood scoring and in greedy generation, at the cost of each unique token once."""

from __future__ import annotations

import copy
import itertools
import logging
import random

import numpy as np
import pytest
import torch

from forgetwatch import ProbeSet, Scorer, Scoring
from forgetwatch.scoring.batching import forward_cost, group_runs
from forgetwatch.scoring.encoding import EncodedChoices
from forgetwatch.scoring.prefixes import shared_prefix_lengths


def test_prefix_groups_keep_each_sequence_s_last_token_and_save_tokens():
    assert shared_prefix_lengths([[1, 2, 3, 4, 9], [1, 2, 3, 4, 8], [5, 6]], min_tokens=3) == [4, 4, 0]
    # a whole sequence is never all prefix: its last token is its own
    assert shared_prefix_lengths([[1, 2, 3], [1, 2, 3, 4]], min_tokens=2) == [2, 2]
    # alone, or sharing too little: no prefix
    assert shared_prefix_lengths([[1, 2, 3, 4]], min_tokens=2) == [0]
    assert shared_prefix_lengths([[1, 2, 9], [1, 7, 9]], min_tokens=2) == [0, 0]
    # a neighbour that would cut a long shared block short starts a group of its own
    block = list(range(100, 140))
    seqs = [block + [1, 2], block + [1, 3], block + [1, 4], block[:20] + [7, 7], block[:20] + [7, 8]]
    assert shared_prefix_lengths(seqs, min_tokens=10) == [41, 41, 41, 21, 21]


def test_batches_are_cut_where_padding_and_forwards_cost_least():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 7)
        own = [rng.randint(1, 30) for _ in range(n)]
        runs = [rng.choice("abc") for _ in range(n)]
        prefix = {"a": 0, "b": rng.randint(1, 20), "c": rng.randint(1, 20)}
        _check_cheapest_cuts(
            own,
            [prefix[r] for r in runs],
            runs,
            rng.choice([None, 2, 3]),
            rng.choice([None, 60]),
            rng.choice([0, 5, 50]),
        )


def _check_cheapest_cuts(own, shared, runs, max_rows, max_tokens, per_batch):
    """group_runs' cuts against every way to cut its order into consecutive batches."""

    def padded(batch):
        return len(batch) * (max(own[i] for i in batch) + max(shared[i] for i in batch))

    def fits(batch):
        return len(batch) == 1 or (
            len(batch) <= (max_rows or len(own)) and padded(batch) <= (max_tokens or padded(batch))
        )

    order = [i for b in group_runs(own, shared, runs, max_rows, max_tokens) for i in b]
    first = {i for k, i in enumerate(order) if shared[i] and runs[i] not in {runs[j] for j in order[:k]}}

    def cost(parts):  # padded tokens, a forward per batch and one per prefix first read in it
        return sum(padded(b) + per_batch * (1 + any(i in first for i in b)) for b in parts)

    got = group_runs(own, shared, runs, max_rows, max_tokens, per_batch)
    assert [i for b in got for i in b] == order and all(map(fits, got))
    every = (_cut(order, cuts) for cuts in itertools.product((False, True), repeat=len(order) - 1))
    assert cost(got) == min(cost(parts) for parts in every if all(map(fits, parts)))


def _cut(order, cuts):
    parts, current = [], [order[0]]
    for i, cut in zip(order[1:], cuts):
        if cut:
            parts.append(current)
            current = []
        current.append(i)
    return parts + [current]


def few_shot(toy, shots: int = 5) -> ProbeSet:
    """The toy's questions behind few-shot blocks of known facts (as lm-eval's first_n builds
    them): one block for the capitals, a shorter one for the rivers (generated)."""
    countries = toy.world.countries
    blocks = {
        "capitals": "".join(f"The capital of {c.name} is {c.capital}\n\n" for c in countries[-shots:]),
        "rivers": "An atlas of rivers, one country a line.\n"
        + "".join(f"{c.name} has {c.rivers} rivers.\n" for c in countries[-2:]),
    }
    rows = [
        {**r, "question": blocks[r["category"]] + r["question"]}
        for r in toy.probes.to_records()
        if r["category"] in blocks
    ]
    return ProbeSet.from_records(rows, source="few-shot")


class Widths:
    """The input widths of every forward, and the non-padding tokens they carry."""

    def __init__(self, model, pad_id):
        self.shapes, self.tokens, self.pad_id = [], 0, pad_id
        self.handle = model.register_forward_pre_hook(self.hook, with_kwargs=True)

    def hook(self, module, args, kwargs):
        ids = kwargs["input_ids"]
        self.shapes.append(tuple(ids.shape))
        self.tokens += int((ids != self.pad_id).sum())


@pytest.mark.parametrize(("arch", "attn"), [("llama", "sdpa"), ("llama", "eager"), ("gpt2", "sdpa")])
def test_answers_are_the_same_with_and_without_shared_prefixes(toy, arch, attn):
    model = toy.base if arch == "llama" else toy.world.model(toy.tokenizer, arch="gpt2")
    model = copy.deepcopy(model)
    model.set_attn_implementation(attn)
    probes = few_shot(toy)
    shared = Scorer(toy.tokenizer, probes, scoring=Scoring(max_new_tokens=8))
    whole = Scorer(toy.tokenizer, probes, scoring=Scoring(max_new_tokens=8, shared_prefixes=False))
    a = shared(model, batch_size=8, show_progress=False)
    b = whole(model, batch_size=8, show_progress=False)
    assert shared.about(model).prefixes is True
    assert a.correct.tolist() == b.correct.tolist()
    assert 0 < int(a.correct.sum()) < len(a)
    for x, y in zip(a.choice_logprobs, b.choice_logprobs):
        np.testing.assert_allclose(x, y, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(a.gold_logprob, b.gold_logprob, atol=1e-5, rtol=1e-5)
    # greedy generation behind a cached prefix: the same tokens, whatever the padding
    assert a.outputs == b.outputs
    generated = [o for o in a.outputs if o is not None]
    assert len(generated) == 48 and len(set(generated)) > 1


def test_every_unique_token_goes_through_the_model_once(toy):
    probes = few_shot(toy).subset(lambda p: p.is_multiple_choice)
    scorer = Scorer(toy.tokenizer, probes)
    scorer(toy.base, batch_size=16, show_progress=False)  # the first call checks packing and the cache
    widths = Widths(toy.base, toy.tokenizer.pad_token_id)
    try:
        scorer(toy.base, batch_size=16, show_progress=False)
    finally:
        widths.handle.remove()
    tokens = scorer._tokens
    prefixes = {tuple(e.context[: tokens.skips[i]]) for i, e in enumerate(scorer.encoded)}
    assert len(prefixes) == 1 and len(next(iter(prefixes))) > 40  # the 5-shot block
    own = sum(
        len(e.context) - tokens.skips[i] + sum(len(c) - 1 for c in e.continuations)
        for i, e in enumerate(scorer.encoded)
        if isinstance(e, EncodedChoices)
    )
    assert widths.tokens == own + len(next(iter(prefixes)))  # the block once, each probe's own tokens once
    assert widths.shapes[0] == (1, len(next(iter(prefixes))))  # the prefix first, then its probes


def test_a_model_that_cannot_pack_scores_each_probe_whole(toy, caplog):
    from test_scoring import IgnoresCustomMasks

    probes = few_shot(toy).subset(lambda p: p.is_multiple_choice)
    reference = Scorer(toy.tokenizer, probes, scoring=Scoring(shared_prefixes=False))(
        toy.base, batch_size=8, show_progress=False
    )
    wrapped = IgnoresCustomMasks(toy.base)
    scorer = Scorer(toy.tokenizer, probes)
    got = scorer(wrapped, batch_size=8, show_progress=False)
    assert scorer.about(wrapped).packing is False
    assert all(not any(b.prefixes) for plan in scorer.about(wrapped).plans.values() for b in plan.batches)
    assert got.correct.tolist() == reference.correct.tolist()


def background_probes(toy) -> ProbeSet:
    """Questions behind one of a few short background passages, each shared by two or three
    probes: many small prefix groups, the case where a batch per prefix cost more than it saved."""
    facts = toy.world.fact_texts()
    rows, seen = [], {}
    for r in toy.probes.to_records():
        i = seen[r.get("choices") is None] = seen.get(r.get("choices") is None, -1) + 1  # counted per kind
        background = " ".join(facts[(i // 3) * 2 : (i // 3) * 2 + 2])
        rows.append({**r, "question": f"{background}\n{r['question']}"})
    return ProbeSet.from_records(rows, source="background")


def test_prefixes_shared_by_a_few_probes_cost_no_extra_batches(toy):
    probes = background_probes(toy)
    shared = Scorer(toy.tokenizer, probes, scoring=Scoring(max_new_tokens=8))
    whole = Scorer(toy.tokenizer, probes, scoring=Scoring(max_new_tokens=8, shared_prefixes=False))
    for scorer in (shared, whole):  # the first call checks packing and the cache
        scorer(toy.base, batch_size=8, show_progress=False)
    tokens = shared._tokens
    choices = {tuple(r.context[:k]) for r, k in zip(tokens.reads, tokens.skips) if k}
    prompts = {tuple(e.prompt[:k]) for e, k in zip(shared.encoded, tokens.prompt_skips) if k}
    assert len(choices) > 10 and len(prompts) > 5  # many small prefix groups

    counts = {}
    for name, scorer in (("shared", shared), ("whole", whole)):
        widths = Widths(toy.base, toy.tokenizer.pad_token_id)
        generate = toy.base.generate
        calls = []
        toy.base.generate = lambda *a, calls=calls, generate=generate, **k: calls.append(1) or generate(*a, **k)
        try:
            answers = scorer(toy.base, batch_size=8, show_progress=False)
        finally:
            widths.handle.remove()
            del toy.base.generate
        counts[name] = (answers, widths, len(calls))
    (a, shared_widths, shared_calls), (b, whole_widths, whole_calls) = counts["shared"], counts["whole"]
    assert a.correct.tolist() == b.correct.tolist() and a.outputs == b.outputs
    for x, y in zip(a.choice_logprobs, b.choice_logprobs):
        np.testing.assert_allclose(x, y, atol=1e-5, rtol=1e-5)
    assert shared_calls == whole_calls  # generate: as many batches as with every prompt whole
    # rows behind different prefixes share batches: the forwards, as the batches are cut
    # (padded tokens, and a forward's own cost), cost no more than with every prompt whole
    per_forward = forward_cost(toy.base.device)
    assert sum(r * w + per_forward for r, w in shared_widths.shapes) <= sum(
        r * w + per_forward for r, w in whole_widths.shapes
    )
    assert shared_widths.tokens < whole_widths.tokens  # and the prefixes' tokens go through once


class DropsTheCache(torch.nn.Module):
    """A model that drops the KV cache it is given: what follows a prefix sees none of it."""

    def __init__(self, model):
        super().__init__()
        self.module = model

    def forward(self, **kwargs):
        if [kwargs.pop(name) for name in ("cache", "past_key_values") if kwargs.get(name) is not None]:
            width = kwargs["input_ids"].shape[1]
            kwargs["attention_mask"] = kwargs["attention_mask"][..., -width:]
        return self.module(**kwargs)


def test_a_model_that_cannot_read_a_cached_prefix_packs_but_computes_every_prefix(toy, caplog):
    probes = few_shot(toy).subset(lambda p: p.is_multiple_choice)
    reference = Scorer(toy.tokenizer, probes, scoring=Scoring(shared_prefixes=False))(
        toy.base, batch_size=8, show_progress=False
    )
    wrapped = DropsTheCache(toy.base)
    scorer = Scorer(toy.tokenizer, probes)
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        got = scorer(wrapped, batch_size=8, show_progress=False)
    assert scorer.about(wrapped).packing is True
    assert scorer.about(wrapped).prefixes is False
    assert "prefix-cached scores differ from plain ones" in caplog.text
    assert all(not any(b.prefixes) for plan in scorer.about(wrapped).plans.values() for b in plan.batches)
    for x, y in zip(got.choice_logprobs, reference.choice_logprobs):
        np.testing.assert_allclose(x, y, atol=1e-5, rtol=1e-5)
