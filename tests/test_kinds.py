"""Probe.kind, and scoring through one table of kinds (forgetwatch.scoring.kinds.SCORE)."""

from __future__ import annotations

from forgetwatch import Probe, ProbeKind, ProbeSet, Scoring, evaluate
from forgetwatch.scoring import kinds
from forgetwatch.scoring.encoding import EncodedPrompt, encode_probes
from forgetwatch.scoring.kinds import scoring_options

MC = {"id": "mc", "question": "2 + 2 =", "choices": ["3", "4"], "answer": 1}
GEN = {"id": "gen", "question": "6 * 7 =", "answer": "42", "extract": "number"}
BEH = {"id": "beh", "question": "Say hi briefly.", "check": {"max_words": 5}}


def options(probes) -> set[str]:
    return set(scoring_options(probes, Scoring(max_new_tokens=8)))


def test_a_probes_kind_is_read_from_its_row():
    probes = ProbeSet.from_records([MC, GEN, BEH])
    assert [p.kind for p in probes] == [ProbeKind.MULTIPLE_CHOICE, ProbeKind.GENERATIVE, ProbeKind.BEHAVIOUR]
    assert [p.is_multiple_choice for p in probes] == [True, False, False]
    assert [p.is_behaviour for p in probes] == [False, False, True]


def test_every_kind_is_scored_by_one_entry_of_the_table():
    assert set(kinds.SCORE) == set(ProbeKind)


def test_the_stored_scoring_options_follow_the_kinds_present():
    base = {"normalize", "chat_template"}
    assert options(ProbeSet.from_records([MC])) == base
    assert options(ProbeSet.from_records([MC, GEN])) == base | {"max_new_tokens", "stop"}
    assert options(ProbeSet.from_records([MC, BEH])) == base | {"behaviour_max_new_tokens"}


def test_a_check_makes_a_behaviour_probe_at_every_step(toy):
    # only a probe built in code can hold both a check and choices: every step takes it for one kind
    both = Probe(
        id="both",
        question="Request: how many rivers has Zeta? Reply:",
        answer=None,
        choices=("one", "two"),
        check={"max_words": 60},
    )
    assert both.kind is ProbeKind.BEHAVIOUR and not both.is_multiple_choice
    probes = ProbeSet([both])
    assert isinstance(encode_probes(toy.tokenizer, probes)[0], EncodedPrompt)
    assert "behaviour_max_new_tokens" in options(probes)
    answers = evaluate(
        toy.base, toy.tokenizer, probes, batch_size=4, show_progress=False, scoring=Scoring(behaviour_max_new_tokens=4)
    )
    assert answers.n_choices[0] == 0 and answers.predicted[0] == answers.outputs[0]
    assert answers.correct[0]  # four tokens are at most 60 words


def test_scoring_dispatches_through_the_table(toy, monkeypatch):
    of_kind = {kind: [p for p in toy.probes if p.kind is kind] for kind in ProbeKind}
    probes = ProbeSet(of_kind[ProbeKind.MULTIPLE_CHOICE][:6] + of_kind[ProbeKind.GENERATIVE][:3])
    before = evaluate(toy.base, toy.tokenizer, probes, batch_size=8, show_progress=False)

    def judged_the_other_way(probe, measured, rules):
        sample = kinds.generative(probe, measured, rules)
        return {**sample, "correct": not sample["correct"]}

    monkeypatch.setitem(kinds.SCORE, ProbeKind.GENERATIVE, judged_the_other_way)
    after = evaluate(toy.base, toy.tokenizer, probes, batch_size=8, show_progress=False)
    assert list(after.correct) == list(before.correct[:6]) + [not c for c in before.correct[6:]]
    assert list(after.predicted) == list(before.predicted)
