"""Does forgetting-driven replay repair forgetting? Arms side by side on the toy world.

The model learns made-up facts; the probes ask about one half of the countries, the replay pool
holds the facts of the other half plus unrelated text (disjoint from the probes); TRL's
SFTTrainer (or DPOTrainer, ``--trainer dpo``) then post-trains it on arithmetic. At equal steps:

- ``none``: no replay;
- ``uniform``: the same replay rows per step, drawn evenly (the pool as one category);
- ``driven``: drawn by the forgetting measured at the last evaluation (``replay_loss="lm"``);
- ``kl``: driven, with ``replay_loss="kl"`` (KL from the base's distribution on the rows);
- ``auto``: driven, with ``replay_weight="auto"`` steering toward ``--target``.

Reported, medians over seeds: probes forgotten (1->0) at the end, the target task's loss on
held-out arithmetic, wall time, and the forgetting curve of each arm (``--png``).

    python benchmarks/bench_replay.py [--seeds 3] [--steps 40] [--trainer sft|dpo] [--png replay.png]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
import warnings

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--eval-steps", type=int, default=5)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--replay-rows", type=int, default=8, help="replay rows per optimizer step (every arm)")
    ap.add_argument("--target", type=float, default=0.05, help='forgetting target of the "auto" arm')
    ap.add_argument("--trainer", choices=("sft", "dpo"), default="sft")
    ap.add_argument("--out", default="/tmp/forgetwatch-bench-replay")
    ap.add_argument("--png", help="draw the arms' forgetting curves here (seed 0)")
    ap.add_argument("--json", help="also write every figure here")
    return ap.parse_args(argv)


if __name__ == "__main__":
    parse_args()  # before the slow imports below: --help and mistakes answer at once

import torch  # noqa: E402

from forgetwatch import ForgetWatchCallback, ProbeSet, ReplayPool  # noqa: E402
from forgetwatch.toy import ToyWorld  # noqa: E402

ARMS = ("none", "uniform", "driven", "kl", "auto")


def split(world: ToyWorld, unrelated: int = 20) -> tuple[ProbeSet, ReplayPool, ReplayPool]:
    """Probes on one half of the known countries; the pool (by category, and as one category)."""
    probes, rows = world.replay_split(unrelated)
    probes = ProbeSet.from_records(probes)
    driven = ReplayPool.from_records(rows)
    uniform = ReplayPool.from_records([{**r, "category": "all"} for r in rows])
    return probes, driven, uniform


def target_loss(model, tokenizer, texts: list[str]) -> float:
    """Mean next-token loss on held-out target-task text."""
    model.eval()
    with torch.no_grad():
        batch = tokenizer(texts, return_tensors="pt", padding=True)
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        return float(model(**batch, labels=labels).loss)


def run_arm(arm: str, world, tokenizer, base, args) -> dict:
    import trl
    from datasets import Dataset

    probes, driven, uniform = split(world)
    replay = {
        "none": {},
        "uniform": {"replay": uniform},
        "driven": {"replay": driven},
        "kl": {"replay": driven, "replay_loss": "kl"},
        "auto": {"replay": driven, "replay_weight": "auto", "forgetting_target": args.target},
    }[arm]
    cb = ForgetWatchCallback(
        probes,
        eval_steps=args.eval_steps,
        verbose=False,
        noise_check=False,
        replay_batch_size=args.replay_rows,
        **replay,
    )
    common = dict(
        max_steps=args.steps,
        learning_rate=args.lr,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        activation_checkpointing=False,
        seed=0,
        disable_tqdm=True,
        logging_steps=1000,
        dataloader_num_workers=0,
    )
    if args.trainer == "dpo":
        rows = [
            {
                "prompt": t.split(" is ")[0] + " is",
                "chosen": " " + t.split(" is ")[1],
                "rejected": " " + str(int(t.split(" is ")[1].rstrip(".")) + 1) + ".",
            }
            for t in world.distraction_texts(n=200)
            if " is " in t
        ]
        config = trl.DPOConfig(args.out, per_device_train_batch_size=8, max_length=48, beta=0.1, **common)
        saved = os.path.join(args.out, "base")  # DPO loads its reference model from a directory
        base.save_pretrained(saved)
        tokenizer.save_pretrained(saved)
        trainer = trl.DPOTrainer(
            model=saved, args=config, processing_class=tokenizer, train_dataset=Dataset.from_list(rows), callbacks=[cb]
        )
    else:
        config = trl.SFTConfig(args.out, per_device_train_batch_size=16, max_length=64, packing=False, **common)
        trainer = trl.SFTTrainer(
            model=copy.deepcopy(base),
            args=config,
            processing_class=tokenizer,
            train_dataset=Dataset.from_dict({"text": world.distraction_texts()}),
            callbacks=[cb],
        )
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    final = cb.history[-1][1]
    return {
        "forgotten": final.forgotten,
        "forgetting": final.forgetting,
        "seconds": seconds,
        "target_loss": target_loss(trainer.model, tokenizer, world.distraction_texts(n=64, seed=7)),
        "curve": [(s, r.forgetting) for s, r in cb.history],
        "weights": [
            e.get("forgetwatch/replay/weight") for e in trainer.state.log_history if "forgetwatch/replay/weight" in e
        ],
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    import datasets

    datasets.disable_progress_bars()
    results: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    for seed in range(args.seeds):
        world = ToyWorld(seed=seed)
        tokenizer, base, _ = world.base_and_tuned(tuned_steps=0)
        for arm in ARMS:
            results[arm].append(run_arm(arm, world, tokenizer, base, args))
    n = len(split(ToyWorld(seed=0))[0])
    print(
        f"toy world, TRL {args.trainer.upper()} on arithmetic, {args.steps} steps; {n} probes; "
        f"{args.replay_rows} replay rows per step; medians of {args.seeds} seeds"
    )
    print(f"\n{'arm':10}{'1->0':>7}{'forgetting':>12}{'target loss':>13}{'wall s':>9}   per seed 1->0")
    for arm, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in ("forgotten", "forgetting", "target_loss", "seconds")}
        print(
            f"{arm:10}{med['forgotten']:7.0f}{100 * med['forgetting']:11.1f}%{med['target_loss']:13.3f}"
            f"{med['seconds']:9.1f}   {[r['forgotten'] for r in runs]}"
        )
    auto = results["auto"][0]["weights"]
    print(f'\n"auto" weights at each evaluation (seed 0): {[round(w, 3) for w in auto]}')
    if args.png:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = Figure(figsize=(7, 4))
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        for arm, runs in results.items():
            steps, values = zip(*runs[0]["curve"])
            ax.plot(steps, [100 * v for v in values], marker="o", label=arm)
        ax.axhline(100 * args.target, color="#999", linestyle=":", label='"auto" target')
        ax.set_xlabel("training step")
        ax.set_ylabel("forgetting (%)")
        ax.set_title(f"Replay arms, TRL {args.trainer.upper()} on arithmetic (seed 0)")
        ax.legend()
        fig.savefig(args.png, dpi=110)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
