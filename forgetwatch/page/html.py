"""``forgetwatch report``: one self-contained HTML page (Plotly, offline) of one or more runs."""

from __future__ import annotations

import html
import json
import math
import os
from collections.abc import Sequence
from itertools import cycle
from pathlib import Path
from typing import Any

import numpy as np

from forgetwatch.behaviour.drift import SHARES
from forgetwatch.common.files import atomic_write
from forgetwatch.common.text import describe, first_line, pct
from forgetwatch.probes import ProbeKind
from forgetwatch.results.report import TransitionReport
from forgetwatch.sinks.logged import lm_eval_lines
from forgetwatch.sinks.tables import shown_answer
from forgetwatch.store import HISTORY, SUBDIR, SWEEP
from forgetwatch.store.read import Run, read_run, run_directory

#: Probes listed in each table of the page.
TOP = 25
PathLike = str | os.PathLike[str]


def load_run(path: PathLike) -> Run:
    """A run from its forgetwatch directory or the trainer's output directory."""
    path = run_directory(path)
    if not (path / HISTORY).is_file():
        raise FileNotFoundError(
            f"{path}: no {HISTORY}; give a run's forgetwatch directory (OUTPUT_DIR/{SUBDIR}) "
            "or the trainer's output directory"
        )
    return read_run(path)


def _has_behaviour(run: Run) -> bool:
    return any(p.kind is ProbeKind.BEHAVIOUR for p in run.probes.values())


def _curve(run: Run, key: str) -> tuple[list[int], list[float | None]]:
    """A report's field, or a behaviour figure, at each step from the base on (where not evaluated: its value)."""
    if key in TransitionReport.__dataclass_fields__:
        values, base = _series(run, key), run.trajectory.correct[:, 0]
        at_base = (float(base.mean()) if len(base) else None) if key.startswith("accuracy") else 0.0
    else:
        values = [_num(report.behaviour.get(key)) for _, report in run.history]
        first = run.history[0][1].behaviour if run.history else {}
        at_base = 1.0 if key.startswith("length_ratio") else first.get(key.removesuffix("_base") + "_base")
    if run.steps and run.steps[0] <= 0:  # the base step was evaluated itself
        return run.steps, values
    return [0, *run.steps], [at_base if not values or values[0] is not None else None, *values]


def _series(run: Run, key: str, category: str | None = None) -> list[float | None]:
    reports = [r if category is None else r.by_category.get(category) for _, r in run.history]
    return [None if r is None else _num(getattr(r, key)) for r in reports]


def write_report(run_dirs: Sequence[PathLike], out: PathLike, *, top: int = TOP) -> Path:
    """Write the HTML page of the runs, atomically; needs ``plotly``."""
    runs = [load_run(d) for d in run_dirs]
    seen: dict[str, int] = {}
    for run in runs:  # two runs of one name: the second is "name (2)"
        seen[run.name] = seen.get(run.name, 0) + 1
        if seen[run.name] > 1:
            run.name = f"{run.name} ({seen[run.name]})"
    page = _page(runs, top)
    with atomic_write(out) as f:
        f.write(page)
    return Path(out)


def write_sweep_page(sweep: dict[str, Any], out: PathLike) -> Path:
    """Write the page of a merge sweep (``MergeSweep.to_dict()``): forgetting and the target's gain against α."""
    page = _html("forgetwatch merge", [_sweep(sweep, "")])
    with atomic_write(out) as f:
        f.write(page)
    return Path(out)


def read_sweep(path: Path) -> dict[str, Any]:
    """A ``sweep.json`` as the page draws it; a ``ValueError`` names the file and the field that is wrong."""
    try:
        sweep = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: not a readable JSON file ({first_line(err)})") from None
    if problem := _sweep_problem(sweep):
        raise ValueError(f"{path}: {problem}; write it again (forgetwatch merge --out) or remove it")
    return sweep


def _sweep_problem(sweep: Any) -> str | None:
    rows = sweep.get("rows") if isinstance(sweep, dict) else None
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        return "field 'rows': expected a list of the sweep's rows (objects)"
    for i, row in enumerate(rows):
        for key, optional in (("alpha", False), ("forgetting", False), ("forgetting_adjusted", True), ("gain", True)):
            if not (_is_number(value := row.get(key)) or optional and value is None):
                return f"field 'rows[{i}].{key}': expected a number, got {describe(value)}"
    if not _is_number(sweep.get("keep")):
        return f"field 'keep': expected a number, got {describe(sweep.get('keep'))}"
    if sweep.get("best") not in [r["alpha"] for r in rows]:
        return f"field 'best': expected the alpha of one of its rows, got {describe(sweep.get('best'))}"
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _sweep(sweep: dict[str, Any], name: str) -> dict[str, Any]:
    rows, best = sweep["rows"], sweep["best"]
    alphas = [r["alpha"] for r in rows]
    forgetting = [r["forgetting"] if r["forgetting_adjusted"] is None else r["forgetting_adjusted"] for r in rows]
    label = f"chosen: alpha {best:g}, keeping {sweep['keep']:.0%} of the gain"
    chosen = _line([best], [forgetting[alphas.index(best)]], label, "black", "solid")
    chosen |= {"mode": "markers", "marker": {"size": 14, "symbol": "star", "color": "black"}}
    data = [
        _line(alphas, forgetting, "forgetting (chance-adjusted where it applies)", _COLORS[0], "solid"),
        _line(alphas, [r["gain"] for r in rows], "share of the target's gain kept", _COLORS[1], "dash"),
        chosen,
    ]
    for line in data:
        line["hovertemplate"] = "alpha %{x}: %{y:.1%}<extra></extra>"
    layout = _layout(f"{name + ': ' if name else ''}merging base (alpha 0) and tuned (alpha 1) weights", "share")
    layout["xaxis"]["title"]["text"] = "alpha"
    return {"data": data, "layout": layout}


def _html(title: str, parts: list[str | dict[str, Any]]) -> str:
    try:
        from plotly.offline import get_plotlyjs
    except ImportError:
        raise ImportError(
            'forgetwatch report draws its charts with plotly: pip install "forgetwatch[report]"'
        ) from None
    body = "\n".join(p if isinstance(p, str) else _figure(p, f"fig-{k}") for k, p in enumerate(parts))
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
        f"<style>{_CSS}</style><script>{get_plotlyjs()}</script></head>\n<body>{body}</body></html>\n"
    )


def _page(runs: list[Run], top: int) -> str:
    title = "forgetwatch: " + ", ".join(r.name for r in runs)
    parts: list[str | dict[str, Any]] = [f"<h1>{_e(title)}</h1>", _summary(runs), "<h2>Over training</h2>"]
    parts += [*_curves(runs), _survival(runs), *([_behaviour(runs)] if any(map(_has_behaviour, runs)) else [])]
    for run in runs:
        groups = {g: _group_forgetting(run, cs) for g, cs in _groups(run).items()}
        categories = {c: _series(run, "forgetting", c) for c in sorted(set(run.trajectory.categories))}
        parts += [
            f"<h2>{_e(run.name) if len(runs) > 1 else 'By category and by probe'}</h2>",
            *([_heatmap(run, groups, "group")] if groups else []),
            _heatmap(run, categories, "category"),
            _probe_tables(run, top),
        ]
        if (run.dir / SWEEP).is_file():  # forgetwatch merge --out into the run directory
            parts.append(_sweep(read_sweep(run.dir / SWEEP), run.name))
    return _html(title, parts)


def _summary(runs: list[Run]) -> str:
    head = "run, probes, categories, base accuracy, accuracy, forgetting, backward transfer, forgetting events, noise floor"
    rows = [_tr([*head.split(", "), "last evaluation", "stopped"], "th")]
    for run in runs:
        t, last = run.trajectory, run.history[-1][1] if run.history else TransitionReport()
        stop = next((r["stop"] for r in run.records if "stop" in r), None)
        floor = run.noise_floor
        cells = [run.name, len(t.ids), len(set(t.categories)), pct(float(t.correct[:, 0].mean()))]
        cells += [pct(last.accuracy_after), pct(last.forgetting), pct(last.backward_transfer)]
        cells += [int(t.forgetting_events().sum()), "-" if floor is None else pct(floor)]
        rows.append(_tr([*cells, f"step {run.steps[-1]}" if run.steps else "-", stop or ""]))
    # lm-eval probes: each task's base accuracy as lm-eval reports it, to check against its number
    lm_eval = [
        f"<li>{_e(line.removeprefix('[forgetwatch] '))}</li>"
        for run in runs
        for line in lm_eval_lines(run.base, f"{run.name}: " if len(runs) > 1 else "")
    ]
    tasks = f'<p class="note">Base accuracy as lm-eval reports it:</p><ul>{"".join(lm_eval)}</ul>' if lm_eval else ""
    return (
        f'<table class="summary">{"".join(rows)}</table>'
        '<p class="note">Forgetting: right at the base, wrong now (share of all probes). Backward transfer: '
        "the reverse. A forgetting event: right at one evaluation, wrong at the next.</p>" + tasks
    )


def _curves(runs: list[Run]) -> list[dict[str, Any]]:
    rates, accuracy = [], []
    for run, color in zip(runs, cycle(_COLORS)):
        steps, forgetting = _curve(run, "forgetting")
        floor = [] if run.noise_floor is None else [[run.noise_floor] * len(steps)]
        rates += [
            _line(steps, forgetting, f"{run.name}: forgetting", color, "solid"),
            _line(*_curve(run, "forgetting_adjusted"), f"{run.name}: forgetting (chance-adjusted)", color, "dash"),
            _line(*_curve(run, "backward_transfer"), f"{run.name}: backward transfer", color, "dot"),
            *(_line(steps, y, f"{run.name}: noise floor", color, "dashdot") for y in floor),
        ]
        accuracy.append(_line(*_curve(run, "accuracy_after"), run.name, color, "solid"))
    return [
        {"data": rates, "layout": _layout("Forgetting and backward transfer by training step", "share of probes")},
        {"data": accuracy, "layout": _layout("Accuracy on the probes by training step", "accuracy")},
    ]


def _layout(title: str, y_title: str, height: int = 460) -> dict[str, Any]:
    return {
        "title": {"text": title},
        "xaxis": {"title": {"text": "training step"}},
        # ".1~%": small rates keep a decimal (".0%" labels 0.2 % and 0.4 % both "0%")
        "yaxis": {"title": {"text": y_title}, "tickformat": ".1~%", "rangemode": "tozero"},
        "legend": {"orientation": "h", "y": -0.22},
        "height": height,
        "margin": {"t": 50},
    }


def _groups(run: Run) -> dict[str, list[str]]:
    group_of = {p.category: p.category_group for p in run.probes.values()}
    groups: dict[str, list[str]] = {}
    for category, group in sorted(group_of.items()):
        groups.setdefault(group, []).append(category)
    return groups if any(g != c for c, g in group_of.items()) else {}


def _group_forgetting(run: Run, categories: list[str]) -> list[float | None]:
    out: list[float | None] = []
    for _, report in run.history:
        children = [report.by_category[c] for c in categories if c in report.by_category]
        n = sum(child.n for child in children)
        out.append(sum(child.forgotten for child in children) / n if n else None)
    return out


def _heatmap(run: Run, rows: dict[str, list[float | None]], what: str) -> dict[str, Any]:
    heatmap = {"type": "heatmap", "z": list(rows.values()), "x": [str(s) for s in run.steps], "y": list(rows)}
    heatmap |= {"colorscale": "Reds", "zmin": 0, "colorbar": {"title": {"text": "forgetting"}, "tickformat": ".1~%"}}
    heatmap["hovertemplate"] = "step %{x}<br>%{y}: %{z:.1%}<extra></extra>"
    # the left margin grows to the longest name ("high_school_government_and_politics")
    layout = _layout(f"Forgetting by {what} ({run.name})", "", height=170 + 28 * len(rows))
    layout["xaxis"]["type"] = "category"
    layout["yaxis"] = {"type": "category", "automargin": True}
    return {"data": [heatmap], "layout": layout}


def _behaviour(runs: list[Run]) -> dict[str, Any]:
    # the share of responses with each style feature (the base's dotted), and their length against the base's
    traces = []
    for run, color in zip(runs, cycle(_COLORS)):
        if not _has_behaviour(run):
            continue
        prefix = f"{run.name}: " if len(runs) > 1 else ""
        features = SHARES if len(runs) == 1 else SHARES[:1]
        for name, c in zip(features, _COLORS[1:] if len(runs) == 1 else [color]):
            now, base = _curve(run, name), _curve(run, f"{name}_base")
            if name != "refusals" and not any(now[1] + base[1]):
                continue  # a feature no response ever had
            traces += [_line(*now, f"{prefix}{name}", c, "solid"), _line(*base, f"{prefix}{name} (base)", c, "dot")]
        words, ink = _curve(run, "length_ratio_words"), "#333" if len(runs) == 1 else color
        ratio = _line(*words, f"{prefix}length in words vs the base", ink, "dash", "y2")
        ratio["hovertemplate"] = ratio["hovertemplate"].replace("%{y:.1%}", "%{y:.2f}×")
        traces.append(ratio)
    layout = _layout("Behaviour drift: what the responses look like, by training step", "share of responses")
    layout["yaxis2"] = {"title": {"text": "length / base length"}, "overlaying": "y", "side": "right"}
    layout["yaxis2"] |= {"showgrid": False, "rangemode": "tozero", "tickformat": ".1f", "ticksuffix": "×"}
    return {"data": traces, "layout": layout}


def _survival(runs: list[Run]) -> dict[str, Any]:
    traces = []
    for run, color in zip(runs, cycle(_COLORS)):
        t = run.trajectory
        traces.append(_line(t.steps.tolist(), [_num(v) for v in t.survival()], run.name, color, "solid"))
        traces[-1]["line"]["shape"] = "hv"
    layout = _layout("Survival: share of the base's right answers not yet forgotten once", "survival", height=380)
    layout["yaxis"]["range"] = [0, 1.02]
    return {"data": traces, "layout": layout}


def _probe_tables(run: Run, top: int) -> str:
    t = run.trajectory
    events, flips = t.forgetting_events(), (t.correct[:, 1:] != t.correct[:, :-1]).sum(axis=1)
    wrong_for = np.cumprod(~t.correct[:, ::-1], axis=1).sum(axis=1)  # evaluations wrong, counted from the last
    last_risk = set(run.history[-1][1].at_risk_ids) if run.history else set()
    forgotten = np.flatnonzero((events > 0) & ~t.correct[:, -1]).tolist()
    regained = np.flatnonzero(t.regained()).tolist()
    tables = [
        (
            sorted(forgotten, key=lambda i: (-events[i], -wrong_for[i])),
            "Forgotten most often, and wrong now",
            "Probes with a forgetting event (right at one evaluation, wrong at the next) that are wrong at the last "
            "evaluation; most events first, then those wrong the longest",
            "no probe is forgotten now",
        ),
        (
            sorted(regained, key=lambda i: (-flips[i], -events[i])),
            "Flickering: forgotten, then right again",
            "Probes that went right → wrong → right at least once; most flips (changes between right and wrong) "
            "first. One wrong again at the last evaluation is in both tables",
            "no probe came back after a forgetting event",
        ),
        (
            sorted((i for i, pid in enumerate(t.ids) if pid in last_risk), key=lambda i: t.signal[i, -1]),
            "At risk at the last evaluation: still right, margin slipping",
            "",
            "no probe is at risk now",
        ),
    ]
    unknown = (
        '<p class="note">The run directory holds no answers of its last evaluation (written by an older forgetwatch, '
        'or resumed and not evaluated since): "answer now" says right or wrong.</p>'
    )
    html_tables = [_table(run, rows[:top], *words, events, flips) for rows, *words in tables]
    return ("" if run.latest else unknown) + "".join(html_tables) + _broken_groups(run, top)


def _broken_groups(run: Run, top: int) -> str:
    """The rephrasing groups right under every wording at the base and not at the last evaluation."""
    last = run.history[-1][1] if run.history else None
    if last is None or last.robust_accuracy_before != last.robust_accuracy_before:  # no groups: NaN
        return ""
    title = "Rephrasings that broke: right in every wording at the base, not now"
    if not last.robust_forgotten_groups:
        return f'<h3>{_e(title)}</h3><p class="note">no rephrasing group broke.</p>'
    t, groups = run.trajectory, run.base.groups or []
    rows = []
    for group in last.robust_forgotten_groups[:top]:
        members = [i for i, g in enumerate(groups) if g == group]
        wrong = [t.ids[i] for i in members if not t.correct[i, -1]]
        rows.append(_tr([group, len(members), ", ".join(wrong)]))
    head = _tr(["group", "wordings", "wrong now"], "th")
    share = f"{last.robust_accuracy_before:.0%} of the groups right in every wording at the base, {last.robust_accuracy_after:.0%} now"
    return f'<h3>{_e(title)}</h3><p class="note">{_e(share)}.</p><table class="probes">{head}{"".join(rows)}</table>'


def _table(run: Run, rows: list[int], title: str, note: str, empty: str, events: Any, flips: Any) -> str:
    if not rows:
        return f'<h3>{_e(title)}</h3><p class="note">{_e(empty)}.</p>'
    t = run.trajectory
    lines = []
    for i in rows:
        probe = run.probes.get(t.ids[i])
        question, gold, choices = (probe.question, probe.answer_text, probe.choices) if probe else ("", "", None)
        right = t.correct[i, -1]
        now = shown_answer(run.latest, i, choices) if run.latest is not None else ("right" if right else "wrong")
        lines.append(
            f'<tr><td class="id">{_e(t.ids[i])}</td><td>{_e(t.categories[i])}</td>'
            f'<td class="q" title="{_e(question)}">{_e(_cut(question, 120))}</td>{_cell(gold)}'
            f"{_cell(shown_answer(run.base, i, choices))}{_cell(now, 'r' if right else 'w')}<td>{int(events[i])}</td>"
            f"<td>{int(flips[i])}</td><td>{_sparkline(t.correct[i], t.steps)}</td><td>{_signal_line(t.signal[i])}</td></tr>"
        )
    head = _tr(["id", "category", "question", "gold answer", "base's answer", "answer now", "events", "flips"], "th")
    head = head.removesuffix("</tr>") + (
        '<th title="right (■) or wrong (□) at the base and at each evaluation">trajectory</th>'
        '<th title="the drift signal at each evaluation">margin</th></tr>'
    )
    note = f'<p class="note">{_e(note)}.</p>' if note else ""
    return f'<h3>{_e(title)}</h3>{note}<table class="probes">{head}{"".join(lines)}</table>'


def _cell(text: str, kind: str = "") -> str:  # an answer: 40 characters shown, the whole one its tooltip
    return f'<td class="a {kind}" title="{_e(text)}">{_e(_cut(text, 40))}</td>'


def _sparkline(correct: np.ndarray, steps: np.ndarray) -> str:
    cells = "".join(
        f'<rect x="{5 * k}" y="1" width="4" height="10" class="{"r" if c else "w"}">'
        f"<title>step {int(s)}: {'right' if c else 'wrong'}</title></rect>"
        for k, (c, s) in enumerate(zip(correct, steps))
    )
    return f'<svg class="spark" width="{5 * len(correct)}" height="12">{cells}</svg>'


def _signal_line(signal: np.ndarray) -> str:
    finite = signal[np.isfinite(signal)].astype(float)
    if len(finite) < 2:
        return ""
    lo, span = finite.min(), (finite.max() - finite.min()) or 1.0
    points = " ".join(f"{5 * k + 2},{11 - 10 * (v - lo) / span:.1f}" for k, v in enumerate(signal) if math.isfinite(v))
    return (
        f'<svg class="spark" width="{5 * len(signal)}" height="12"><polyline points="{points}">'
        f"<title>from {finite[0]:.2f} to {finite[-1]:.2f} nats</title></polyline></svg>"
    )


def _line(x: list[int], y: list[float | None], name: str, color: str, dash: str, yaxis: str = "y") -> dict[str, Any]:
    return {
        "type": "scatter",
        "mode": "lines+markers",
        "x": x,
        "y": y,
        "name": name,
        "line": {"dash": dash, "color": color},
        "yaxis": yaxis,
        "hovertemplate": "step %{x}: %{y:.1%}<extra>" + _e(name) + "</extra>",
    }


def _figure(spec: dict[str, Any], div: str) -> str:
    # no markup inside the script: "</script>" or "<!--" in a name would end or derail it
    data = json.dumps(spec, allow_nan=False).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return (
        f'<div id="{div}" class="fig"></div><script>(function(){{var s={data};'
        f"Plotly.newPlot({json.dumps(div)},s.data,s.layout,{{responsive:true,displaylogo:false}});}})();</script>"
    )


def _num(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else float(v)


def _tr(cells: Sequence[Any], tag: str = "td") -> str:
    return "<tr>" + "".join(f"<{tag}>{_e(x)}</{tag}>" for x in cells) + "</tr>"


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1200px;color:#222}
h1{font-size:22px}h2{font-size:18px;margin-top:28px}h3{font-size:15px;margin-top:20px}
table{border-collapse:collapse;font-size:13px;margin:8px 0}td,th{border-bottom:1px solid #ddd;padding:4px 8px;
text-align:left;vertical-align:middle}th{background:#f5f5f5}.note{color:#666;font-size:13px}
td.q,td.a{max-width:260px;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}td.a{max-width:150px}
td.a.w{color:#c33}td.id{font-family:monospace}
.fig{margin:8px 0 16px}svg.spark rect.r{fill:#2b7}svg.spark rect.w{fill:#fff;stroke:#c33;stroke-width:1}
svg.spark polyline{fill:none;stroke:#555;stroke-width:1.2}
"""
