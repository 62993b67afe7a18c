"""Scoring speed on short prompts: forgetwatch (default, and every prompt whole) vs lm-eval-harness
vs the compute floor, for multiple choice and for greedy generation.

The probes are questions about made-up countries, each behind a background passage of 0 to
``--max-sentences`` sentences; a passage is shared by two or three probes, so many prompts share a
short prefix with one or two others (the case where a batch per prefix cost more than it saved).
One run, side by side, on the same model and probes:

- ``--kind choices`` (GPT-2 256x4 by default): ``Scorer`` with shared prefixes (the default) and
  with every prompt whole; lm-eval's ``HFLM.loglikelihood`` on the same requests, built once;
  and the floor: every unique token once, packed densely into rows with no padding, one plain
  forward per batch, logits for as many positions as there are scored tokens.
- ``--kind generation`` (GPT-2 small, 768x12, by default): ``Scorer`` (default and whole)
  against lm-eval's ``HFLM.generate_until``, greedy, ``--new-tokens`` tokens, stop at a line end.

Each repeat times every arm in turn (interleaved, so drift hits all alike); medians are
reported with ratios, forward / generate calls, and per-sample agreement with lm-eval.

    python benchmarks/bench_scoring.py [--kind choices|generation] [--probes 240] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import statistics
import sys
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

DEFAULTS = {"choices": {"hidden": 256, "layers": 4}, "generation": {"hidden": 768, "layers": 12}}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", choices=sorted(DEFAULTS), default="choices")
    ap.add_argument("--probes", type=int, default=240)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--arch", choices=["gpt2", "llama"], default="gpt2")
    ap.add_argument("--hidden", type=int, help="default 256 (choices), 768 (generation)")
    ap.add_argument("--layers", type=int, help="default 4 (choices), 12 (generation)")
    ap.add_argument("--max-sentences", type=int, help="background sentences, at most (default 8 choices, 3 generation)")
    ap.add_argument("--new-tokens", type=int, default=8, help="generation: tokens per answer")
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args(argv)
    args.hidden = args.hidden or DEFAULTS[args.kind]["hidden"]
    args.layers = args.layers or DEFAULTS[args.kind]["layers"]
    if args.max_sentences is None:
        args.max_sentences = 8 if args.kind == "choices" else 3
    return args


if __name__ == "__main__":
    parse_args()  # before the slow imports below: --help and mistakes answer at once

import numpy as np  # noqa: E402
import torch  # noqa: E402

from forgetwatch import ProbeSet, Scorer, Scoring  # noqa: E402
from forgetwatch.scoring.encoding import EncodedChoices  # noqa: E402
from forgetwatch.toy import ToyWorld  # noqa: E402


def build_probes(world: ToyWorld, n: int, kind: str, max_sentences: int, seed: int = 0) -> list[dict]:
    """``n`` questions, each behind a passage of 0 to ``max_sentences`` fact sentences shared by
    two or three questions; multiple choice (4 capitals) or generative (the capital)."""
    rng = random.Random(seed)
    facts = world.fact_texts()
    capitals = [c.capital for c in world.countries]
    rows: list[dict] = []
    passage: list[str] = []
    left = 0
    for i in range(n):
        if left == 0:  # a new passage for the next two or three questions
            passage, left = rng.sample(facts, rng.randint(0, max_sentences)), rng.randint(2, 3)
        left -= 1
        c = world.countries[i % len(world.countries)]
        question = " ".join([*passage, f"The capital of {c.name} is"])
        if kind == "generation":
            rows.append({"id": f"p{i}", "question": question, "answer": c.capital})
            continue
        choices = rng.sample([x for x in capitals if x != c.capital], 3)
        gold = rng.randrange(4)
        choices.insert(gold, c.capital)
        rows.append({"id": f"p{i}", "question": question, "choices": choices, "answer": gold})
    return rows


def lmeval_setup(model, tokenizer, records, args):
    """lm-eval's model wrapper and the requests of the same prompts, built once."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    logging.getLogger("lm-eval").setLevel(logging.ERROR)
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=args.batch_size)
    if args.kind == "generation":
        until = {"until": ["\n"], "max_gen_toks": args.new_tokens, "do_sample": False}
        requests = [Instance("generate_until", r, (r["question"], until), 0) for r in records]
        return lambda: lm.generate_until(requests, disable_tqdm=True)
    requests = [
        Instance(request_type="loglikelihood", doc=r, arguments=(r["question"], " " + choice), idx=j)
        for r in records
        for j, choice in enumerate(r["choices"])
    ]
    return lambda: lm.loglikelihood(requests, disable_tqdm=True)


def floor_batches(scorer: Scorer, batch_size: int):
    """The unique tokens (each shared prefix once, each probe's own tokens once) packed densely
    into rows as wide as an average probe; batches of ``batch_size`` rows, and the logits each
    batch must keep (one per scored token)."""
    encoded = [e for e in scorer.encoded if isinstance(e, EncodedChoices)]
    skips = scorer._tokenized(0).skips
    prefixes = {tuple(e.context[:s]) for e, s in zip(encoded, skips) if s}
    parts = [np.asarray(p) for p in prefixes]
    parts += [np.concatenate([e.context[s:]] + [c[:-1] for c in e.continuations]) for e, s in zip(encoded, skips)]
    stream = np.concatenate(parts).astype(np.int64)
    scored = sum(len(c) for e in encoded for c in e.continuations)
    width = round(statistics.mean(len(e.context) + sum(len(c) - 1 for c in e.continuations) for e in encoded))
    n_rows = -(-len(stream) // width)
    stream = np.resize(stream, n_rows * width)  # pad the last row by wrapping: no idle slots
    rows = torch.from_numpy(stream.reshape(n_rows, width))
    keep = -(-scored // n_rows)
    return [rows[i : i + batch_size] for i in range(0, n_rows, batch_size)], keep, len(stream), scored


def run_floor(model, batches, keep, device="cpu"):
    with torch.no_grad():
        for ids in batches:
            logits = model(input_ids=ids.to(device), logits_to_keep=keep, use_cache=False).logits.float()
            torch.logsumexp(logits, dim=-1)


class Calls:
    """Counts the model's forward calls (every decoding step of a generation is one)."""

    def __init__(self, model):
        self.n = 0
        model.register_forward_pre_hook(self.hook)

    def hook(self, *_):
        self.n += 1


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)

    world = ToyWorld(seed=0)
    tokenizer = world.tokenizer()
    model = world.model(tokenizer, hidden=args.hidden, layers=args.layers, arch=args.arch).eval()
    if args.kind == "choices":  # a model that knows something; generation is timed on the random one
        world.train(model, tokenizer, world.fact_texts(), steps=60, batch_size=32)
    records = build_probes(world, args.probes, args.kind, args.max_sentences)
    probes = ProbeSet.from_records(records, source="bench")
    generative = args.kind == "generation"
    options = {"max_new_tokens": args.new_tokens} if generative else {}
    more = {"reference_logprobs": False} if generative else {}
    scorers = {
        "forgetwatch": Scorer(tokenizer, probes, Scoring(**options), **more),
        "forgetwatch whole": Scorer(tokenizer, probes, Scoring(**options, shared_prefixes=False), **more),
    }
    runs = {
        name: (lambda s=s: s(model, batch_size=args.batch_size, show_progress=False)) for name, s in scorers.items()
    }
    runs["lm-eval"] = lmeval_setup(model, tokenizer, records, args)
    if not generative:
        batches, keep, n_unique, n_scored = floor_batches(scorers["forgetwatch"], args.batch_size)
        runs["floor"] = lambda: run_floor(model, batches, keep)

    # warm up: the results, the calls each arm makes, and agreement
    calls = Calls(model)
    results, made = {}, {}
    for name, run in runs.items():
        before = calls.n
        results[name] = run()
        made[name] = calls.n - before
    ours, whole = results["forgetwatch"], results["forgetwatch whole"]
    if generative:
        theirs = results["lm-eval"]
        agreement = float(np.mean([a == b for a, b in zip(ours.outputs, theirs)]))
        same_as_whole = ours.outputs == whole.outputs
        max_diff = 0.0
    else:
        lls = np.array([x[0] for x in results["lm-eval"]]).reshape(len(records), 4)
        their_correct = lls.argmax(1) == np.array([r["answer"] for r in records])
        agreement = float(np.mean(their_correct == ours.correct))
        same_as_whole = ours.correct.tolist() == whole.correct.tolist()
        max_diff = float(np.abs(lls - np.stack(ours.choice_logprobs)).max())

    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, run in runs.items():
            times[name].append(timed(run))
    med = {k: statistics.median(v) for k, v in times.items()}

    skips = scorers["forgetwatch"]._tokenized(0)
    shared = skips.prompt_skips if generative else skips.skips
    groups = {}
    for e, s in zip(scorers["forgetwatch"].encoded, shared):
        if s:
            key = tuple((e.prompt if generative else e.context)[:s])
            groups[key] = groups.get(key, 0) + 1
    print(
        f"model: {args.arch} hidden={args.hidden} layers={args.layers} vocab={len(tokenizer)}; "
        f"{args.threads} CPU threads; batch size {args.batch_size}"
    )
    print(
        f"{args.kind}: {len(records)} probes behind passages of 0-{args.max_sentences} sentences; "
        f"{len(groups)} shared prefixes, {sum(groups.values())} probes behind one"
        + (
            f"; greedy, {args.new_tokens} new tokens"
            if generative
            else f"; unique tokens {n_unique}, scored {n_scored}"
        )
    )
    print(f"agreement with lm-eval: {agreement:.2%}; the same answers whole: {same_as_whole}")
    if not generative:
        print(f"max |log-prob difference| from lm-eval: {max_diff:.2e}")
    print(f"\n{'':20}{'median s':>10}{'forwards':>10}   runs")
    for k, v in times.items():
        print(f"{k:20}{med[k]:10.3f}{made[k]:10d}   " + " ".join(f"{x:.3f}" for x in v))
    ratios = {
        "whole / forgetwatch": med["forgetwatch whole"] / med["forgetwatch"],
        "lm-eval / forgetwatch": med["lm-eval"] / med["forgetwatch"],
    }
    if not generative:
        ratios["forgetwatch / floor"] = med["forgetwatch"] / med["floor"]
    print()
    for k, v in ratios.items():
        print(f"{k:24}{v:6.2f}x")
    # the default never slower than every prompt whole (within 5 %: the runs' own noise)
    ok = agreement == 1.0 and same_as_whole and ratios["whole / forgetwatch"] >= 0.95
    goals = "100% agreement, the same answers whole, default at least as fast as whole"
    if generative:
        ok = ok and ratios["lm-eval / forgetwatch"] >= 1.0
        goals += ", not slower than lm-eval"
    else:  # the floor's ratio is reported, not a target: on a model this small a forward's own
        # cost (about 87 tokens' worth) weighs; the floor goal is bench_lmeval_tasks.py --real's
        ok = ok and ratios["lm-eval / forgetwatch"] >= 2
        goals += ", >= 2x faster than lm-eval"
    print(f"\ntargets ({goals}): {'met' if ok else 'NOT met'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "times": times,
                    "median": med,
                    "forwards": made,
                    "ratios": ratios,
                    "agreement": agreement,
                    "same_as_whole": same_as_whole,
                    "max_logprob_difference": max_diff,
                    "args": vars(args),
                },
                f,
                indent=2,
            )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
