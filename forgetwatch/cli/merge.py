"""``forgetwatch merge`` and ``select``: the α or checkpoint that keeps the target's gain with the least forgetting."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from forgetwatch.common.problems import InputError, as_input_error
from forgetwatch.common.text import first_line, shorten
from forgetwatch.config.settings import Scoring
from forgetwatch.merge.sweep import MAX_ALPHAS, checked_alphas, read_texts
from forgetwatch.store import MERGED, SWEEP, SWEEP_TABLE


def parse_alphas(text: str) -> list[float]:
    """``"0:1:0.1"`` (FROM, every STEP after it up to TO, and TO) or ``"0,0.3,1"``: the α to try."""
    ranged = ":" in text
    try:
        numbers = [float(x) for x in text.split(":" if ranged else ",")]
        if ranged:
            start, stop, step = numbers
            if not step > 0 or stop < start:
                raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{shorten(text)}: write FROM:TO:STEP (e.g. 0:1:0.1) or a list (0,0.3,1)"
        ) from None
    if not all(0 <= a <= 1 for a in (numbers[:2] if ranged else numbers)):
        raise argparse.ArgumentTypeError(f"{shorten(text)}: every alpha is in [0, 1] (0 the base, 1 the tuned model)")
    if ranged:
        count = math.floor((stop - start) / step * (1 + 1e-9))  # 0.3 / 0.1 is 2.9999999999999996: three steps
        if count >= MAX_ALPHAS:  # not made: 0:1:1e-7 would be ten million
            raise argparse.ArgumentTypeError(f"{shorten(text)}: {count + 1} alphas; a sweep tries at most {MAX_ALPHAS}")
        numbers = [*(round(start + i * step, 10) for i in range(count + 1)), stop]
    try:
        return checked_alphas(numbers)  # 0 and 1 added, at most MAX_ALPHAS in all
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{shorten(text)}: {first_line(err).removeprefix('merge_sweep: ')}") from None


def read_target(args: argparse.Namespace) -> Any:
    """``--target-texts`` (a list of texts) or ``--target-probes`` (a ProbeSet)."""
    from forgetwatch.probes import ProbeSet

    if args.target_texts:
        with as_input_error(OSError, ValueError, prefix="--target-texts "):
            return read_texts(args.target_texts)
    try:
        return ProbeSet.from_jsonl(args.target_probes)
    except FileNotFoundError:
        raise InputError(f"--target-probes {args.target_probes}: no such file") from None


def run_select(args: argparse.Namespace, load: tuple[Any, Any, Any] | None) -> None:
    """The run's checkpoints, forgetting against the target (``load``: the base, its tokenizer and a loader, when a
    target is measured on each; else the logged training loss), and the one to take."""
    from forgetwatch.merge.checkpoints import choose, saved_checkpoints
    from forgetwatch.results.history import HistoryError

    measure, start, kind, higher = None, None, "train loss", False
    if load is not None:
        measure, start, kind = _target_measure(args, *load)
        higher = kind == "accuracy"
    with as_input_error(FileNotFoundError, HistoryError):
        rows = saved_checkpoints(args.run_dir, measure, higher)
    print(f"{'checkpoint':>16}  {'forgotten':>9}  {'forgetting':>10}  {kind:>10}  front")
    for r in rows:
        forgetting = "-" if r.forgetting is None else f"{r.forgetting:.1%}"
        value = "-" if r.target is None else f"{r.target:.4f}"
        forgotten = "-" if r.forgotten is None else r.forgotten
        print(f"{r.path.name:>16}  {forgotten:>9}  {forgetting:>10}  {value:>10}  {'*' if r.on_front else ''}")
    chosen = choose(rows, args.keep, start, higher)
    if chosen is None:
        raise InputError(
            f"{args.run_dir}: no checkpoint has both an evaluation at its step and a {kind}; "
            "evaluate at the steps the trainer saves (eval_steps a divisor of save_steps)"
        )
    base = "" if start is None else f" (the base: {start:.4f})"
    print(f"take {chosen.path}: forgetting {chosen.forgetting:.1%}, {kind} {chosen.target:.4f}{base}")


def _target_measure(args: argparse.Namespace, base_ckpt: Any, tokenizer: Any, load: Any) -> tuple[Any, float, str]:
    """A measure of the target on a checkpoint folder (weights, or an adapter on the base), the base's figure, kind."""
    from forgetwatch.cli.checkpoints import locate
    from forgetwatch.merge.sweep import Target, checked_target

    with as_input_error(TypeError, ValueError):
        target = checked_target(read_target(args))
    base = load(base_ckpt)
    meter = Target(base, tokenizer, target, Scoring(batch_size=args.batch_size), max_length=1024)
    start = meter(base)

    def measure(folder: Path) -> float:
        if (folder / "adapter_config.json").is_file():  # a PEFT checkpoint: its adapter on the base
            model = load_adapter(base, folder, f"{folder}")
            try:
                return meter(model)
            finally:
                model.unload()
        return meter(load(locate("checkpoint", str(folder))))

    return measure, start, meter.kind


def run_merge(
    args: argparse.Namespace, prepared: list[tuple[Any, Any]], probes: Any, scoring: Scoring, load: Any
) -> None:
    """Sweep, print the table, write ``sweep.csv``, ``sweep.json`` and the chosen model to ``--out``/merged."""
    from forgetwatch.merge import merge_sweep

    out = Path(args.out)
    target = read_target(args)
    (base_ckpt, tokenizer), *tuned_ckpt = prepared
    if args.adapter:  # the adapter's model, its adapters off, is the base: one model in memory
        base, tuned = None, load_adapter(load(base_ckpt), args.adapter, f"--adapter {args.adapter}")
    else:
        base, tuned = load(base_ckpt), load(tuned_ckpt[0][0])
    with as_input_error(TypeError, ValueError):
        sweep = merge_sweep(
            base, tuned, tokenizer, probes, target=target, alphas=args.alphas, by_layer=args.by_layer, scoring=scoring
        )
    best = sweep.best(args.keep)
    print(sweep.summary(args.keep))
    if sweep.layers:
        print("\nreverted to the base, one group at a time:")
        print(f"{'group':>12}  {'params':>6}  {'restored':>8}  {'forgotten':>9}  {'gain':>6}")
        for row in sweep.layers:
            gain = "" if row.gain is None else f"{row.gain:.0%}"
            print(f"{row.group:>12}  {row.parameters:6d}  {row.restored:8d}  {row.forgotten:9d}  {gain:>6}")
    try:
        table = sweep.write(out, args.keep)
    except OSError as err:
        raise InputError(f"--out {out}: cannot write the sweep's table ({first_line(err)})") from err
    try:  # the model before the page: it is what the command is for
        sweep.save(best, out / MERGED, tokenizer)
    except OSError as err:
        raise InputError(f"{first_line(err)}; {SWEEP_TABLE} and {SWEEP} are in {out}") from err
    written = [SWEEP_TABLE, SWEEP]
    try:
        from forgetwatch.page.html import write_sweep_page

        write_sweep_page(table, out / "sweep.html")
        written.append("sweep.html")
    except (ImportError, OSError) as err:
        print(f"(no sweep.html: {first_line(err)})")
    what = "adapter, rescaled" if args.adapter else "model"
    print(f"\nwrote {out}/: {' '.join(written)} merged/ (the {what} at alpha {best:g})")


def load_adapter(base: Any, folder: str | Path, label: str) -> Any:
    """The PEFT adapter in ``folder`` on ``base``; one that does not fit it (trained on another model) in one line."""
    from peft import PeftModel

    try:
        return PeftModel.from_pretrained(base, folder)
    except (RuntimeError, ValueError, KeyError) as err:  # load_state_dict's size mismatch, modules not found
        lines = [line.strip() for line in str(err).splitlines()]
        why = next((line for line in lines if line.startswith("size mismatch")), first_line(err))
        raise InputError(f"{label}: the adapter does not fit the base model ({why}); was it trained on it?") from err
