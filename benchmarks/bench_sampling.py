"""Greedy against sampled forgetting on one run (Harmon et al.'s protocol): how many of the flips greedy decoding
counts do three seeds confirm, and what sampling costs.

A model is post-trained (toy: arithmetic after made-up facts; --real: SmolLM2-135M-Instruct on CPython's source),
then the base and the final weights are scored on generative probes twice: greedily, and sampled (3 answers a
probe, temperature 0.6, top-p 0.95, seed i before paired with seed i after). --real scores two sets apart: country
capitals (16 new tokens) and MMLU asked zero-shot with chain of thought (the mmlu_cot preset, in the chat template,
--cot-tokens new tokens, read from its "Answer: X" line).

    python benchmarks/bench_sampling.py [--steps 40]
    python benchmarks/bench_sampling.py --real [--steps 30] [--countries 48] [--cot-docs 4] [--cot-tokens 192]
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real", action="store_true", help="SmolLM2-135M-Instruct, capitals and MMLU chain of thought")
    ap.add_argument("--steps", type=int, default=None, help="training steps (default 40; --real: 30)")
    ap.add_argument("--lr", type=float, default=None, help="learning rate (default 3e-3; --real: 1e-3)")
    ap.add_argument("--countries", type=int, default=48, help="--real: capital probes (default 48)")
    ap.add_argument(
        "--cot-docs", type=int, default=4, help="--real: MMLU documents per subject, 3 subjects (default 4)"
    )
    ap.add_argument("--cot-tokens", type=int, default=192, help="--real: new tokens of a chain of thought")
    ap.add_argument("--samples", type=int, default=3, help="seeds (default 3)")
    return ap.parse_args(argv)


if __name__ == "__main__":
    parse_args()  # before the slow imports below: --help and mistakes answer at once

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_merge import train  # noqa: E402

from forgetwatch import ProbeSet, Scoring, compare, evaluate  # noqa: E402


def toy_sets(args):
    from forgetwatch.toy import ToyWorld

    world = ToyWorld()
    tokenizer = world.tokenizer()
    base = world.model(tokenizer)
    world.train(base, tokenizer, world.fact_texts(), steps=200)
    rows = [r for r in world.probe_records(generative=True) if "choices" not in r]
    sets = {"facts": (ProbeSet.from_records(rows), {"max_new_tokens": 8})}
    return base, tokenizer, sets, world.distraction_texts(n=400), 16, 3e-3


def real_sets(args):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import real_world as real

    base, tokenizer = real.smollm2()
    sets = {}
    if args.countries:
        capitals = real.capital_probe_records(tokenizer, real.sample(real.countries(), args.countries))
        sets["capitals"] = (ProbeSet.from_records(capitals), {"max_new_tokens": 16})
    if args.cot_docs:
        subjects = ("astronomy", "world_religions", "high_school_geography")
        rows = [r for s in subjects for r in real.mmlu_rows([s])[: args.cot_docs]]
        chat = [{"role": "user", "content": ""}]
        cot = [
            {
                **r,
                "question": tokenizer.apply_chat_template(
                    [{**chat[0], "content": r["question"]}], tokenize=False, add_generation_prompt=True
                ),
            }
            for r in ProbeSet.from_hf(rows, preset="mmlu_cot").to_records()
        ]
        sets["mmlu_cot"] = (ProbeSet.from_records(cot), {"max_new_tokens": args.cot_tokens, "stop": []})
    return base, tokenizer, sets, real.cpython_texts(64, chars=900), 2, 1e-3


def timed(model, tokenizer, probes, **options):
    began = time.perf_counter()
    answers = evaluate(model, tokenizer, probes, scoring=Scoring(**options), show_progress=False, batch_size=16)
    return answers, time.perf_counter() - began


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    torch.manual_seed(0)
    base, tokenizer, sets, texts, batch, lr = (real_sets if args.real else toy_sets)(args)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    steps = args.steps or (30 if args.real else 40)
    tuned = copy.deepcopy(base)
    began = time.perf_counter()
    train(tuned, tokenizer, texts, steps, steps, args.lr or lr, batch)
    print(f"trained {steps} steps in {time.perf_counter() - began:.0f} s")
    sampled = {"samples": args.samples, "temperature": 0.6, "top_p": 0.95, "seed": 0}
    for name, (probes, options) in sets.items():
        greedy = [timed(m, tokenizer, probes, **options) for m in (base, tuned)]
        drawn = [timed(m, tokenizer, probes, **options, **sampled) for m in (base, tuned)]
        g, s = compare(greedy[0][0], greedy[1][0]), compare(drawn[0][0], drawn[1][0])
        before, after = drawn[0][0].samples_correct, drawn[1][0].samples_correct
        agreed = {probes.ids[i] for i in np.flatnonzero((before & ~after).all(axis=1))}
        unconfirmed = [i for i in g.forgotten_ids if i not in agreed]
        one = s.agreement[0]
        seconds = [sum(t for _, t in greedy), sum(t for _, t in drawn)]
        print(
            f"\n{name} ({len(probes)} probes): greedy accuracy {greedy[0][0].accuracy:.1%} -> {greedy[1][0].accuracy:.1%}, "
            f"{g.forgotten} forgotten, {g.gained} gained"
        )
        print(
            f"  sampled x{args.samples}: accuracy (majority) {drawn[0][0].accuracy:.1%} -> {drawn[1][0].accuracy:.1%}; "
            f"forgotten by one seed {one['forgotten_mean']:.2f} +- {one['forgotten_var'] ** 0.5:.2f} (sd over seeds), "
            f"by the majority {s.forgotten}, under every seed {s.forgotten_agreed}; gained under every seed "
            f"{s.gained_agreed}"
        )
        for row in s.agreement:
            print(
                f"    {row['seeds']} seed(s), {row['combinations']} combination(s): forgotten {row['forgotten_mean']:.2f} "
                f"(var {row['forgotten_var']:.2f}), gained {row['gained_mean']:.2f} (var {row['gained_var']:.2f})"
            )
        print(
            f"  greedy flips 1->0 the seeds do not all confirm: {len(unconfirmed)} of {g.forgotten}"
            + (f" ({', '.join(unconfirmed[:6])})" if unconfirmed else "")
        )
        print(
            f"  cost: greedy {seconds[0]:.1f} s, sampled {seconds[1]:.1f} s ({seconds[1] / seconds[0]:.2f}x), base and final"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
