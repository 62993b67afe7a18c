"""Curves of forgetting and backward transfer over training, from a history of evaluations: a PNG (matplotlib)
or a few lines of text for the console."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from forgetwatch.common.files import atomic_write
from forgetwatch.common.text import pct

#: A history's records, as :func:`~forgetwatch.results.run_files.read_history` reads them from its
#: ``history.jsonl``: ``{"step": int, "report": dict}``.
History = Sequence[Mapping[str, Any]]
Point = tuple[int, Mapping[str, Any]]  # (step, report)

#: Most entries the PNG legend shows; further categories are drawn grey as "+N more".
LEGEND_MAX = 12

_BLACK = "black"  # the overall curves
_GREY = "#b5b5b5"  # the categories past the legend's room
_PANELS = (
    ("Forgetting (correct → wrong)", "forgetting", "forgetting_adjusted", "forgetting_ci"),
    ("Backward transfer (wrong → correct)", "backward_transfer", "backward_transfer_adjusted", "backward_transfer_ci"),
)


def _points(history: History) -> list[Point]:
    # a resumed run can evaluate a step twice; the later evaluation is the current truth
    by_step = {int(r["step"]): r["report"] for r in history}
    if not by_step:
        raise ValueError("the history has no evaluations to plot (has the run reached its first evaluation?)")
    return sorted(by_step.items())


def _categories(report: Mapping[str, Any]) -> Mapping[str, Mapping[str, Any]]:
    return report.get("by_category") or {}


def _num(report: Mapping[str, Any] | None, key: str, index: int | None = None) -> float:
    # missing or null: NaN, a gap in a curve
    value = (report or {}).get(key)
    if index is not None:
        value = value[index] if value else None
    return math.nan if value is None else float(value)


def text_curve(history: History, width: int = 60) -> str:
    """The overall forgetting (F) and backward transfer (BT) as text, a line per evaluation with a bar of ``#``
    proportional to F (the largest fills the line to ``width``)."""
    points = _points(history)
    step_w = max(len(str(step)) for step, _ in points)
    f_values = [_num(report, "forgetting") for _, report in points]
    heads = [
        f"step {step:>{step_w}}  F {pct(f, 4, '-')}  BT {pct(_num(report, 'backward_transfer'), 4, '-')}"
        for (step, report), f in zip(points, f_values)
    ]
    top = max((f for f in f_values if math.isfinite(f)), default=0.0)
    bar_max = max(width - max(len(h) for h in heads) - 2, 10)
    # negative or NaN rates get no bar
    bars = [max(0, min(round(bar_max * f / top), bar_max)) if top > 0 and math.isfinite(f) else 0 for f in f_values]
    return "\n".join(f"{head}  {'#' * n}".rstrip() for head, n in zip(heads, bars))


def plot_history(history: History, out_png: str | os.PathLike[str], *, title: str | None = None) -> Path:
    """Draw forgetting and backward transfer by training step from the base on, overall (adjusted dashed, 95 %
    interval grey) and per category, into a PNG written atomically; ``ImportError`` without matplotlib."""
    return plot_runs({None: history}, out_png, title=title)


def plot_runs(runs: Mapping[str | None, History], out_png: str | os.PathLike[str], *, title: str | None = None) -> Path:
    """Several runs (a sweep) in one PNG: a row of :func:`plot_history`'s panels per run, one y axis."""
    fig = _runs_figure(list(runs.items()), title)
    with atomic_write(out_png, "wb") as f:
        fig.savefig(f, format="png", dpi=120)
    return Path(out_png)


def _runs_figure(runs: Sequence[tuple[str | None, History]], title: str | None) -> Any:
    """The ``Figure`` of :func:`plot_runs` (Agg canvas, no pyplot)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch
        from matplotlib.ticker import MaxNLocator, PercentFormatter
    except ImportError as e:
        raise ImportError(
            'plotting needs matplotlib: pip install "forgetwatch[plot]" (or: pip install matplotlib)'
        ) from e

    rows = [_points(history) for _, history in runs]
    # per row and panel: the overall rate, its chance-adjusted one, its interval's ends
    curves = [
        [[_curve(points, *k) for k in ((key,), (adj,), (ci, 0), (ci, 1))] for _, key, adj, ci in _PANELS]
        for points in rows
    ]
    categories = _ranked_categories([p for points in rows for p in points])
    if len(categories) == 1:  # one category (e.g. the default "all") is the overall curve again
        categories = []

    # legend budget: fixed entries first, then categories; overflow becomes "+N more"
    fixed: list[Any] = [Line2D([], [], color=_BLACK, lw=2.6, marker="o", label="overall")]
    if any(_differs(adj, f) for row in curves for f, adj, _, _ in row):
        fixed.append(Line2D([], [], color=_BLACK, lw=1.8, ls="--", label="overall, chance-adjusted"))
    if any(_has_data(low + high) for row in curves for *_, low, high in row):
        fixed.append(Patch(color=_BLACK, alpha=0.12, label="overall, 95% interval"))
    room = LEGEND_MAX - len(fixed)
    named = categories if len(categories) <= room else categories[: room - 1]
    others = categories[len(named) :]
    # drawn back to front: grey overflow, coloured categories, then the overall curves
    styles = {c: {"color": _GREY, "lw": 0.9, "ms": 2, "alpha": 0.8, "zorder": 1} for c in others}
    styles |= {
        c: {"color": k, "lw": 1.4, "ms": 3.5, "alpha": 0.9, "zorder": 2} for c, k in zip(named, _palette(len(named)))
    }
    handles = fixed + [Line2D([], [], color=styles[c]["color"], lw=1.4, marker="o", ms=3.5, label=c) for c in named]
    if others:
        handles.append(Line2D([], [], color=_GREY, lw=1.0, label=f"+{len(others)} more categories"))

    ncol = min(len(handles), 4)
    height = 4.6 if len(rows) == 1 else 0.6 + 3.4 * len(rows)
    fig = Figure(figsize=(12.0, height + 0.28 * math.ceil(len(handles) / ncol)), layout="constrained")
    FigureCanvasAgg(fig)  # attaches the Agg canvas to fig; no global backend change
    # one y scale for all panels, so a small BT is not read as large as the F beside it, and
    # one run's rates not as large as another's
    grid = fig.subplots(len(rows), 2, sharex=True, sharey=True, squeeze=False)
    for r, (points, axes, (name, _)) in enumerate(zip(rows, grid, runs)):
        steps = [step for step, _ in points]
        steps = steps if steps[0] <= 0 else [0, *steps]
        for ax, (panel_title, key, _, _), (rate, adjusted, low, high) in zip(axes, _PANELS, curves[r]):
            for c, style in styles.items():
                ax.plot(steps, _curve(points, key, category=c), marker="o", **style)
            if _has_data(low + high):
                ax.fill_between(steps, low, high, color=_BLACK, alpha=0.12, lw=0, zorder=3)
                if len(steps) == 1:  # a band over one step has no width: draw it as a bar
                    ax.vlines(steps, low, high, color=_BLACK, alpha=0.12, lw=8, zorder=3)
            if _differs(adjusted, rate):
                ax.plot(steps, adjusted, color=_BLACK, lw=1.8, ls="--", marker="o", ms=3, zorder=4)
            ax.plot(steps, rate, color=_BLACK, lw=2.6, marker="o", ms=5, zorder=5)
            for x, y in [(x, y) for x, y in zip(steps, rate) if math.isfinite(y)][-1:]:
                ax.annotate(
                    pct(y), (x, y), xytext=(6, 4), textcoords="offset points", size="small", weight="bold", zorder=6
                )
            if r == 0:
                ax.set_title(panel_title)
            if r == len(rows) - 1:
                ax.set_xlabel("training step")
            ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(True, alpha=0.3)
            ax.margins(x=0.08)  # room for the last-value label
        axes[0].set_ylabel("share of probes" if name is None else f"{name}\nshare of probes")
    # rates are never below 0; fixed only once every panel holds data (earlier would cut off the others), and a
    # visible range kept when all are 0 or NaN
    top = grid[0][0].get_ylim()[1]
    grid[0][0].set_ylim(0.0, top if top > 0 and math.isfinite(top) else 0.01)

    n = _num(rows[0][-1][1], "n")
    what = f"{len(rows[0])} evaluation{'s' * (len(rows[0]) != 1)}" if len(rows) == 1 else f"{len(rows)} runs"
    what += f", {int(n)} probes" if math.isfinite(n) else ""
    fig.suptitle(f"{title or 'forgetwatch: forgetting during training'}  ({what})")
    fig.legend(handles=handles, loc="outside lower center", ncol=ncol, frameon=False, fontsize="small")
    return fig


def _curve(points: list[Point], key: str, index: int | None = None, category: str | None = None) -> list[float]:
    """A rate at each point, from the base on: 0 there where the first evaluation has it (when not evaluated)."""
    ys = [_num(r if category is None else _categories(r).get(category), key, index) for _, r in points]
    return ys if points[0][0] <= 0 else [0.0 if math.isfinite(ys[0]) else math.nan, *ys]


def _ranked_categories(points: Sequence[Point]) -> list[str]:
    """Categories by peak forgetting, then by name."""
    peak: dict[str, float] = {}
    for _, report in points:
        for cat, rep in _categories(report).items():
            peak[cat] = max(peak.get(cat, -math.inf), _num(rep, "forgetting"))  # NaN never wins
    return sorted(peak, key=lambda c: (-peak[c], c))


def _has_data(values: Sequence[float]) -> bool:
    return any(map(math.isfinite, values))


def _differs(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether curve ``a`` has data and is not just ``b``."""
    finite = [(x, y) for x, y in zip(a, b) if math.isfinite(x)]
    return any(not (math.isfinite(y) and math.isclose(x, y, abs_tol=1e-12)) for x, y in finite)


def _palette(n: int) -> list[Any]:
    """``n`` distinct colours, none grey (grey is "+N more")."""
    from matplotlib import colormaps

    tab20 = colormaps["tab20"]
    # strong shades first, then their light partners; tab20's 14/15 are the greys
    order = [i for i in range(0, 20, 2) if i != 14] + [i for i in range(1, 20, 2) if i != 15]
    return [tab20(order[i % len(order)]) for i in range(n)]
