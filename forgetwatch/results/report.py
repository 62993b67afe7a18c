"""TransitionReport: the per-sample transition counts and rates, as a table, a dict or a CSV."""

from __future__ import annotations

import csv
import math
import numbers
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forgetwatch.behaviour.drift import SHARES
from forgetwatch.common.files import atomic_write, json_safe
from forgetwatch.common.text import pct
from forgetwatch.results.answers import Answers, chosen_text

#: Columns of :meth:`TransitionReport.rows` and :meth:`TransitionReport.to_csv`, in the paper's order.
ROW_COLUMNS = tuple(
    "category n acc_before acc_after 0->0 0->1 1->0 1->1 forgetting backward_transfer forgetting_adjusted "
    "backward_transfer_adjusted forgetting_max backward_transfer_max mcnemar_p".split()
)
#: The report's field of each column named otherwise.
_FIELD = dict(
    zip(
        "acc_before acc_after 0->0 0->1 1->0 1->1".split(),
        "accuracy_before accuracy_after never gained forgotten kept".split(),
    )
)
#: Columns of :func:`write_samples_csv`.
SAMPLE_COLUMNS = tuple(
    "id category question answer correct_before correct_after transition predicted_before predicted_after "
    "choice_index_before choice_index_after output_before output_after gold_logprob_before gold_logprob_after".split()
)
#: Significant digits of the numbers CSV files hold (no 0.24000000000000002).
CSV_DIGITS = 6

_NAN = math.nan


@dataclass(frozen=True)
class TransitionReport:
    """How answers changed between a base model (before) and the current model (after), as
    :func:`~forgetwatch.compare` makes it: counts (``forgotten`` 1→0, ``gained`` 0→1, ``kept`` 1→1, ``never`` 0→0)
    and rates of ``n`` (NaN when ``n == 0``); the trajectory's figures are NaN outside a run. Sampled answers only:
    ``forgotten_agreed`` / ``gained_agreed`` (1->0 / 0->1 under every seed) and ``agreement``
    (:func:`~forgetwatch.results.metrics.seed_agreement`). Rephrasing groups only: ``robust_*``
    (:func:`~forgetwatch.results.metrics.robust_figures`).

    Example:
        >>> r = TransitionReport(n=2, forgotten=1, kept=1)
        >>> r.forgotten, r.by_category
        (1, {})
    """

    n: int = 0
    forgotten: int = 0
    gained: int = 0
    kept: int = 0
    never: int = 0
    accuracy_before: float = _NAN
    accuracy_after: float = _NAN
    forgetting: float = _NAN
    backward_transfer: float = _NAN
    forgetting_adjusted: float = _NAN
    backward_transfer_adjusted: float = _NAN
    forgetting_max: float = _NAN
    backward_transfer_max: float = _NAN
    forgetting_relative: float = _NAN
    backward_transfer_relative: float = _NAN
    forgetting_ci: tuple[float, float] = (_NAN, _NAN)
    backward_transfer_ci: tuple[float, float] = (_NAN, _NAN)
    mcnemar_p: float = 1.0
    logprob_drop: float = _NAN
    choice_kl: float = _NAN
    forgotten_ids: list[str] = field(default_factory=list)
    gained_ids: list[str] = field(default_factory=list)
    at_risk: float = _NAN
    at_risk_ids: list[str] = field(default_factory=list)
    forgetting_events: float = _NAN
    forgetting_persistent: float = _NAN
    behaviour: dict[str, float] = field(default_factory=dict)
    forgotten_agreed: int | None = None
    gained_agreed: int | None = None
    agreement: list[dict[str, float]] = field(default_factory=list)
    robust_accuracy_before: float = _NAN
    robust_accuracy_after: float = _NAN
    robust_forgotten: int | None = None
    robust_forgotten_groups: list[str] = field(default_factory=list)
    by_category: dict[str, TransitionReport] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: NaN (and infinity) → ``None``, tuples → lists, ``by_category`` nested."""
        out = {name: json_safe(getattr(self, name)) for name in self.__dataclass_fields__ if name != "by_category"}
        return {**out, "by_category": {cat: child.to_dict() for cat, child in self.by_category.items()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TransitionReport:
        """Inverse of :meth:`to_dict` (``None`` back to NaN; missing fields take their defaults).

        Example:
            >>> r = TransitionReport(n=2, forgotten=1, kept=1, forgotten_ids=["a"])
            >>> TransitionReport.from_dict(r.to_dict()).forgotten_ids
            ['a']
        """
        values: dict[str, Any] = {}
        for name in cls.__dataclass_fields__.keys() & data.keys():
            value, kind = data[name], cls.__dataclass_fields__[name].type
            if name == "by_category":
                value = {cat: cls.from_dict(child) for cat, child in (value or {}).items()}
            elif name.endswith("_ci"):
                value = tuple(_NAN if v is None else float(v) for v in (value or (None, None)))
            elif name == "behaviour":
                value = {k: float(v) for k, v in (value or {}).items() if v is not None}
            elif kind in ("float", float):
                value = _NAN if value is None else float(value)
            elif kind == "int | None" and value is not None:
                value = int(value)
            values[name] = value
        return cls(**values)

    def _row(self, category: str) -> dict[str, Any]:
        return {
            "category": category,
            **{column: getattr(self, _FIELD.get(column, column)) for column in ROW_COLUMNS[1:]},
        }

    def rows(self) -> list[dict[str, Any]]:
        """One dict per row: ``"overall"`` first, then each category (keys :data:`ROW_COLUMNS`).

        Example:
            >>> [r["category"] for r in TransitionReport().rows()]
            ['overall']
        """
        return [self._row("overall")] + [child._row(cat) for cat, child in self.by_category.items()]

    def to_csv(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`rows` as CSV, atomically (NaN as an empty cell, text :func:`spreadsheet_safe`).

        Example:
            >>> report.to_csv("transitions.csv")  # doctest: +SKIP
        """
        return _write_csv(path, ROW_COLUMNS, self.rows())

    def summary(self) -> str:
        """A plain-text table, one row for ``overall`` then one per category.

        Example:
            >>> print(TransitionReport().summary().splitlines()[0].split()[:3])
            ['category', 'n', 'acc_before']
        """
        header = [*"category n acc_before acc_after F BT F_adj BT_adj forgotten gained".split(), "McNemar p"]
        keys = "acc_before acc_after forgetting backward_transfer forgetting_adjusted backward_transfer_adjusted"
        table = [header] + [
            [str(r["category"]), str(r["n"]), *(_fmt(r[k]) for k in keys.split())]
            + [str(r["1->0"]), str(r["0->1"]), "-" if math.isnan(r["mcnemar_p"]) else f"{r['mcnemar_p']:.3g}"]
            for r in self.rows()
        ]
        widths = [max(map(len, column)) for column in zip(*table)]  # numbers right-aligned: digits line up
        lines = ["  ".join([r[0].ljust(widths[0]), *map(str.rjust, r[1:], widths[1:])]).rstrip() for r in table]
        lines.insert(1, "-" * len(lines[0]))
        if not (math.isnan(self.logprob_drop) and math.isnan(self.choice_kl)):
            lines.append(
                f"multiple-choice drift: gold logprob drop {_fmt(self.logprob_drop)}, choice KL {_fmt(self.choice_kl)}"
            )
        if b := self.behaviour:  # how the generated responses drift, next to what they were at the base
            ratio = f"{b['length_ratio_words']:.2f}x the base's length in words, " if "length_ratio_words" in b else ""
            shares = ", ".join(
                f"{name} {pct(b[name])} (base {pct(b[name + '_base'])})"
                for name in SHARES
                if b[name] or b[name + "_base"] or name == "refusals"
            )
            lines.append(f"responses: {ratio}{shares}")
        if self.agreement:  # sampled answers: what every seed agrees on
            lines.append(
                f"under all {self.agreement[-1]['seeds']} seeds: {self.forgotten_agreed} forgotten, "
                f"{self.gained_agreed} gained (one seed: {self.agreement[0]['forgotten_mean']:.2f} forgotten on average)"
            )
        if not math.isnan(self.robust_accuracy_before):  # rephrasing groups
            lines.append(
                f"rephrasings: {pct(self.robust_accuracy_after)} of the groups right in every wording "
                f"(base {pct(self.robust_accuracy_before)}); {self.robust_forgotten} broke"
            )
        return "\n".join(lines)

    __str__ = summary


def write_samples_csv(base: Answers, current: Answers, path: str | os.PathLike[str], probes: Any = None) -> Path:
    """Write one CSV row per sample (:data:`SAMPLE_COLUMNS`), atomically; question and answer from ``probes``."""
    base.check_compatible(current)
    return _write_csv(path, SAMPLE_COLUMNS, (_sample_row(base, current, i, probes) for i in range(len(base))))


def _sample_row(base: Answers, current: Answers, i: int, probes: Any) -> dict[str, Any]:
    probe = probes[i] if probes is not None else None
    row = {
        "id": base.ids[i],
        "category": base.categories[i],
        "question": probe.question if probe else None,
        "answer": probe.answer_text if probe else None,
        "transition": f"{int(base.correct[i])}->{int(current.correct[i])}",
    }
    for answers, when in ((base, "before"), (current, "after")):
        predicted, choice = answers.predicted[i], bool(answers.n_choices[i])
        row |= {
            f"correct_{when}": int(answers.correct[i]),
            f"predicted_{when}": chosen_text(predicted, probe.choices if probe else None) if choice else predicted,
            f"choice_index_{when}": int(predicted) if choice and isinstance(predicted, numbers.Integral) else "",
            f"output_{when}": answers.outputs[i],
            f"gold_logprob_{when}": float(answers.gold_logprob[i]),
        }
    return row


def _write_csv(path: str | os.PathLike[str], columns: tuple[str, ...], rows: Iterable[dict[str, Any]]) -> Path:
    path = Path(path)
    with atomic_write(path) as f:
        # every text cell quoted: a "\r" inside an id would otherwise end the row early
        writer = csv.DictWriter(f, fieldnames=columns, lineterminator="\n", quoting=csv.QUOTE_NONNUMERIC)
        writer.writeheader()
        writer.writerows({k: _csv_value(v) for k, v in row.items()} for row in rows)
    return path


def _csv_value(v: Any) -> Any:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return float(f"{v:.{CSV_DIGITS}g}")
    return spreadsheet_safe(v) if isinstance(v, str) else v


#: What makes a spreadsheet read a cell as a formula (or, tab and CR, hide that it is one).
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def spreadsheet_safe(text: str) -> str:
    """``text`` for a CSV cell: a leading ``'`` added when a spreadsheet would run it as a formula (unless a number);
    to read it back, drop one leading ``'`` when the rest, after any further ``'``, starts so."""
    if text.lstrip("'").startswith(FORMULA_START) and not _NUMBER.fullmatch(text):
        return "'" + text
    return text


def _fmt(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.4f}"
