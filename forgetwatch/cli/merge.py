"""``forgetwatch merge``: the base and a tuned checkpoint interpolated per α, the α that keeps the target's gain with the
least forgetting chosen, and that model written."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from forgetwatch.common.text import first_line
from forgetwatch.config.settings import Scoring


class MergeUsageError(ValueError):
    """A merge input that cannot be used: one line, exit code 2."""


def parse_alphas(text: str) -> list[float]:
    """``"0:1:0.1"`` (from, to, step; both ends included) or ``"0,0.3,1"``: the α to try."""
    try:
        if ":" in text:
            start, stop, step = (float(x) for x in text.split(":"))
            if not step > 0 or stop < start:
                raise ValueError
            count = round((stop - start) / step)
            alphas = [round(start + i * step, 10) for i in range(count + 1)]
        else:
            alphas = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: write FROM:TO:STEP (e.g. 0:1:0.1) or a list (0,0.3,1)") from None
    if not all(0 <= a <= 1 for a in alphas):
        raise argparse.ArgumentTypeError(f"{text!r}: every alpha is in [0, 1] (0 the base, 1 the tuned model)")
    return alphas


def read_texts(path: str) -> list[str]:
    """Target texts: a JSONL file of ``{"text": ...}`` rows, or any other text file, one text per line."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise MergeUsageError(f"--target-texts {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise MergeUsageError(f"--target-texts {path}: cannot read it ({first_line(err)})") from None
    if not path.endswith(".jsonl"):
        return [line for line in lines if line.strip()]
    texts = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as err:
            raise MergeUsageError(f"--target-texts {path}: line {n}: not JSON ({first_line(err)})") from None
        if not isinstance(row, dict) or not isinstance(row.get("text"), str):
            raise MergeUsageError(f"--target-texts {path}: line {n}: field 'text': expected a string")
        texts.append(row["text"])
    return texts


def run_merge(
    args: argparse.Namespace, prepared: list[tuple[Any, Any]], probes: Any, scoring: Scoring, load: Any
) -> int:
    """Sweep, print the table, write ``sweep.csv``, ``sweep.json`` and the chosen model to ``--out``/merged."""
    from forgetwatch.merge import merge_sweep
    from forgetwatch.probes import ProbeSet

    out = Path(args.out)
    texts = read_texts(args.target_texts) if args.target_texts else None
    try:
        target = texts if texts is not None else ProbeSet.from_jsonl(args.target_probes)
    except FileNotFoundError:
        raise MergeUsageError(f"--target-probes {args.target_probes}: no such file") from None
    (base_ckpt, tokenizer), *tuned_ckpt = prepared
    if args.adapter:  # the adapter's model, its adapters off, is the base: one model in memory
        from peft import PeftModel

        base, tuned = None, PeftModel.from_pretrained(load(base_ckpt), args.adapter)
    else:
        base, tuned = load(base_ckpt), load(tuned_ckpt[0][0])
    try:
        sweep = merge_sweep(
            base, tuned, tokenizer, probes, target=target, alphas=args.alphas, by_layer=args.by_layer, scoring=scoring
        )
    except (TypeError, ValueError) as err:
        raise MergeUsageError(first_line(err)) from err
    best = sweep.best(args.keep)
    print(sweep.summary(args.keep))
    if sweep.layers:
        print("\nreverted to the base, one group at a time:")
        print(f"{'group':>12}  {'params':>6}  {'restored':>8}  {'forgotten':>9}  {'gain':>6}")
        for row in sweep.layers:
            gain = "" if row.gain is None else f"{row.gain:.0%}"
            print(f"{row.group:>12}  {row.parameters:6d}  {row.restored:8d}  {row.forgotten:9d}  {gain:>6}")
    table = sweep.write(out, args.keep)
    written = ["sweep.csv", "sweep.json"]
    try:
        from forgetwatch.reporting.page import write_sweep_page

        write_sweep_page(table, out / "sweep.html")
        written.append("sweep.html")
    except ImportError as err:
        print(f"(no sweep.html: {err})")
    sweep.save(best, out / "merged", tokenizer)
    what = "adapter, rescaled" if args.adapter else "model"
    print(f"\nwrote {out}/: {' '.join(written)} merged/ (the {what} at alpha {best:g})")
    return 0
