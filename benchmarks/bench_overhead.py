"""Training-time overhead of ForgetWatchCallback in a TRL SFT run.

One run, side by side: the same SFTTrainer run (same model, data, seed) without the callback
(the anchor), with the default budget (``max_overhead=0.05``), and with fixed ``eval_steps``.
Wall time covers ``trainer.train()`` whole, so it includes the base snapshot taken at train
begin and the evaluation at train end. Repeats are interleaved, and each run is compared with
the anchor run just before it (paired ratios, whose median is reported): on a shared machine
whole-run times swing by more than the overhead, and slowly, so neighbours share the swing.
Also printed: the callback's own measured time (``monitoring_seconds``: snapshot, evaluations,
their files and logs) as a share of wall time, and its work on a step that does not evaluate
(``on_step_end`` when nothing is due).

    python benchmarks/bench_overhead.py [--steps 600] [--repeats 3] [--eval-steps 50]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
import timeit
import warnings

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--eval-steps", type=int, default=50)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--out", default="/tmp/forgetwatch-bench-overhead")
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument(
        "--no-behaviour",
        action="store_true",
        help="knowledge probes only (by default a behaviour probe set is scored too)",
    )
    return ap.parse_args(argv)


if __name__ == "__main__":
    parse_args()  # before the slow imports below: --help and mistakes answer at once

import torch  # noqa: E402

from forgetwatch import Output, ProbeSet, Scoring  # noqa: E402
from forgetwatch.integrations.callback import ForgetWatchCallback  # noqa: E402
from forgetwatch.toy import ToyWorld  # noqa: E402


def train_once(world, tokenizer, base, probes, steps, out, callback_settings):
    """Wall seconds of one SFT run; returns (seconds, callback or None)."""
    import trl
    from datasets import Dataset
    from transformers import PrinterCallback

    callbacks = []
    if callback_settings is not None:
        callbacks.append(
            ForgetWatchCallback(probes, output_dir=out + "/fw", output=Output(verbose=False), **callback_settings)
        )
    args = trl.SFTConfig(
        out,
        max_steps=steps,
        per_device_train_batch_size=16,
        learning_rate=1e-3,
        max_length=64,
        packing=False,
        logging_steps=50,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        activation_checkpointing=False,
        seed=0,
        disable_tqdm=True,
        dataloader_pin_memory=False,
    )
    trainer = trl.SFTTrainer(
        model=copy.deepcopy(base),
        args=args,
        processing_class=tokenizer,
        callbacks=callbacks,
        train_dataset=Dataset.from_dict({"text": world.distraction_texts(n=2000)}),
    )
    trainer.remove_callback(PrinterCallback)
    start = time.perf_counter()
    trainer.train()
    return time.perf_counter() - start, (callbacks[0] if callbacks else None)


def idle_step_cost(probes, tokenizer, model) -> float:
    """Seconds per ``on_step_end`` call on a step where nothing is due (budget schedule)."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    cb = ForgetWatchCallback(probes, output=Output(verbose=False))
    cb.watch.schedule.start(0, spent=1e9, cost=1.0)  # a huge past cost: nothing will be due
    cb.watch.schedule.due(1)  # plans the next clock reading far ahead
    state, control = TrainerState(), TrainerControl()
    args = TrainingArguments("/tmp/forgetwatch-bench-idle", report_to=[])
    state.global_step = 2
    n = 200_000
    return timeit.timeit(lambda: cb.on_step_end(args, state, control, model=model), number=n) / n


def evaluation_costs(scorers: dict, model, repeats: int = 7) -> dict[str, float]:
    """Seconds of one evaluation of ``model`` by each scorer (medians, interleaved)."""
    times: dict[str, list[float]] = {name: [] for name in scorers}
    for scorer in scorers.values():
        scorer(model, batch_size="auto", show_progress=False)  # plans and the packing check, once
    for _ in range(repeats):
        for name, scorer in scorers.items():
            start = time.perf_counter()
            scorer(model, batch_size="auto", show_progress=False)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    import datasets

    datasets.disable_progress_bars()

    world = ToyWorld(seed=0)
    half = len(world.known) // 2
    behaviour = not args.no_behaviour
    # with behaviour probes: the base also learns to refuse harmful requests (and answer others
    # briefly) for half the countries; the probes ask about the other half
    requests = world.behaviour_texts(world.known) + world.behaviour_texts(world.known, drifted=True)
    tokenizer = world.tokenizer(extra=requests if behaviour else ())
    base = world.model(tokenizer, hidden=args.hidden)
    world.train(
        base,
        tokenizer,
        world.fact_texts() + (world.behaviour_texts(world.known[:half]) if behaviour else []),
        steps=200,
    )
    rows = world.probe_records() + (world.behaviour_probe_records(world.known[half:]) if behaviour else [])
    probes = ProbeSet.from_records(rows, source="bench")
    kinds = {
        "multiple choice": sum(p.is_multiple_choice for p in probes),
        "generative": sum(p.choices is None and p.check is None for p in probes),
        "behaviour": sum(p.is_behaviour for p in probes),
    }

    # the toy model sees 256 tokens: responses of up to 64 leave room for the prompts
    common = {"scoring": Scoring(behaviour_max_new_tokens=64)} if behaviour else {}
    runs = {
        "without": None,
        "budget 5%": common,
        f"every {args.eval_steps} steps": {"eval_steps": args.eval_steps, **common},
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    evaluations: dict[str, int] = {}
    shares: dict[str, list[float]] = {name: [] for name in runs if runs[name] is not None}
    train_once(world, tokenizer, base, probes, 20, args.out + "/warmup", None)  # imports, first-call costs
    for _ in range(args.repeats):
        for name, settings in runs.items():
            seconds, cb = train_once(
                world, tokenizer, base, probes, args.steps, f"{args.out}/{len(times[name])}", settings
            )
            times[name].append(seconds)
            if cb is not None:
                evaluations[name] = len(cb.history)
                shares[name].append(cb.monitoring_seconds / seconds)
    idle = idle_step_cost(probes, tokenizer, base)
    from forgetwatch import Scorer

    knowledge = ProbeSet([p for p in probes if not p.is_behaviour], "knowledge")
    costs = evaluation_costs(
        {
            "references": Scorer(tokenizer, knowledge),
            "no references": Scorer(tokenizer, knowledge, reference_logprobs=False),
            "with behaviour": Scorer(tokenizer, probes, scoring=Scoring(behaviour_max_new_tokens=64)),
        },
        base,
    )
    with_ref, without_ref = costs["references"], costs["no references"]

    med = {k: statistics.median(v) for k, v in times.items()}
    paired = {k: statistics.median(t / a for t, a in zip(v, times["without"])) for k, v in times.items()}
    print(
        f"TRL SFTTrainer, llama hidden={args.hidden}, {args.steps} steps of batch 16, {args.threads} CPU threads; "
        f"{len(probes)} probes ({', '.join(f'{n} {k}' for k, n in kinds.items() if n)}); medians of "
        f"{args.repeats} interleaved runs"
    )
    print(f"\n{'':20}{'median s':>10}{'ratio':>8}{'evals':>7}{'measured':>10}   runs")
    for name, v in times.items():
        evals = "" if name == "without" else str(evaluations[name])
        share = f"{100 * statistics.median(shares[name]):.1f}%" if name in shares else ""
        print(
            f"{name:20}{med[name]:10.2f}{paired[name]:8.3f}{evals:>7}{share:>10}   " + " ".join(f"{x:.2f}" for x in v)
        )
    print(
        "ratio: median over repeats of (run / the anchor run beside it); measured: the callback's "
        "own time as a share of the run's wall time"
    )
    print(f"\ncallback work on a step that does not evaluate: {idle * 1e9:.0f} ns")
    print(
        f"one evaluation: {with_ref * 1e3:.0f} ms with the generative references' forward, "
        f"{without_ref * 1e3:.0f} ms without ({with_ref / without_ref:.3f}x)"
    )
    if behaviour:
        print(
            f"one evaluation with the {kinds['behaviour']} behaviour probes too (responses up to 64 tokens): "
            f"{costs['with behaviour'] * 1e3:.0f} ms ({costs['with behaviour'] / with_ref:.2f}x the knowledge "
            "probes alone)"
        )
    ratio = paired["budget 5%"]
    print(f"target (default budget <= 1.06x wall time): {'met' if ratio <= 1.06 else 'NOT met'} ({ratio:.3f}x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "times": times,
                    "median": med,
                    "paired_ratio": paired,
                    "evaluations": evaluations,
                    "monitoring_share": shares,
                    "idle_step_seconds": idle,
                    "evaluation_seconds_with_references": with_ref,
                    "evaluation_seconds_without_references": without_ref,
                    "evaluation_seconds": costs,
                    "args": vars(args),
                },
                f,
                indent=2,
            )
    return 0 if ratio <= 1.06 else 1


if __name__ == "__main__":
    sys.exit(main())
