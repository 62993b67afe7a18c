"""The logged metric names and values, and the console lines (:class:`ConsoleLines` prints them); a figure that does not apply (NaN) is left out, so
none reaches a logger or a file."""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from forgetwatch.common.console import say
from forgetwatch.common.text import pct
from forgetwatch.results.answers import Answers
from forgetwatch.results.events import BaseSnapshot, Ending, Evaluation
from forgetwatch.results.noise import smallest_detectable
from forgetwatch.results.report import TransitionReport

logger = logging.getLogger("forgetwatch")

PREFIX = "forgetwatch/"
EVAL_PREFIX = "eval_forgetwatch_"

#: logged names, each a TransitionReport attribute but where _ATTRIBUTE says (contract names first, then drift warnings)
METRICS = (
    "forgetting backward_transfer forgetting_adjusted backward_transfer_adjusted forgotten gained accuracy "
    "accuracy_base forgetting_events forgetting_persistent at_risk logprob_drop choice_kl forgotten_agreed gained_agreed "
    "robust/accuracy robust/accuracy_base robust/forgotten"
).split()
_ATTRIBUTE = {
    "accuracy": "accuracy_after",
    "accuracy_base": "accuracy_before",
    "robust/accuracy": "robust_accuracy_after",
    "robust/accuracy_base": "robust_accuracy_before",
    "robust/forgotten": "robust_forgotten",
}


def _figures(report: TransitionReport, prefix: str, behaviour: bool = True) -> dict[str, float]:
    values = {f"{prefix}{name}": getattr(report, _ATTRIBUTE.get(name, name)) for name in METRICS}
    if behaviour:  # how the responses drift: forgetwatch/behaviour/<figure>
        values.update((f"{prefix}behaviour/{name}", v) for name, v in report.behaviour.items())
    # None and NaN: the figure does not apply
    return {key: float(value) for key, value in values.items() if value is not None and math.isfinite(value)}


def metric_values(report: TransitionReport) -> dict[str, float]:
    """``forgetwatch/<name>`` overall and ``forgetwatch/<category>/<name>`` for each category, figures that do not
    apply left out."""
    out = _figures(report, PREFIX)
    for cat, child in report.by_category.items():
        out.update(_figures(child, f"{PREFIX}{cat}/"))
    return out


def evaluation_metrics(
    logged: TransitionReport, kept: Mapping[str, Mapping[str, Any]], drift: Mapping[str, float]
) -> dict[str, float]:
    """What an evaluation logs: the figures of its ``logged`` report, the kept plug-ins' and train KL's."""
    out = metric_values(logged)
    for plugin in kept.values():
        out.update((f"{PREFIX}{name}", value) for name, value in plugin["metrics"].items())
    if "train_kl" in drift:
        out[f"{PREFIX}drift/train_kl"] = drift["train_kl"]
    return out


def logged_categories(
    groups: Sequence[str], right: Sequence[bool], min_right: int, limit: int, categories: int | None = None
) -> tuple[set[str] | bool, str | None]:
    """Which categories (or groups) get keys of their own for the whole run: all (``True``), or those with
    at least ``min_right`` probes right at the base, the ``limit`` largest; and a sentence saying what is left out."""
    sizes = Counter(groups)
    base_right = Counter(g for g, r in zip(groups, right) if r)
    enough = [g for g in sizes if base_right[g] >= min_right]
    chosen = sorted(enough, key=lambda g: (-sizes[g], g))[:limit]
    if len(chosen) == len(sizes):
        return True, None
    reasons = []
    if small := len(sizes) - len(enough):
        reasons.append(
            f"{small} with fewer than {min_right} probes right at the base, too few to tell forgetting "
            f"from zero (min_logged_right={min_right})"
        )
    if over := len(enough) - len(chosen):
        reasons.append(f"{over} beyond the {limit} largest (max_logged_categories={limit})")
    units = "categories" if categories is None else f"groups (of {categories} categories)"
    return set(chosen), (
        f"per-category figures are logged{' by group' if categories is not None else ''} for "
        f"{len(chosen) or 'none'} of {len(sizes)} {units}; not logged: {', '.join(reasons)}; "
        "history.jsonl and the report keep all of them"
    )


def eval_metric_values(report: TransitionReport) -> dict[str, float]:
    """Overall figures as trainer evaluation metrics (``eval_forgetwatch_forgetting``, ...)."""
    return _figures(report, EVAL_PREFIX, behaviour=False)


def base_line(base: Answers, snapshot: Path, computed: bool) -> str:
    """The line printed once the base is known: accuracy, probes, the smallest detectable rate, the noise floor."""
    k, rate = smallest_detectable(len(base))
    line = (
        f"[forgetwatch] base: accuracy {pct(base.accuracy)} on {len(base)} probes "
        f"({len(set(base.categories))} categories); forgetting under {pct(rate)} ({k} probes) cannot be told "
        "from zero here"
    )
    if "noise_floor" in base.meta:
        line += (
            f"; noise floor {pct(base.meta['noise_floor'])} (right, then wrong when scored again; "
            f"{base.meta['noise_flips']} probes flipped either way)"
        )
    sampling = base.scoring.get("sampling")
    if sampling:  # what sampling costs: each response generated once per sample
        line += (
            f"; sampled, {sampling['samples']} answers a probe (temperature {sampling['temperature']:g}, top-p "
            f"{sampling['top_p']:g}, seed {sampling['seed']}): {sampling['samples']}x the generation"
        )
    return line + f"; snapshot {snapshot}" + ("" if computed else " (loaded)")


def lm_eval_lines(answers: Answers, lead: str = "") -> list[str]:
    """Each lm-eval task's accuracy as lm-eval reports it (``fw_cap: acc,none 0.3500 (14/40)``)."""
    labels = answers.meta.get("lm_eval") or {}
    categories = np.asarray(answers.categories)
    lines = []
    for task, label in sorted(labels.items()):
        right = answers.correct[categories == task]
        if len(right):
            lines.append(
                f"[forgetwatch] {lead}lm-eval {task}: {label} {right.mean():.4f} ({int(right.sum())}/{len(right)})"
            )
    return lines


def console_line(step: int, report: TransitionReport, train_kl: float | None = None) -> str:
    """One short line per evaluation (``train_kl``: the train-KL signal, when measured)."""
    return (
        f"[forgetwatch] step {step}: forgetting {pct(report.forgetting)} "
        f"(adjusted {pct(report.forgetting_adjusted)}), backward transfer "
        f"{pct(report.backward_transfer)}, accuracy {pct(report.accuracy_after)} "
        f"(base {pct(report.accuracy_before)}); {report.forgotten} forgotten, "
        f"{report.gained} gained of {report.n}, {len(report.at_risk_ids)} at risk"
        + (f"; under every seed {report.forgotten_agreed} forgotten" if report.agreement else "")
        + (f"; train KL {train_kl:.3g}" if train_kl is not None else "")
    )


class ConsoleLines:
    """Prints the base's and each evaluation's line (when ``verbose``), and the stop line (always), naming
    ``history`` and ``stop_note(step)`` (what the trainer does on stopping, e.g. "; saving checkpoint ...")."""

    def __init__(self, history: Path, verbose: bool = True, stop_note: Callable[[int], str] = lambda _: ""):
        self.history, self.verbose, self.stop_note = history, verbose, stop_note

    def on_base(self, snapshot: BaseSnapshot) -> None:
        if self.verbose:
            say(base_line(snapshot.answers, snapshot.path, snapshot.computed))
            for line in [*lm_eval_lines(snapshot.answers, "base, "), *(f"[forgetwatch] {n}" for n in snapshot.notes)]:
                say(line)

    def on_ending(self, ending: Ending) -> None:
        say(f"[forgetwatch] {ending.line}")  # what the user asked for: printed however quiet the run

    def on_evaluation(self, evaluation: Evaluation) -> None:
        if self.verbose:
            line = console_line(evaluation.step, evaluation.report, evaluation.drift.get("train_kl"))
            say("; ".join([line, *evaluation.notes]))
        if evaluation.stop:
            # on its own line above any progress bar, where a person sees it; and to the logs
            message = (
                f"stopping training at step {evaluation.step}: {evaluation.stop}"
                f"{self.stop_note(evaluation.step)}; history {self.history}"
            )
            say(f"[forgetwatch] {message}")
            logger.info("forgetwatch: %s", message)
