"""Calibrate the skill world's target mix: which share of ``rev`` lines makes the forgetting uneven?

The benchmark of replay (``benchmarks/bench_replay.py``) needs a post-training that forgets one
skill hard, one mildly and one not at all. Without replay (TRL SFT, the benchmark's learning rate
and steps), this sweeps ``target_mix``, the share of ``rev x y z = z y x`` lines in the target,
and prints per share the median [per seed] relative forgetting of each skill at the end. It keeps
the smallest share where uppercase forgets between 15 % and 50 % of what it knew and facts at
most 5 % (``TARGET_MIX`` in ``benchmarks/skill_world.py`` is set from it, by hand). Bases are
pre-trained once per seed and kept under ``--out``, shared with the benchmark.

    python benchmarks/calibrate_skills.py [--mixes 0 0.02 0.03 0.04 0.05 0.1] [--seeds 5] [--jobs 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mixes", type=float, nargs="+", default=[0.0, 0.02, 0.03, 0.04, 0.05, 0.1], help="shares to try")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--eval-steps", type=int, default=40, help="only the end counts: one evaluation")
    ap.add_argument("--pretrain-steps", type=int, default=800)
    ap.add_argument("--hidden", type=int, default=96)
    ap.add_argument("--upper", type=float, nargs=2, default=[0.15, 0.5], help="uppercase's wanted range")
    ap.add_argument("--facts", type=float, default=0.05, help="facts' most forgetting")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--out", default="/tmp/forgetwatch-bench-replay", help="bases are cached here")
    return ap.parse_args(argv)


if __name__ == "__main__":
    parse_args()  # before the slow imports below: --help and mistakes answer at once
    os.environ["OMP_NUM_THREADS"] = "1"

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_replay as bench  # noqa: E402
from skill_world import SKILLS  # noqa: E402


def main(argv=None) -> int:
    args = parse_args(argv)
    began = time.perf_counter()
    os.environ["OMP_NUM_THREADS"] = "1"
    cfg = {
        "out": args.out,
        "pretrain_steps": args.pretrain_steps,
        "hidden": args.hidden,
        "eval_steps": args.eval_steps,
        "target_mix": 0.0,
    }
    os.makedirs(os.path.join(args.out, "bases"), exist_ok=True)
    jobs = [
        {
            "trainer": "sft",
            "seed": s,
            "arm": "none",
            "rows": 0,
            "lr": args.lr,
            "steps": args.steps,
            "target": 0.05,
            "target_mix": m,
        }
        for m in args.mixes
        for s in range(args.seeds)
    ]
    results, pretrain = bench.execute(cfg, list(range(args.seeds)), jobs, args.jobs)
    print(
        f"TRL SFT without replay, lr {args.lr:g}, {args.steps} steps; relative forgetting at the end, "
        f"median [per seed] of {args.seeds} seeds"
    )
    order = ("arithmetic", "uppercase", "refusal", "facts")
    print(f"{'mix':>6}  " + "".join(f"{c:38}" for c in order))
    chosen = None
    for m in args.mixes:
        runs = sorted((r for r in results if r["target_mix"] == m), key=lambda r: r["seed"])
        cells, medians = [], {}
        for c in order:
            values = [r["by_category"].get(c, {}).get("forgetting_relative") for r in runs]
            medians[c] = bench.med(values)
            shown = ", ".join("-" if v is None else f"{v:.2f}" for v in values)
            cells.append(f"{'-' if medians[c] is None else format(medians[c], '.2f')} [{shown}]")
        print(f"{m:6g}  " + "".join(f"{c:38}" for c in cells))
        up, facts = medians["uppercase"], medians["facts"]
        if chosen is None and up is not None and args.upper[0] <= up <= args.upper[1] and (facts or 0) <= args.facts:
            chosen = m
    assert set(order) == set(SKILLS)
    base = {c: bench.med(r["by_category"][c]["accuracy_before"] for r in results) for c in order}
    print("base accuracy, median over seeds: " + ", ".join(f"{c} {v:.2f}" for c, v in base.items()))
    if chosen is None:
        print(f"no share gives uppercase in [{args.upper[0]:g}, {args.upper[1]:g}] with facts <= {args.facts:g}")
    else:
        print(f"chosen: target_mix = {chosen:g} (the smallest share with that shape)")
    print(f"wall {time.perf_counter() - began:.0f} s; pre-training {pretrain:.0f} s")
    return 0 if chosen is not None else 1


if __name__ == "__main__":
    sys.exit(main())
