"""What a replay pool covers, and the losses it cannot reach (pure functions, hand-made reports)."""

from __future__ import annotations

import math

from trainers import run_view

from forgetwatch.replay.replay import uncovered
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


def test_only_a_pool_that_tells_categories_apart_warns():
    report = TransitionReport(by_category={"a": cat(10, 5), "b": cat(10, 5)})
    assert list(uncovered(report, ["a", "all"], ["a", "b"], {})) == ["b"]  # general rows cover nothing
    assert uncovered(report, ["all"], ["a", "b"], {}) == {}  # general rows only: nothing told apart
    assert uncovered(report, ["a", "b"], ["a", "b"], {}) == {}  # every category covered


def test_uncovered_losses_need_two_probes_and_a_rate_over_the_floor():
    report = TransitionReport(
        by_category={"a": cat(10, 5), "one": cat(5, 1), "b": cat(100, 4), "c": cat(50, 3), "empty": TransitionReport()}
    )
    probes = ["a", "one", "b", "c", "empty"]
    assert list(uncovered(report, ["a"], probes, {})) == ["b", "c"]  # 1 is too few
    assert list(uncovered(report, ["a"], probes, {"b": 0.05, "c": 0.05})) == ["c"]
    assert list(uncovered(report, ["a"], probes, {"c": 0.06})) == ["b"]  # above, not at


def test_the_uncovered_warning_says_what_and_what_to_do():
    warnings = uncovered(REPORT, ["facts", "arithmetic"], ["arithmetic", "facts", "refusal"], {})
    assert warnings == {
        "refusal": "9 of the 40 'refusal' probes are forgotten (22%), and the replay pool has no 'refusal' rows "
        "(it covers arithmetic, facts): replay cannot repair them; add rows of category 'refusal' to the pool"
    }


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
    assert list(uncovered(report, ["refusal", "math"], ["refusal", "facts", "math"], {})) == ["facts"]
    assert (
        "2 of the 4 'facts' probes are forgotten (50%)" in uncovered(report, ["math"], ["facts", "math"], {})["facts"]
    )


def test_replay_warns_once_of_a_category_it_cannot_repair(caplog):
    from forgetwatch import ReplayPool
    from forgetwatch.replay import Replay
    from forgetwatch.toy import ToyWorld

    world = ToyWorld(seed=0)
    tokenizer = world.tokenizer()
    pool = ReplayPool.from_records([{"id": "r0", "text": "Paris is the capital of France.", "category": "facts"}])
    replay = Replay(pool)
    replay.probe_categories = ["refusal", "facts"]  # as hold_out(probes) sets them
    replay.begin(world.model(tokenizer), run_view(tokenizer))
    forgetting = TransitionReport(by_category={"refusal": cat(10, 4), "facts": cat(20, 0)})
    with caplog.at_level("WARNING", logger="forgetwatch"):
        replay.on_evaluation(forgetting)
        replay.on_evaluation(forgetting)
    said = [r.getMessage() for r in caplog.records if "cannot repair" in r.getMessage()]
    assert len(said) == 1 and "4 of the 10 'refusal' probes are forgotten (40%)" in said[0]
    assert replay.state()["warned"] == ["refusal"]
