"""Sampled scoring (Harmon et al.'s protocol): each answer drawn with a seed of (run seed, probe id, sample), equal to
a plain decoding loop that draws with that seed, on any batch size; the seeds' agreement equals a plain count over
every combination of seeds; greedy scoring is untouched."""

from __future__ import annotations

import itertools
import json
import statistics

import numpy as np
import pytest
import torch

from forgetwatch import Answers, ProbeKind, ProbeSet, Scorer, Scoring, TransitionReport, compare, evaluate
from forgetwatch.config import ConfigError
from forgetwatch.probes.extract import extractor_for, is_correct, reference_for
from forgetwatch.results.metrics import seed_agreement
from forgetwatch.scoring.generation import sample_seed

SAMPLED = Scoring(samples=3, temperature=2.0, top_p=0.95, seed=3, max_new_tokens=6)


@pytest.fixture(scope="module")
def probes(toy):
    """12 generative probes and 4 multiple-choice ones."""
    rows = toy.world.probe_records(generative=True)
    generative = [r for r in rows if "choices" not in r][:12]
    return ProbeSet.from_records(generative + [r for r in rows if "choices" in r][:4])


@pytest.fixture(scope="module")
def sampled(toy, probes):
    """The base's sampled answers at batch sizes 1, 4 and 16."""
    return {
        bs: evaluate(toy.base, toy.tokenizer, probes, batch_size=bs, show_progress=False, scoring=SAMPLED)
        for bs in (1, 4, 16)
    }


def draw_by_hand(logits, temperature, top_p, generator):
    """One token: the probabilities from the likeliest down until they reach top_p, then u * their sum looked up in
    a running total, u the generator's next float64."""
    probs = torch.softmax(logits.double() / temperature, dim=-1).tolist()
    kept, total = [], 0.0
    for token in sorted(range(len(probs)), key=lambda t: -probs[t]):
        kept.append(token)
        total += probs[token]
        if total >= top_p:
            break
    u = torch.rand((), generator=generator, dtype=torch.float64).item() * total
    running = 0.0
    for token in kept:
        running += probs[token]
        if u < running:
            return token
    return kept[-1]


def response_by_hand(model, tokenizer, prompt, seed, max_new_tokens=6, stop="\n"):
    """A plain loop: the whole sequence through the model at each step, one token drawn with the seed's generator."""
    generator = torch.Generator().manual_seed(seed)
    ids, new = list(prompt), []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(torch.tensor([ids])).logits[0, -1]
            token = draw_by_hand(logits, SAMPLED.temperature, SAMPLED.top_p, generator)
            if token == tokenizer.eos_token_id:
                break
            ids.append(token)
            new.append(token)
            if stop in tokenizer.decode(new, skip_special_tokens=True):
                break
    return tokenizer.decode(new, skip_special_tokens=True).split(stop)[0]


@pytest.mark.slow
def test_each_sample_equals_a_plain_loop_drawing_with_its_seed(toy, probes, sampled):
    answers = sampled[4]
    prompts = Scorer(toy.tokenizer, probes).encoded
    toy.base.eval()
    checked = 0
    for i, probe in enumerate(probes):
        if probe.kind is not ProbeKind.GENERATIVE:
            assert answers.samples_correct[i].tolist() == [bool(answers.correct[i])] * 3  # one verdict, repeated
            continue
        texts = [
            response_by_hand(toy.base, toy.tokenizer, prompts[i].prompt, sample_seed(3, probe.id, j)) for j in range(3)
        ]
        verdicts = [
            is_correct(extractor_for(probe.extract)(t), reference_for(probe.extract, probe.answer)) for t in texts
        ]
        assert answers.outputs[i] == texts[0], probe.id
        assert answers.samples_correct[i].tolist() == verdicts, probe.id
        assert answers.correct[i] == (sum(verdicts) >= 2)  # the majority
        checked += 1
    assert checked == 12
    assert len({tuple(row) for row in answers.samples_correct.tolist()}) > 1  # the seeds drew differently


@pytest.mark.slow
def test_batch_size_does_not_change_a_sampled_answer(sampled):
    one = sampled[1]
    for bs in (4, 16):
        assert sampled[bs].outputs == one.outputs
        assert sampled[bs].samples_correct.tolist() == one.samples_correct.tolist()


def agreement_by_hand(before, after):
    rows = []
    k = len(before[0])
    for m in range(1, k + 1):
        lost, won = [], []
        for combo in itertools.combinations(range(k), m):
            lost.append(sum(all(b[s] and not a[s] for s in combo) for b, a in zip(before, after)))
            won.append(sum(all(not b[s] and a[s] for s in combo) for b, a in zip(before, after)))
        rows.append(
            (m, statistics.mean(lost), statistics.pvariance(lost), statistics.mean(won), statistics.pvariance(won))
        )
    return rows


def test_seed_agreement_equals_a_plain_count_over_every_combination():
    rng = np.random.default_rng(0)
    for k in (1, 2, 3, 5):
        before, after = rng.random((40, k)) < 0.6, rng.random((40, k)) < 0.5
        got = [
            value
            for r in seed_agreement(before, after)
            for value in (r["seeds"], r["forgotten_mean"], r["forgotten_var"], r["gained_mean"], r["gained_var"])
        ]
        assert got == pytest.approx([v for row in agreement_by_hand(before.tolist(), after.tolist()) for v in row])
        assert [r["combinations"] for r in seed_agreement(before, after)] == [
            len(list(itertools.combinations(range(k), m))) for m in range(1, k + 1)
        ]


def sampled_answers(rows):
    """Answers of sampled verdicts per probe (the majority as ``correct``)."""
    samples = [
        {"id": f"p{i}", "correct": sum(r) * 2 > len(r), "samples_correct": r, "category": "c"}
        for i, r in enumerate(rows)
    ]
    return Answers.from_samples("fp", {"sampling": {"samples": 3}}, samples)


def test_compare_reports_what_every_seed_agrees_on_and_it_survives_the_files(tmp_path):
    base = sampled_answers([[True, True, True], [True, True, False], [False, False, False], [True, False, False]])
    now = sampled_answers([[False, False, False], [False, True, False], [True, True, True], [True, True, True]])
    report = compare(base, now)
    assert (report.forgotten_agreed, report.gained_agreed) == (1, 1)  # p0 lost under all three; p2 won under all
    assert type(report.forgotten_agreed) is int and type(report.gained_agreed) is int  # counts, not 1.0
    assert report.agreement[0] == {
        "seeds": 1,
        "combinations": 3,
        "forgotten_mean": 4 / 3,
        "forgotten_var": pytest.approx(2 / 9),
        "gained_mean": pytest.approx(5 / 3),  # p2 under every seed, p3 under seeds 1 and 2
        "gained_var": pytest.approx(2 / 9),
    }
    assert report.forgotten == 2  # by the majority: p0, p1
    assert "under all 3 seeds: 1 forgotten, 1 gained (one seed: 1.33 forgotten on average)" in report.summary()
    for path in (tmp_path / "a.json", tmp_path / "a.npz"):
        base.save(path)
        assert Answers.load(path).samples_correct.tolist() == base.samples_correct.tolist()
    from forgetwatch.results.history import history_record
    from forgetwatch.store.read import read_history

    record = history_record(1, report, time=0.0, seconds=0.0, trigger="schedule")
    (tmp_path / "history.jsonl").write_text(json.dumps(record) + "\n")
    [read] = read_history(tmp_path / "history.jsonl")
    assert read["report"]["agreement"] == report.to_dict()["agreement"]
    again = TransitionReport.from_dict(read["report"])
    assert (again.forgotten_agreed, again.gained_agreed) == (1, 1) and type(again.forgotten_agreed) is int


def test_greedy_scoring_is_what_it_was(toy, probes):
    greedy = evaluate(toy.base, toy.tokenizer, probes, show_progress=False, scoring=Scoring(max_new_tokens=6))
    explicit = evaluate(
        toy.base,
        toy.tokenizer,
        probes,
        show_progress=False,
        scoring=Scoring(max_new_tokens=6, samples=1, temperature=0),
    )
    assert greedy.samples_correct is None and "sampling" not in greedy.scoring
    assert greedy.to_dict()["samples"] == explicit.to_dict()["samples"]
    assert "samples_correct" not in greedy.samples()[0]
    assert compare(greedy, explicit).forgotten_agreed is None and compare(greedy, explicit).agreement == []


def test_sampled_and_greedy_answers_are_not_compared(toy, probes):
    greedy = evaluate(toy.base, toy.tokenizer, probes, show_progress=False, scoring=Scoring(max_new_tokens=6))
    one = evaluate(
        toy.base, toy.tokenizer, probes, show_progress=False, scoring=Scoring(max_new_tokens=6, temperature=0.7)
    )
    assert one.samples_correct.shape == (len(probes), 1)
    with pytest.raises(ValueError, match="other scoring options"):
        compare(greedy, one)


@pytest.mark.parametrize(
    "settings, key",
    [
        ({"samples": 3}, "samples"),  # one greedy answer three times
        ({"samples": 17, "temperature": 1.0}, "samples"),
        ({"top_p": 0, "temperature": 1.0}, "top_p"),
        ({"temperature": -1}, "temperature"),
        ({"temperature": 1e-310, "samples": 3}, "temperature"),  # a denormal: replies were empty
        ({"temperature": 0.009}, "temperature"),
    ],
)
def test_bad_sampling_options_are_one_clear_error(settings, key):
    with pytest.raises(ConfigError) as caught:
        Scoring(**settings)
    assert [e.key for e in caught.value.errors] == [key]


@pytest.mark.slow
def test_the_command_line_samples_and_refuses_options_that_do_not_go_together(toy, probes, tmp_path, capsys):
    from forgetwatch.cli import main

    probes.to_jsonl(tmp_path / "p.jsonl")
    common = ["compare", "--base", toy.base_dir, "--model", toy.tuned_dir, "--probes", str(tmp_path / "p.jsonl")]
    assert main([*common, "--samples", "3", "--no-progress"]) == 2
    assert "--samples: samples=3 with temperature=0" in capsys.readouterr().err
    out = tmp_path / "out"
    options = ["--samples", "3", "--temperature", "2", "--top-p", "0.95", "--seed", "3", "--max-new-tokens", "6"]
    assert main([*common, *options, "--no-progress", "--out", str(out)]) == 0
    saved = Answers.load(out / "base_answers.json")
    assert (
        saved.samples_correct.tolist()
        == evaluate(toy.base, toy.tokenizer, probes, show_progress=False, scoring=SAMPLED).samples_correct.tolist()
    )
