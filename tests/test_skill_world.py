"""The skill world's data is what it says: four skills, probes held out from the pool and the
prompts, right answers, a target that never holds a probe's question (no training here)."""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

import pytest

from forgetwatch import ProbeSet, ReplayPool

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the replay benchmark's world
from skill_world import LETTERS, SKILLS, SkillWorld  # noqa: E402


@pytest.fixture(scope="module", params=[0, 3])
def world(request) -> SkillWorld:
    return SkillWorld(seed=request.param)


@pytest.fixture(scope="module")
def probes(world) -> ProbeSet:
    return ProbeSet.from_records(world.probe_records())


def test_every_skill_has_its_probes_of_its_own_kind(world, probes):
    assert Counter(p.category for p in probes) == dict.fromkeys(SKILLS, 40)
    kinds = {c: {p.kind.value for p in probes if p.category == c} for c in SKILLS}
    assert kinds == {
        "facts": {"multiple choice"},
        "arithmetic": {"generative"},
        "uppercase": {"generative"},
        "refusal": {"behaviour"},
    }


def test_the_pool_and_the_prompts_are_disjoint_from_the_probes(world, probes):
    pool = ReplayPool.from_records(world.pool_records())
    pool.check_disjoint(probes)
    assert set(pool.categories) == set(SKILLS)
    prompts = world.prompt_records()
    assert [r["id"] for r in prompts] == [r.id for r in pool]
    assert all(set(r) == {"id", "prompt", "category"} for r in prompts)
    # until pools take prompt rows, the prompts are checked as text rows
    ReplayPool.from_records(
        [{"id": r["id"], "text": r["prompt"], "category": r["category"]} for r in prompts]
    ).check_disjoint(probes)
    for row, prompt in zip(pool, prompts):  # a prompt is its row without the answer
        assert row.text.startswith(prompt["prompt"]) and len(row.text) > len(prompt["prompt"])


def test_the_arithmetic_and_the_uppercase_answers_are_right(world, probes):
    for p in probes:
        if p.category == "arithmetic":
            a, b = map(int, re.fullmatch(r"add (\d) (\d) =", p.question).groups())
            assert p.answer == str(a + b) and p.extract == "number"
        elif p.category == "uppercase":
            letters = re.fullmatch(r"up ([a-h]) ([a-h]) ([a-h]) =", p.question).groups()
            assert p.answer == " ".join(letters).upper() and p.extract == "exact"
    for line in world.pretrain_texts():
        if m := re.fullmatch(r"add (\d) (\d) = (\d+)", line):
            assert int(m[1]) + int(m[2]) == int(m[3])


def test_the_target_never_holds_a_probe_question_and_the_held_out_is_apart(world, probes):
    texts = world.target_texts(400, seed=1)
    assert {t.split()[0] for t in texts} == {"max", "rev"}
    rows = [{"id": f"t{i}", "text": t} for i, t in enumerate(texts)]
    rows += [{"id": f"d{i}", "text": " ".join(p.values())} for i, p in enumerate(world.target_pairs(400, seed=1))]
    ReplayPool.from_records(rows).check_disjoint(probes)
    for t in texts:
        if m := re.fullmatch(r"max (\d) (\d) = (\d)", t):
            assert max(int(m[1]), int(m[2])) == int(m[3])
    held_out = world.held_out_target()
    prompts = [h["prompt"] for h in held_out]
    assert len(prompts) == len(set(prompts)) == 40
    for h in held_out:  # the answer is the larger digit, after a space, as the target lines hold it
        a, b = map(int, re.fullmatch(r"max (\d) (\d) =", h["prompt"]).groups())
        assert h["answer"] == f" {max(a, b)}"
    assert not {h["prompt"] + h["answer"] for h in held_out} & set(texts)
    assert not set(prompts) & {p["prompt"] for p in world.target_pairs(400, seed=1)}
    assert not set(prompts) & {t.rsplit(" ", 1)[0] for t in texts}


def test_the_target_mix_is_the_share_of_rev_lines_and_pairs():
    world = SkillWorld(seed=0, target_mix=0.25)
    assert sum(t.startswith("rev ") for t in world.target_texts(200, seed=2)) == 50
    pairs = world.target_pairs(200, seed=2)
    assert sum(p["prompt"].startswith("rev ") for p in pairs) == 50
    assert all(p["chosen"] != p["rejected"] for p in pairs)  # the sum is never the max
    assert not any(t.startswith("rev ") for t in SkillWorld(seed=0, target_mix=0.0).target_texts(200, seed=2))
    with pytest.raises(ValueError, match="target_mix"):
        SkillWorld(target_mix=1.5)


def test_every_spaced_letter_and_digit_is_one_token(world):
    tokenizer = world.tokenizer()
    for ch in LETTERS + LETTERS.upper() + "0123456789":
        assert len(tokenizer(f" {ch}", add_special_tokens=False)["input_ids"]) == 1, ch
    word = tokenizer("up b a d = B A D", add_special_tokens=False)["input_ids"]
    assert len(word) == 8  # up, three letters, =, three letters
    # the held-out answer is scored as its own tokens after the prompt's: the same ids as the whole line
    for h in world.held_out_target(5):
        whole = tokenizer(h["prompt"] + h["answer"])["input_ids"]
        assert (
            whole == tokenizer(h["prompt"])["input_ids"] + tokenizer(h["answer"], add_special_tokens=False)["input_ids"]
        )
