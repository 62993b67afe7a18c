"""Scorer behaviour: packing, batching, generation, borrowing the model."""

from __future__ import annotations

import copy
import random
import sys

import numpy as np
import pytest
import torch
from injected import OutOfMemoryAbove

from forgetwatch import ProbeSet, Scorer, Scoring, evaluate
from forgetwatch.config import ConfigError
from forgetwatch.probes.extract import extract_number
from forgetwatch.scoring import encoding
from forgetwatch.scoring.encoding import EncodedChoices
from forgetwatch.scoring.generation import PromptTooLongError, cut_at_stop


def mc_only(toy) -> ProbeSet:
    return toy.probes.subset(lambda p: p.is_multiple_choice)


class TokenCounter:
    """Counts forward calls and the non-padding tokens they carry."""

    def __init__(self, model, pad_id):
        self.calls, self.tokens, self.rows, self.pad_id = 0, 0, [], pad_id
        self.handle = model.register_forward_pre_hook(self.hook, with_kwargs=True)

    def hook(self, module, args, kwargs):
        self.calls += 1
        self.rows.append(len(kwargs["input_ids"]))
        self.tokens += int((kwargs["input_ids"] != self.pad_id).sum())  # <pad> is in no probe


def unique_tokens(scorer: Scorer) -> int:
    """Each context once, and each choice's tokens but the last (which is only ever a target)."""
    return sum(
        len(e.context) + sum(len(c) - 1 for c in e.continuations)
        for e in scorer.encoded
        if isinstance(e, EncodedChoices)
    )


def test_each_context_goes_through_the_model_once(toy):
    probes = mc_only(toy)
    scorer = Scorer(toy.tokenizer, probes)
    scorer(toy.base, batch_size=16, show_progress=False)  # first call also checks packing once
    assert scorer.about(toy.base).packing is True
    counter = TokenCounter(toy.base, toy.tokenizer.pad_token_id)
    try:
        scorer(toy.base, batch_size=16, show_progress=False)
    finally:
        counter.handle.remove()
    assert max(counter.rows) <= 16 and sum(counter.rows) == len(probes)  # a row per probe
    assert counter.tokens == unique_tokens(scorer)


def test_single_token_choices_cost_one_context_pass(toy):
    colors = toy.probes.subset(lambda p: p.category == "colors")
    scorer = Scorer(toy.tokenizer, colors)
    assert all(len(c) == 1 for e in scorer.encoded for c in e.continuations)
    scorer(toy.base, batch_size=64, show_progress=False)
    counter = TokenCounter(toy.base, toy.tokenizer.pad_token_id)
    try:
        scorer(toy.base, batch_size=64, show_progress=False)
    finally:
        counter.handle.remove()
    assert sum(counter.rows) == len(colors)  # a row per probe, its context once
    assert counter.tokens == sum(len(e.context) for e in scorer.encoded)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_packed_equals_plain(toy, attn):
    model = copy.deepcopy(toy.base)
    model.set_attn_implementation(attn)
    probes = mc_only(toy)
    packed = Scorer(toy.tokenizer, probes)
    a = packed(model, batch_size=8, show_progress=False)
    assert packed.about(model).packing is True
    plain = Scorer(toy.tokenizer, probes)
    plain.about(model).packing = False  # force lm-eval's one-sequence-per-choice layout
    b = plain(model, batch_size=8, show_progress=False)
    assert all(not batch.packed for batch in next(iter(plain.about(model).plans.values())).batches)
    for x, y in zip(a.choice_logprobs, b.choice_logprobs):
        np.testing.assert_allclose(x, y, atol=1e-5, rtol=1e-5)
    assert a.correct.tolist() == b.correct.tolist()


class IgnoresCustomMasks(torch.nn.Module):
    """A model whose attention silently ignores 4D masks, as some architectures do."""

    def __init__(self, model):
        super().__init__()
        self.module = model

    def forward(self, **kwargs):
        if kwargs["attention_mask"].dim() == 4:
            kwargs["attention_mask"] = None
        return self.module(**kwargs)


def test_falls_back_to_plain_rows_when_packing_disagrees(toy, warned):
    # single-token choices first: packing them tests nothing, the check must look further
    probes = ProbeSet.from_records(sorted(mc_only(toy).to_records(), key=lambda r: r["category"] != "colors"))
    reference = evaluate(toy.base, toy.tokenizer, probes, batch_size=8, show_progress=False)
    wrapped = IgnoresCustomMasks(toy.base)
    scorer = Scorer(toy.tokenizer, probes)
    got = scorer(wrapped, batch_size=8, show_progress=False)
    assert scorer.about(wrapped).packing is False
    assert len(warned("packed", "tolerance")) == 1  # what was measured, against what bound
    assert got.correct.tolist() == reference.correct.tolist()
    for x, y in zip(got.choice_logprobs, reference.choice_logprobs):
        np.testing.assert_allclose(x, y, atol=1e-5)


def test_the_packing_check_costs_the_same_whatever_the_context_length(toy):
    # checked on short probes made of the probes' own tokens: a long few-shot prompt costs
    # nothing more to check than a short one
    from test_prefixes import few_shot

    checks = []
    for shots in (1, 12):
        scorer = Scorer(toy.tokenizer, few_shot(toy, shots).subset(lambda p: p.is_multiple_choice))
        counter = TokenCounter(toy.base, toy.tokenizer.pad_token_id)
        try:
            scorer(toy.base, batch_size=16, show_progress=False)  # the packing check, then scoring
            first = (counter.calls, counter.tokens)
            scorer(toy.base, batch_size=16, show_progress=False)  # scoring alone
        finally:
            counter.handle.remove()
        scoring = (counter.calls - first[0], counter.tokens - first[1])
        checks.append((first[0] - scoring[0], first[1] - scoring[1]))
    assert checks[0] == checks[1]
    assert 0 < checks[1][1] < scoring[1]  # less than one evaluation of the 12-shot probes


@pytest.mark.slow
def test_out_of_memory_halves_the_batch(toy, warned):
    probes = mc_only(toy)
    reference = evaluate(toy.base, toy.tokenizer, probes, batch_size=8, show_progress=False)
    wrapped = OutOfMemoryAbove(toy.base, limit=3)
    scorer = Scorer(toy.tokenizer, probes)
    got = scorer(wrapped, batch_size=16, show_progress=False)
    assert warned("out of memory")
    assert max(s for s in wrapped.sizes if s <= 3) == 2  # halved down to 2 rows
    # the size that fitted is remembered: only the first too-large batch is halved repeatedly
    failures = [s for s in wrapped.sizes if s > 3]
    assert len(failures) == len(set(failures)) <= 5
    np.testing.assert_allclose(
        np.concatenate(got.choice_logprobs), np.concatenate(reference.choice_logprobs), atol=1e-5
    )
    wrapped.sizes.clear()
    scorer(wrapped, batch_size=16, show_progress=False)
    assert max(wrapped.sizes) <= 2  # later evaluations start at the size that fitted


@pytest.mark.slow
def test_one_models_out_of_memory_caps_never_reach_another(toy):
    # evaluate() keeps one scorer per tokenizer and probe set: what it learned about one model
    # (batches that did not fit) must not shrink another model's batches
    probes = mc_only(toy)
    small = OutOfMemoryAbove(toy.base, limit=3)
    evaluate(small, toy.tokenizer, probes, batch_size=16, show_progress=False)
    assert max(s for s in small.sizes if s <= 3) == 2
    roomy = OutOfMemoryAbove(toy.base, limit=10**6)
    evaluate(roomy, toy.tokenizer, probes, batch_size=16, show_progress=False)
    assert max(roomy.sizes) == 16
    small.sizes.clear()
    evaluate(small, toy.tokenizer, probes, batch_size=16, show_progress=False)
    assert max(small.sizes) <= 2  # the first model's cap is still its own


def test_ties_go_to_the_lowest_index(toy):
    # a model with a zeroed output layer gives every token the same log-probability, so
    # choices of equal token length tie exactly, as lm-eval's argmax sees them
    model = copy.deepcopy(toy.base)
    torch.nn.init.zeros_(model.lm_head.weight)
    one_token = [
        w
        for w in ("red", "blue", "green", "gold", "white", "black")
        if len(toy.tokenizer(" " + w, add_special_tokens=False).input_ids) == 1
    ][:3]
    assert len(one_token) == 3
    probes = ProbeSet.from_records(
        [{"id": f"q{k}", "question": "The flag is", "choices": one_token, "answer": k} for k in range(3)]
    )
    got = evaluate(model, toy.tokenizer, probes, show_progress=False)
    assert all(len(set(lps.tolist())) == 1 for lps in got.choice_logprobs)  # a real tie
    assert list(got.predicted) == [0, 0, 0] and got.correct.tolist() == [True, False, False]


@pytest.mark.slow
def test_out_of_memory_in_generation_halves_the_batch(toy):
    probes = toy.probes.subset(lambda p: not p.is_multiple_choice)
    reference = evaluate(
        toy.base, toy.tokenizer, probes, batch_size=8, scoring=Scoring(max_new_tokens=6), show_progress=False
    )
    model = copy.deepcopy(toy.base)
    real, sizes = model.generate, []

    def generate(**kwargs):
        sizes.append(kwargs["input_ids"].shape[0])
        if sizes[-1] > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
        return real(**kwargs)

    model.generate = generate
    got = evaluate(model, toy.tokenizer, probes, batch_size=8, scoring=Scoring(max_new_tokens=6), show_progress=False)
    assert sizes[:3] == [8, 4, 2]
    assert got.outputs == reference.outputs


def test_batch_size_does_not_change_answers(toy):
    probes = toy.probes
    runs = [evaluate(toy.base, toy.tokenizer, probes, batch_size=bs, show_progress=False) for bs in (1, 5, "auto")]
    for other in runs[1:]:
        assert other.correct.tolist() == runs[0].correct.tolist()
        assert other.predicted == runs[0].predicted
        for x, y in zip(other.choice_logprobs, runs[0].choice_logprobs):
            np.testing.assert_allclose(x, y, atol=1e-5)


def test_generative_matches_a_per_sample_greedy_loop(toy):
    probes = toy.probes.subset(lambda p: not p.is_multiple_choice)
    got = evaluate(
        toy.base, toy.tokenizer, probes, batch_size=7, scoring=Scoring(max_new_tokens=12), show_progress=False
    )
    expected_correct = []
    for i, probe in enumerate(probes):
        ids = toy.tokenizer(probe.question, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = toy.base.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=toy.tokenizer.pad_token_id)
        text = toy.tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True).split("\n")[0]
        assert got.outputs[i] == text, probe.id
        assert got.predicted[i] == extract_number(text)
        expected_correct.append(extract_number(text) == probe.answer)
    assert got.correct.tolist() == expected_correct
    assert 0 < sum(expected_correct) < len(probes)  # some right, some wrong


def test_failed_extraction_is_wrong_and_recorded(toy):
    c = toy.world.countries[0]
    probes = ProbeSet.from_records(
        [
            {"id": "never", "question": f"{c.name} has", "answer": str(c.rivers), "extract": r"zzz(\d+)"},
            {"id": "callable", "question": f"{c.name} has", "answer": "x"},
        ]
    )
    got = evaluate(toy.base, toy.tokenizer, probes, scoring=Scoring(max_new_tokens=8), show_progress=False)
    assert got.predicted[0] is None and not got.correct[0] and got.outputs[0]
    seen = []
    got = evaluate(
        toy.base,
        toy.tokenizer,
        probes,
        scoring=Scoring(max_new_tokens=8),
        show_progress=False,
        extract=lambda text: seen.append(text) or "x",
    )
    assert got.correct.tolist() == [False, True]  # the override applies to every generative probe
    assert got.predicted == ["x", "x"] and len(seen) == 2
    assert "extract" in got.scoring


def test_stop_strings_cut_generation():
    assert cut_at_stop("4 rivers.\nThe", ["\n"]) == "4 rivers."
    assert cut_at_stop("a STOP b\n", ["\n", "STOP"]) == "a "
    assert cut_at_stop("nothing", []) == "nothing"


def test_model_and_tokenizer_are_handed_back_as_found(toy):
    model = copy.deepcopy(toy.base)
    model.train()
    model.model.layers[0].eval()  # a frozen part in eval mode while the rest trains
    model.config.use_cache = False
    model.gradient_checkpointing_enable()
    tokenizer = toy.tokenizer
    tokenizer.padding_side = "right"
    flags = [m.training for m in model.modules()]
    params = [p.detach().clone() for p in model.parameters()]

    def draws():
        return random.random(), np.random.rand(), torch.rand(3).tolist()

    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    expected = draws()
    checkpointed = []  # calls of transformers' gradient-checkpointing function
    for layer in model.model.layers:
        real = layer._gradient_checkpointing_func
        layer._gradient_checkpointing_func = lambda *a, real=real, **k: checkpointed.append(1) or real(*a, **k)
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    evaluate(model, tokenizer, toy.probes, batch_size=8, scoring=Scoring(max_new_tokens=4), show_progress=False)
    assert draws() == expected
    assert checkpointed == []  # off during evaluation (eval mode), on again for training:
    model(input_ids=torch.tensor([[1, 2, 3]]))
    assert checkpointed
    assert [m.training for m in model.modules()] == flags
    assert model.config.use_cache is False
    assert all(m.gradient_checkpointing for m in model.modules() if hasattr(m, "gradient_checkpointing"))
    assert tokenizer.padding_side == "right"
    assert all(torch.equal(p, q) for p, q in zip(params, model.parameters()))
    assert all(p.grad is None for p in model.parameters())
    tokenizer.padding_side = "left"
    evaluate(model, tokenizer, toy.probes, batch_size=8, scoring=Scoring(max_new_tokens=4), show_progress=False)
    assert tokenizer.padding_side == "left"


def test_tokenization_is_cached_across_calls(toy, monkeypatch):
    calls = []
    real = encoding.encode_probes

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    import forgetwatch.scoring.scorer as scoring

    monkeypatch.setattr(scoring, "encode_probes", counting)
    probes = mc_only(toy).sample(10, seed=3)
    for _ in range(3):
        evaluate(toy.base, toy.tokenizer, probes, show_progress=False)
    assert len(calls) == 1
    evaluate(toy.base, toy.tokenizer, probes, scoring=Scoring(normalize="chars"), show_progress=False)
    assert len(calls) == 2  # other options: another scorer


def test_long_probes_warn_about_truncation(toy, warned):
    c = toy.world.countries[0]
    long = " ".join(toy.world.fact_texts()[:80]) + f" The flag of {c.name} is"
    probes = ProbeSet.from_records([{"id": "long", "question": long, "choices": ["red", "blue"], "answer": 0}])
    evaluate(toy.base, toy.tokenizer, probes, show_progress=False)
    assert len(warned("1 probe", "(256 tokens)")) == 1  # how many, and the length they exceed


def test_bad_options_fail_before_model_work(toy):
    with pytest.raises(ValueError, match="normalize"):
        evaluate(toy.base, toy.tokenizer, toy.probes, scoring=Scoring(normalize="tokens"))
    with pytest.raises(ValueError, match="batch_size"):
        evaluate(toy.base, toy.tokenizer, toy.probes, batch_size=0)
    with pytest.raises(ValueError, match="chat template"):
        evaluate(toy.base, toy.tokenizer, toy.probes, scoring=Scoring(chat_template=True))
    with pytest.raises(ConfigError) as info:
        Scoring(stop=["\n", ""])
    assert [e.key for e in info.value.errors] == ["stop"] and "item 1" in info.value.errors[0].message


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_scores_with_fp32_log_softmax(toy, dtype):
    probes = mc_only(toy)
    full = evaluate(toy.base, toy.tokenizer, probes, show_progress=False)
    model = copy.deepcopy(toy.base).to(dtype)
    scorer = Scorer(toy.tokenizer, probes)
    half = scorer(model, show_progress=False)
    assert scorer.about(model).packing is True  # bf16 rounding is no reason to give up packing
    assert all(x.dtype == np.float64 for x in half.choice_logprobs)
    agreement = np.mean(full.correct == half.correct)
    assert agreement >= 0.9, agreement


def unbatched_logprobs(model, scorer):
    """Each (context, choice) alone, unpadded, lm-eval's layout: the reference for any model."""
    out = []
    for enc in scorer.encoded:
        ids = [torch.tensor([list(enc.context + c)]) for c in enc.continuations]
        with torch.no_grad():
            lps = [torch.log_softmax(model(input_ids=x).logits[0].float(), -1) for x in ids]
        out.append(
            [
                float(lp[len(enc.context) - 1 + np.arange(len(c)), list(c)].sum())
                for lp, c in zip(lps, enc.continuations)
            ]
        )
    return out


def recurrent_or_alibi_models(tokenizer):
    from transformers import JambaConfig, JambaForCausalLM, MptConfig, MptForCausalLM

    common = dict(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    yield "ALiBi", MptForCausalLM(MptConfig(d_model=64, n_heads=4, n_layers=2, max_seq_len=256, **common))
    yield (
        "recurrent",
        JambaForCausalLM(
            JambaConfig(
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                attn_layer_period=2,
                attn_layer_offset=1,
                expert_layer_period=2,
                expert_layer_offset=1,
                num_experts=2,
                mamba_d_state=8,
                mamba_expand=2,
                **common,
            )
        ),
    )


@pytest.mark.slow
def test_models_that_cannot_be_packed_are_scored_exactly(toy, warned):
    probes = mc_only(toy).sample(24, seed=0)
    for reason, model in recurrent_or_alibi_models(toy.tokenizer):
        toy.world.train(model, toy.tokenizer, toy.world.fact_texts(), steps=20)
        scorer = Scorer(toy.tokenizer, probes)
        got = scorer(model, batch_size=8, show_progress=False)
        assert scorer.about(model).packing is False
        assert warned(reason)  # the model's own reason
        for x, y in zip(got.choice_logprobs, unbatched_logprobs(model, scorer)):
            np.testing.assert_allclose(x, y, atol=1e-4, err_msg=reason)


def test_generation_ignores_the_model_generation_config(toy):
    probes = toy.probes.subset(lambda p: not p.is_multiple_choice)
    reference = evaluate(toy.base, toy.tokenizer, probes, scoring=Scoring(max_new_tokens=8), show_progress=False)
    model = copy.deepcopy(toy.base)
    config = model.generation_config
    config.repetition_penalty, config.min_new_tokens, config.no_repeat_ngram_size = 3.0, 6, 1
    config.suppress_tokens = list(range(10, 200))
    got = evaluate(model, toy.tokenizer, probes, scoring=Scoring(max_new_tokens=8), show_progress=False)
    assert got.outputs == reference.outputs  # plain greedy whatever the model's config says
    assert model.generation_config is config and config.repetition_penalty == 3.0


def test_forwards_bypass_data_parallel_wrappers(toy):
    wrapped = torch.nn.DataParallel(toy.base)
    calls = []
    handle = wrapped.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        got = evaluate(
            wrapped, toy.tokenizer, toy.probes, batch_size=8, scoring=Scoring(max_new_tokens=4), show_progress=False
        )
    finally:
        handle.remove()
    assert calls == []  # DDP/DataParallel forwards would start collectives
    reference = evaluate(
        toy.base, toy.tokenizer, toy.probes, batch_size=8, scoring=Scoring(max_new_tokens=4), show_progress=False
    )
    assert got.correct.tolist() == reference.correct.tolist()


def test_a_custom_extractor_is_compared_with_the_answer_as_written(toy):
    c = toy.world.countries[0]
    probes = ProbeSet.from_records(
        [
            {"id": "comma", "question": f"{c.name} has", "answer": "1,234", "extract": "number"},
            {"id": "letter", "question": f"{c.name} has", "answer": " (b) ", "extract": "letter"},
        ]
    )

    def judged(said: str) -> list[bool]:  # every reply read as ``said``
        scoring = Scoring(max_new_tokens=4)
        got = evaluate(toy.base, toy.tokenizer, probes, scoring=scoring, show_progress=False, extract=lambda t: said)
        return got.correct.tolist()

    assert judged("1,234") == [True, False]  # not "1234": the user's text, the user's answer
    assert judged("(b)") == [False, True]


def test_a_model_that_rejects_a_custom_mask_is_scored_plain_and_right(toy, warned):
    class NoCustomMask(type(toy.base)):
        def forward(self, *args, attention_mask=None, **kwargs):
            if attention_mask is not None and attention_mask.dim() == 4:
                raise ValueError("this attention takes a 2-D padding mask only")
            return super().forward(*args, attention_mask=attention_mask, **kwargs)

    model = copy.deepcopy(toy.base)
    model.__class__ = NoCustomMask
    got = Scorer(toy.tokenizer, toy.probes)(model, batch_size=8, show_progress=False)
    assert len(warned("this attention takes a 2-D padding mask only")) == 1  # the model's own words, passed on
    want = evaluate(toy.base, toy.tokenizer, toy.probes, batch_size=8, show_progress=False)
    assert got.correct.tolist() == want.correct.tolist()


def test_our_own_bug_in_the_packing_check_surfaces_instead_of_a_fallback(toy, warned, monkeypatch):
    scorer_module = sys.modules[Scorer.__module__]

    def broken(*args, **kwargs):
        raise IndexError("a bug of ours")

    monkeypatch.setattr(scorer_module, "forward_logprobs", broken)
    with pytest.raises(IndexError, match="a bug of ours"):
        Scorer(toy.tokenizer, toy.probes)(copy.deepcopy(toy.base), batch_size=8, show_progress=False)
    assert warned() == []  # no misleading "slower scoring" warning


def test_our_own_bug_on_the_packed_path_alone_surfaces_too(toy, warned, monkeypatch):
    # plain rows work, packed ones hit a bug of ours (not the model's): no fallback either
    scorer_module = sys.modules[Scorer.__module__]
    real = scorer_module.collate

    def broken_when_packed(rows, pad_id):
        if any(r.packed for r in rows):
            raise IndexError("a bug of ours in packed collation")
        return real(rows, pad_id)

    monkeypatch.setattr(scorer_module, "collate", broken_when_packed)
    with pytest.raises(IndexError, match="packed collation"):
        Scorer(toy.tokenizer, toy.probes)(copy.deepcopy(toy.base), batch_size=8, show_progress=False)
    assert warned() == []


def test_bf16_autocast_keeps_packing(toy):
    # fp32 weights computing in bf16, as under a trainer's bf16 mixed precision: packed and
    # plain layouts round differently, by the precision of the arithmetic, not the weights'
    scorer, model = Scorer(toy.tokenizer, toy.probes), copy.deepcopy(toy.base)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        scorer(model, batch_size=8, show_progress=False)
    assert scorer.about(model).packing is True


def _tokenizer_sees(monkeypatch, tokenizer) -> list[int]:
    """The length of every text ``tokenizer`` is called on from now on."""
    seen = []
    real = type(tokenizer).__call__

    def counting(self, text, *args, **kwargs):
        seen.extend(len(t) for t in ([text] if isinstance(text, str) else text))
        return real(self, text, *args, **kwargs)

    monkeypatch.setattr(type(tokenizer), "__call__", counting)
    return seen


def test_a_huge_question_is_cut_before_tokenizing_with_the_same_answers(toy, monkeypatch):
    from forgetwatch.scoring import encoding

    c = toy.world.countries[0]
    filler = "".join(f"{x.name} is a country. " for x in toy.world.countries) * 20_000  # ~5 MB
    rows = [
        {
            "id": "mc",
            "question": filler + f"The capital of {c.name} is",
            "choices": [c.capital, toy.world.countries[1].capital],
            "answer": 0,
        }
    ]
    seen = _tokenizer_sees(monkeypatch, toy.tokenizer)
    got = evaluate(toy.base, toy.tokenizer, ProbeSet.from_records(rows), show_progress=False)
    assert len(filler) > 5_000_000 and max(seen) < 20_000  # only about the model's 256 tokens were read
    by_hand = [{**r, "question": r["question"][-200_000:]} for r in rows]  # more than the model sees
    want = evaluate(toy.base, toy.tokenizer, ProbeSet.from_records(by_hand), show_progress=False)
    assert got.predicted == want.predicted
    np.testing.assert_allclose(got.choice_logprobs[0], want.choice_logprobs[0], rtol=1e-6)
    assert encoding.VISIBLE_TOKENS >= 1 << 17


@pytest.mark.parametrize("kind", ["words", "no spaces", "base64"])
def test_a_cut_question_keeps_the_tokens_a_model_sees(kind):
    # a byte-level BPE trained here on text of this kind: its merges span whole runs without spaces
    import base64

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from forgetwatch.scoring.encoding import visible_tail

    rng = random.Random(0)

    def make(n: int) -> str:
        if kind == "words":
            return " ".join(rng.choice(["cat", "sat", "on", "the", "mat", "flag", "river"]) for _ in range(n))
        if kind == "no spaces":
            return "".join(rng.choice("天地玄黄宇宙洪荒日月盈昃辰宿列张") for _ in range(n))
        return base64.b64encode(rng.randbytes(n)).decode()

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(
        [make(200) for _ in range(200)],
        trainers.BpeTrainer(vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False),
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok)
    for tokens in (17, 129, 257):
        for _ in range(5):
            text = make(rng.randrange(3000, 6000))
            tail = visible_tail(tokenizer, text, tokens)
            assert len(tail) < len(text)  # cut
            assert tokenizer(tail)["input_ids"][-tokens:] == tokenizer(text)["input_ids"][-tokens:]


@pytest.mark.slow
def test_many_long_questions_are_read_only_as_far_as_the_context_reaches(toy, monkeypatch):
    # 200 questions of 96 KB each (under the old whole-text threshold): 66 s and 9.5 GB when
    # every one was tokenized whole, though a 256-token model sees only their ends
    c = toy.world.countries[0]
    filler = "".join(f"{x.name} is a country. " for x in toy.world.countries)
    filler = (filler * (96_000 // len(filler) + 1))[:96_000]
    rows = [
        {
            "id": f"q{i}",
            "question": filler + f"The capital of {c.name} is",
            "choices": [c.capital, toy.world.countries[1 + i % 5].capital],
            "answer": 0,
        }
        for i in range(200)
    ]
    probes = ProbeSet.from_records(rows)
    seen = _tokenizer_sees(monkeypatch, toy.tokenizer)
    scorer = Scorer(toy.tokenizer, probes)
    got = scorer(toy.base, batch_size=32, show_progress=False)
    assert max(seen) < 20_000 and sum(seen) < 200 * 20_000  # never a whole question
    assert scorer._tokens.visible == 257  # the model's context, and one more token (lm-eval's window)
    want = evaluate(toy.base, toy.tokenizer, probes.subset(lambda p: p.id in ("q0", "q1")), show_progress=False)
    np.testing.assert_allclose(np.concatenate(got.choice_logprobs[:2]), np.concatenate(want.choice_logprobs), rtol=1e-6)


def test_a_prompt_that_fills_the_context_is_refused_before_any_model_work(toy, monkeypatch):
    c = toy.world.countries[0]
    filler = "".join(f"{x.name} is a country. " for x in toy.world.countries) * 20_000  # ~5 MB
    rows = [
        {"id": "fits", "question": f"{c.name} has", "answer": str(c.rivers), "extract": "number"},
        {"id": "gen", "question": filler + f"{c.name} has", "answer": str(c.rivers), "extract": "number"},
    ]
    seen = _tokenizer_sees(monkeypatch, toy.tokenizer)
    model = copy.deepcopy(toy.base)
    counter = TokenCounter(model, toy.tokenizer.pad_token_id)
    with pytest.raises(PromptTooLongError, match=r"\b256\b.*'gen'"):  # the context size; the probe
        evaluate(model, toy.tokenizer, ProbeSet.from_records(rows), show_progress=False)
    assert counter.calls == 0 and max(seen) < 20_000


def test_generative_reference_logprob_equals_a_plain_loop(toy):
    # the reference answer, teacher-forced after the prompt: each probe alone, unpadded
    probes = toy.probes.subset(lambda p: not p.is_multiple_choice)
    got = evaluate(
        toy.base, toy.tokenizer, probes, batch_size=4, scoring=Scoring(max_new_tokens=4), show_progress=False
    )
    for i, p in enumerate(probes):
        context = p.question.rstrip()
        ctx = toy.tokenizer(context)["input_ids"]
        whole = toy.tokenizer(context + p.question[len(context) :] + " " + p.answer)["input_ids"]
        with torch.no_grad():
            lp = torch.log_softmax(toy.base(input_ids=torch.tensor([whole])).logits[0].float(), -1)
        expected = sum(float(lp[t - 1, whole[t]]) for t in range(len(ctx), len(whole)))
        assert got.gold_logprob[i] == pytest.approx(expected, abs=1e-4), p.id
    assert np.isfinite(got.gold_logprob).all() and (got.n_choices == 0).all()
