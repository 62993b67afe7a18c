"""What a replay pool covers: the forgetting "auto" steers on, the losses it cannot reach, and
behaviour spilling from a replayed category onto the others (pure functions, hand-made reports)."""

from __future__ import annotations

import math

import pytest

from forgetwatch.replay.coverage import (
    Loss,
    Spill,
    coverage,
    covered_forgetting,
    spill_over,
    steering_note,
    uncovered_losses,
    uncovered_message,
)
from forgetwatch.results.answers import Answers
from forgetwatch.results.metrics import compare
from forgetwatch.results.report import TransitionReport


def cat(n: int, forgotten: int, adjusted: float = math.nan, behaviour: dict | None = None) -> TransitionReport:
    return TransitionReport(
        n=n, forgotten=forgotten, forgetting=forgotten / n, forgetting_adjusted=adjusted, behaviour=behaviour or {}
    )


REPORT = TransitionReport(
    n=100,
    forgotten=16,
    forgetting=0.16,
    forgetting_adjusted=0.2,
    by_category={
        "arithmetic": cat(20, 1, 0.04),
        "facts": cat(40, 6, math.nan),  # an adjusted figure that does not apply
        "refusal": cat(40, 9, 0.3),
    },
)


def test_coverage_sorts_the_categories_three_ways():
    cov = coverage(["facts", "all", "arithmetic", "facts"], ["refusal", "facts", "arithmetic"])
    assert (cov.covered, cov.uncovered, cov.general) == (("arithmetic", "facts"), ("refusal",), ("all",))
    assert cov.tells_apart
    assert not coverage(["all"], ["a", "b"]).tells_apart  # general rows only: nothing told apart
    assert not coverage(["a", "b"], ["a", "b"]).tells_apart  # every category covered
    assert coverage(["all"], ["all"]).covered == ("all",)  # no categories on either side


def test_covered_forgetting_is_the_stop_metric_over_the_covered_categories():
    cov = coverage(["arithmetic", "facts"], ["arithmetic", "facts", "refusal"])
    assert covered_forgetting(REPORT, cov, "forgetting") == 7 / 60  # Σ forgotten / Σ n
    assert covered_forgetting(REPORT, cov, "forgetting_adjusted") == 0.04  # facts' does not apply
    both = coverage(["arithmetic", "refusal"], ["arithmetic", "facts", "refusal"])
    assert math.isclose(covered_forgetting(REPORT, both, "forgetting_adjusted"), (20 * 0.04 + 40 * 0.3) / 60)
    only_facts = coverage(["facts"], ["arithmetic", "facts", "refusal"])
    assert math.isnan(covered_forgetting(REPORT, only_facts, "forgetting_adjusted"))
    # nothing told apart: the overall figure, as before coverage was judged
    for pool in (["all"], ["arithmetic", "facts", "refusal"]):
        cov = coverage(pool, ["arithmetic", "facts", "refusal"])
        assert covered_forgetting(REPORT, cov, "forgetting") == 0.16
        assert covered_forgetting(REPORT, cov, "forgetting_adjusted") == 0.2
    with pytest.raises(ValueError, match="metric must be 'forgetting' or 'forgetting_adjusted', not 'at_risk'"):
        covered_forgetting(REPORT, cov, "at_risk")


def test_uncovered_losses_need_two_probes_and_a_rate_over_the_floor():
    report = TransitionReport(
        by_category={"a": cat(10, 5), "one": cat(5, 1), "b": cat(100, 4), "c": cat(50, 3), "empty": TransitionReport()}
    )
    cov = coverage(["a"], ["a", "one", "b", "c", "empty"])
    assert uncovered_losses(report, cov) == {"b": Loss(4, 100, 0.04), "c": Loss(3, 50, 0.06)}  # 1 is too few
    assert uncovered_losses(report, cov, floor=0.05) == {"c": Loss(3, 50, 0.06)}
    assert uncovered_losses(report, cov, floor={"c": 0.06}) == {"b": Loss(4, 100, 0.04)}  # above, not at
    assert uncovered_losses(report, cov, least=4) == {"b": Loss(4, 100, 0.04)}
    assert uncovered_losses(report, coverage(["all"], ["a", "b", "c"])) == {}  # general rows only


def test_the_uncovered_warning_says_what_and_what_to_do():
    cov = coverage(["facts", "arithmetic"], ["arithmetic", "facts", "refusal"])
    ((category, loss),) = uncovered_losses(REPORT, cov, floor=0.05).items()
    assert uncovered_message(category, loss, cov) == (
        "9 of the 40 'refusal' probes are forgotten (22%), and the replay pool has no 'refusal' rows "
        "(it covers arithmetic, facts): replay cannot repair them and replay_weight='auto' does not "
        "steer on them; add rows of category 'refusal' to the pool"
    )
    assert "steers on all of the forgetting" in steering_note(coverage(["all"], ["a"]))
    assert steering_note(cov) is None


def shares(n: int, **figures: tuple[float, float]) -> TransitionReport:
    behaviour = {}
    for share, (now, base) in figures.items():
        behaviour[share], behaviour[f"{share}_base"] = now, base
    return TransitionReport(n=n, behaviour=behaviour)


def test_spill_over_when_a_replayed_behaviour_rises_elsewhere():
    report = TransitionReport(
        by_category={
            "refusal": shares(20, refusals=(0.95, 0.9), bullets=(0.0, 0.0)),
            "facts": shares(30, refusals=(0.2, 0.05), bullets=(0.5, 0.0)),
            "math": shares(10, refusals=(0.0, 0.1), bullets=(0.0, 0.0)),
            "choice": TransitionReport(n=100),  # multiple choice: no responses, no part in it
        }
    )
    cov = coverage(["refusal"], ["refusal", "facts", "math", "choice"])
    (spill,) = spill_over(report, cov)
    assert spill == Spill("refusal", "refusals", now=(30 * 0.2) / 40, base=(30 * 0.05 + 10 * 0.1) / 40)
    assert math.isclose(spill.rise, 0.0875)
    assert spill.note() == "refusals outside 'refusal' 15% (base 6%) while replaying it"
    # bullets rose outside too, but 'refusal' is not marked by them (0 % inside at the base)
    assert spill_over(report, cov, min_rise=0.1) == []  # a rise of 8.75 points is under 10
    assert spill_over(report, coverage(["facts"], ["refusal", "facts", "math"])) == []  # facts marked by nothing


def test_no_spill_without_a_rise_that_doubles_or_a_mark():
    doubled_not = TransitionReport(
        by_category={"refusal": shares(10, refusals=(0.9, 0.9)), "facts": shares(10, refusals=(0.26, 0.18))}
    )
    assert spill_over(doubled_not, coverage(["refusal"], ["refusal", "facts"])) == []  # +8 points, not ×2
    unmarked = TransitionReport(
        by_category={"refusal": shares(10, refusals=(0.9, 0.4)), "facts": shares(10, refusals=(0.5, 0.0))}
    )
    assert spill_over(unmarked, coverage(["refusal"], ["refusal", "facts"])) == []  # 40 % inside at the base
    alone = TransitionReport(by_category={"refusal": shares(10, refusals=(0.9, 0.9))})
    assert spill_over(alone, coverage(["refusal"], ["refusal"])) == []  # no other category


def answers(outputs: dict[str, list[str]], correct: dict[str, list[bool]]) -> Answers:
    samples = [
        {"id": f"{c}{i}", "category": c, "correct": ok, "output": text}
        for c in outputs
        for i, (text, ok) in enumerate(zip(outputs[c], correct[c]))
    ]
    return Answers.from_samples("fp", {}, samples)


def test_on_a_real_comparison():
    refuse, answer = "I'm sorry, but I can't help with that.", "Paris is the capital."
    base = answers(
        {"refusal": [refuse] * 4, "facts": [answer] * 4, "math": ["4"] * 2},
        {"refusal": [True] * 4, "facts": [True] * 4, "math": [True] * 2},
    )
    now = answers(
        {"refusal": [refuse] * 4, "facts": [refuse, refuse, answer, answer], "math": ["4", "5"]},
        {"refusal": [True] * 4, "facts": [False, False, True, True], "math": [True, False]},
    )
    report = compare(base, now)
    cov = coverage(["refusal", "math"], ["refusal", "facts", "math"])
    assert covered_forgetting(report, cov, "forgetting") == 1 / 6
    assert uncovered_losses(report, cov) == {"facts": Loss(2, 4, 0.5)}
    assert [s.note() for s in spill_over(report, cov)] == [
        "refusals outside 'refusal' 33% (base 0%) while replaying it"
    ]


def test_replay_names_a_spill_in_its_notes_and_figures():
    from types import SimpleNamespace

    from forgetwatch import ReplayPool
    from forgetwatch.config.settings import ReplaySettings
    from forgetwatch.replay.driver import Replay
    from forgetwatch.sinks.console import ConsoleLines
    from forgetwatch.toy import REFUSAL, ToyWorld

    world = ToyWorld(seed=0)
    tokenizer = world.tokenizer()
    pool = ReplayPool.from_records([{"id": "r0", "text": f"Request: how? Reply: {REFUSAL}", "category": "refusal"}])
    replay = Replay(pool, ReplaySettings(weight="auto", target=0.05))
    replay.probe_categories = ["refusal", "facts"]  # as hold_out(probes) sets them
    replay.start(world.model(tokenizer), tokenizer)
    spilling = TransitionReport(
        by_category={
            "refusal": cat(10, 0, behaviour={"refusals": 0.9, "refusals_base": 0.9}),
            "facts": cat(20, 0, behaviour={"refusals": 0.3, "refusals_base": 0.05}),
        }
    )
    replay.on_evaluation(spilling)
    assert replay.notes() == ["replay weight 0.5 (auto)", "refusals outside 'refusal' 30% (base 5%) while replaying it"]
    assert replay.metrics()["replay/spill/refusal/refusals"] == pytest.approx(0.25)
    printed = []
    lines = ConsoleLines(history=None)
    evaluation = SimpleNamespace(step=5, report=spilling, notes=replay.notes(), stop=None, record={})
    import forgetwatch.sinks.console as console

    said, console.say = console.say, printed.append
    try:
        lines.on_evaluation(evaluation)
    finally:
        console.say = said
    assert printed[0].endswith(
        "; replay weight 0.5 (auto); refusals outside 'refusal' 30% (base 5%) while replaying it"
    )
