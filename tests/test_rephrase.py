"""Rephrasing groups (CapTrack's C5a): probes sharing a ``group`` ask one question in several wordings; a report
counts the groups right under every wording before and now, and the groups that broke, as a plain loop over the
groups does; a run logs them and its report page lists the groups that broke."""

from __future__ import annotations

import json
import random

import pytest
from test_probes import load_error, places

from forgetwatch import ProbeSet, Watch, compare, evaluate
from forgetwatch.results.metrics import robust_figures

WORDINGS = ("The capital of {} is", "Fact: The capital of {} is", "Remember: The capital of {} is")


def grouped_rows(toy):
    """16 capitals (multiple choice) in three wordings each, a group per country, and one probe in no group."""
    rows = [r for r in toy.world.probe_records() if r["question"].startswith("The capital of ")][:16]
    grouped = []
    for r in rows:
        country = r["question"].removeprefix("The capital of ").removesuffix(" is")
        for j, wording in enumerate(WORDINGS):
            grouped.append({**r, "id": f"{r['id']}/{j}", "question": wording.format(country), "group": country})
    return grouped + [{"id": "alone", "question": "The capital of Nowhere is", "choices": ["Nil", "Null"], "answer": 0}]


def robust_by_hand(groups, before, after):
    members = {}
    for g, b, a in zip(groups, before, after):
        if g is not None:
            members.setdefault(g, []).append((b, a))
    right_before = {g: all(b for b, _ in m) for g, m in members.items()}
    right_after = {g: all(a for _, a in m) for g, m in members.items()}
    broke = sorted(g for g in members if right_before[g] and not right_after[g])
    return sum(right_before.values()) / len(members), sum(right_after.values()) / len(members), broke


def test_robust_figures_equal_a_plain_loop_over_the_groups():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 12)
        groups = [rng.choice([None, "a", "b", "c"]) for _ in range(n)]
        before, after = [rng.random() < 0.7 for _ in range(n)], [rng.random() < 0.6 for _ in range(n)]
        got = robust_figures(groups, before, after)
        if all(g is None for g in groups):
            assert got == {}
            continue
        share_before, share_after, broke = robust_by_hand(groups, before, after)
        assert got["robust_accuracy_before"] == pytest.approx(share_before)
        assert got["robust_accuracy_after"] == pytest.approx(share_after)
        assert got["robust_forgotten_groups"] == broke and got["robust_forgotten"] == len(broke)
        assert type(got["robust_forgotten"]) is int


@pytest.mark.slow
def test_a_run_logs_what_broke_and_its_page_lists_the_groups(toy, tmp_path):
    from forgetwatch.page.html import write_report

    probes = ProbeSet.from_records(grouped_rows(toy))
    base = evaluate(toy.base, toy.tokenizer, probes, show_progress=False)
    tuned = evaluate(toy.tuned, toy.tokenizer, probes, show_progress=False)
    report = compare(base, tuned)
    share_before, share_after, broke = robust_by_hand(base.groups, base.correct.tolist(), tuned.correct.tolist())
    assert (report.robust_accuracy_before, report.robust_accuracy_after) == pytest.approx((share_before, share_after))
    assert report.robust_forgotten_groups == broke and broke  # the tuned toy breaks some
    assert f"{len(broke)} broke" in report.summary() and "of the groups right in every wording" in report.summary()
    assert base.groups[-1] is None and base.groups[:3] == [base.groups[0]] * 3
    # a watched run: logged, kept in the history, on the report page
    watch = Watch(probes, output_dir=tmp_path / "run", eval_steps=1, output=None)
    watch.start(toy.base, toy.tokenizer)
    logged = watch.evaluate(toy.tuned, 1).metrics
    assert logged["forgetwatch/robust/forgotten"] == len(broke)
    assert logged["forgetwatch/robust/accuracy_base"] == pytest.approx(share_before)
    watch.finish(toy.tuned, 1)
    page = write_report([tmp_path / "run"], tmp_path / "report.html").read_text()
    assert "Rephrasings that broke" in page and all(g in page for g in broke)


@pytest.mark.parametrize(
    "rows, line, names",  # names: what the error must name (the group; the other probe and both categories)
    [
        ([{"group": "g"}, {}], 1, ["'g'"]),
        ([{"group": "g"}, {"group": "g", "category": "other"}], 2, ["'all'", "'p1'", "'other'"]),
        ([{"group": 7}, {}], 1, []),
    ],
)
def test_a_bad_group_is_one_error_naming_the_line(tmp_path, rows, line, names):
    lines = [json.dumps({"id": f"p{i + 1}", "question": "q", "answer": "a", **r}) for i, r in enumerate(rows)]
    err, path = load_error(tmp_path, lines)
    assert places(err) == [(path, line, "group")] and all(n in err.errors[0].message for n in names)
