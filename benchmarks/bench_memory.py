"""Peak GPU memory of forgetwatch's evaluations against the training steps around them (CUDA).

One SFT run on the GPU with ForgetWatchCallback evaluating every ``--eval-steps`` steps
(``batch_size="auto"`` unless ``--batch-size``). Two probe callbacks sit either side of it:
the one before reads and resets the CUDA peak at each step end (the training step's peak),
the one after reads it again (the peak of forgetwatch's work at that step, if it evaluated).
The figure of record is the largest evaluation peak over the largest training peak; the
target is at most 1.10.

    python benchmarks/bench_memory.py [--steps 60] [--eval-steps 10] [--hidden 1024] [--layers 8]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import warnings

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--eval-steps", type=int, default=10)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch-size", default="auto", help='probes per forward: an int or "auto"')
    ap.add_argument("--train-batch", type=int, default=16)
    ap.add_argument("--out", default="/tmp/forgetwatch-bench-memory")
    return ap.parse_args(argv)


if __name__ == "__main__":
    parse_args()  # before the slow imports below: --help and mistakes answer at once

import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from forgetwatch import Output, ProbeSet, Scoring  # noqa: E402
from forgetwatch.integrations.callback import ForgetWatchCallback  # noqa: E402
from forgetwatch.toy import ToyWorld  # noqa: E402


class Peaks(TrainerCallback):
    """Record the CUDA peak since the last reset under ``phase`` at each step end; reset it."""

    def __init__(self, log: dict[str, list[int]], phase: str):
        self.log, self.phase = log, phase

    def on_step_end(self, args, state, control, **kwargs):
        torch.cuda.synchronize()
        self.log[self.phase].append(torch.cuda.max_memory_allocated())
        torch.cuda.reset_peak_memory_stats()


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_memory.py measures CUDA memory and needs a GPU; none is available here")
        return 2
    import trl
    from datasets import Dataset

    world = ToyWorld(seed=0)
    tokenizer = world.tokenizer()
    base = world.model(tokenizer, hidden=args.hidden, layers=args.layers)
    world.train(base, tokenizer, world.fact_texts(), steps=100)
    probes = ProbeSet.from_records(world.probe_records(), source="bench")
    batch_size = args.batch_size if args.batch_size == "auto" else int(args.batch_size)

    log: dict[str, list[int]] = {"train": [], "forgetwatch": []}
    cb = ForgetWatchCallback(
        probes,
        eval_steps=args.eval_steps,
        output_dir=args.out + "/fw",
        scoring=Scoring(batch_size=batch_size),
        output=Output(verbose=False),
    )
    config = trl.SFTConfig(
        args.out,
        max_steps=args.steps,
        per_device_train_batch_size=args.train_batch,
        learning_rate=1e-4,
        max_length=128,
        packing=False,
        logging_steps=1000,
        save_strategy="no",
        report_to=[],
        seed=0,
        disable_tqdm=True,
    )
    trainer = trl.SFTTrainer(
        model=copy.deepcopy(base).cuda(),
        args=config,
        processing_class=tokenizer,
        train_dataset=Dataset.from_dict({"text": world.distraction_texts(n=2000)}),
        callbacks=[Peaks(log, "train"), cb, Peaks(log, "forgetwatch")],
    )
    trainer.train()
    steps = [s for s, _ in cb.history]
    evaluated = [log["forgetwatch"][s - 1] for s in steps if s <= len(log["forgetwatch"])]
    train_peak, eval_peak = max(log["train"]), max(evaluated)
    result = {
        "device": torch.cuda.get_device_name(),
        "hidden": args.hidden,
        "layers": args.layers,
        "batch_size": batch_size,
        "evaluations": len(steps),
        "train_peak_mib": round(train_peak / 2**20, 1),
        "eval_peak_mib": round(eval_peak / 2**20, 1),
        "eval_over_train": round(eval_peak / train_peak, 3),
    }
    print(json.dumps(result, indent=1))
    return 0 if eval_peak <= 1.10 * train_peak else 1


if __name__ == "__main__":
    sys.exit(main())
