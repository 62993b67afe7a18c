"""Multiple-choice scoring speed: forgetwatch vs lm-eval-harness vs the compute floor.

One run, side by side, on the same tiny model and probes:

- forgetwatch: ``Scorer`` (tokenized once, as during training), packed contexts.
- lm-eval: ``HFLM.loglikelihood`` on the task's requests, built once (so only its
  tokenization and forward loop are timed), at the same batch size.
- floor: every unique token (each context once, each choice's tokens once) packed densely
  into rows with no padding, through one plain forward per batch, with logits for as many
  positions as there are scored tokens. No exact method can do less model work.

Each repeat times all three in turn (interleaved, so drift hits all alike); medians are
reported with ratios and per-sample agreement with lm-eval.

    python benchmarks/bench_scoring.py [--probes 240] [--repeats 5] [--batch-size 32]
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


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--probes", type=int, default=240)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--json", help="also write the figures here")
    return ap.parse_args(argv)


if __name__ == "__main__":
    parse_args()  # before the slow imports below: --help and mistakes answer at once

import numpy as np  # noqa: E402
import torch  # noqa: E402

from forgetwatch import ProbeSet, Scorer  # noqa: E402
from forgetwatch.scoring.encoding import EncodedChoices  # noqa: E402
from forgetwatch.toy import ToyWorld  # noqa: E402


def build_probes(world: ToyWorld, n: int, seed: int = 0) -> list[dict]:
    """Multiple-choice probes with ~60-token contexts and 4 choices of a few tokens each."""
    rng = random.Random(seed)
    facts = world.fact_texts()
    capitals = [c.capital for c in world.countries]
    rows = []
    for i in range(n):
        c = world.countries[i % len(world.countries)]
        context = " ".join(rng.sample(facts, 7))
        choices = rng.sample([x for x in capitals if x != c.capital], 3)
        gold = rng.randrange(4)
        choices.insert(gold, c.capital)
        rows.append(
            {"id": f"p{i}", "question": f"{context} The capital of {c.name} is", "choices": choices, "answer": gold}
        )
    return rows


def lmeval_setup(model, tokenizer, records, batch_size):
    """lm-eval's model wrapper and the task's loglikelihood requests, built once."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    logging.getLogger("lm-eval").setLevel(logging.ERROR)
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size)
    requests = []
    for r in records:
        for j, choice in enumerate(r["choices"]):
            requests.append(
                Instance(request_type="loglikelihood", doc=r, arguments=(r["question"], " " + choice), idx=j)
            )
    return lm, requests


def floor_batches(scorer: Scorer, width: int, batch_size: int):
    """The unique tokens packed densely into rows of ``width``; batches of ``batch_size`` rows."""
    encoded = [e for e in scorer.encoded if isinstance(e, EncodedChoices)]
    stream = np.concatenate([np.concatenate([e.context] + [c[:-1] for c in e.continuations]) for e in encoded]).astype(
        np.int64
    )
    scored = sum(len(c) for e in encoded for c in e.continuations)  # one log-prob per choice token
    n_rows = -(-len(stream) // width)
    stream = np.resize(stream, n_rows * width)  # pad the last row by wrapping: no idle slots
    rows = torch.from_numpy(stream.reshape(n_rows, width))
    keep = -(-scored // n_rows)
    return [rows[i : i + batch_size] for i in range(0, n_rows, batch_size)], keep, len(stream), scored


def run_floor(model, batches, keep):
    with torch.no_grad():
        for ids in batches:
            logits = model(input_ids=ids, logits_to_keep=keep, use_cache=False).logits.float()
            torch.logsumexp(logits, dim=-1)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)

    world = ToyWorld(seed=0)
    tokenizer = world.tokenizer()
    model = world.model(tokenizer, hidden=args.hidden, layers=args.layers)
    world.train(model, tokenizer, world.fact_texts(), steps=60, batch_size=32)
    records = build_probes(world, args.probes)
    probes = ProbeSet.from_records(records, source="bench")

    scorer = Scorer(tokenizer, probes)
    encoded = [e for e in scorer.encoded if isinstance(e, EncodedChoices)]
    ctx_len = statistics.mean(len(e.context) for e in encoded)
    choice_len = statistics.mean(len(c) for e in encoded for c in e.continuations)
    packed_width = statistics.mean(len(e.context) + sum(len(c) - 1 for c in e.continuations) for e in encoded)
    lm, requests = lmeval_setup(model, tokenizer, records, args.batch_size)
    batches, keep, n_unique, n_scored = floor_batches(scorer, round(packed_width), args.batch_size)

    def run_forgetwatch():
        return scorer(model, batch_size=args.batch_size, show_progress=False)

    def run_lmeval():
        return lm.loglikelihood(requests, disable_tqdm=True)

    # warm up (and check agreement on the warm-up results)
    ours = run_forgetwatch()
    theirs = run_lmeval()
    run_floor(model, batches, keep)
    lls = np.array([x[0] for x in theirs]).reshape(len(records), 4)
    their_correct = lls.argmax(1) == np.array([r["answer"] for r in records])
    agreement = float(np.mean(their_correct == ours.correct))
    max_diff = float(np.abs(lls - np.stack(ours.choice_logprobs)).max())

    times: dict[str, list[float]] = {"forgetwatch": [], "lm-eval": [], "floor": []}
    for _ in range(args.repeats):
        times["forgetwatch"].append(timed(run_forgetwatch))
        times["lm-eval"].append(timed(run_lmeval))
        times["floor"].append(timed(lambda: run_floor(model, batches, keep)))
    med = {k: statistics.median(v) for k, v in times.items()}

    print(
        f"model: llama hidden={args.hidden} layers={args.layers} vocab={len(tokenizer)}; "
        f"{args.threads} CPU threads; batch size {args.batch_size}"
    )
    print(
        f"probes: {len(records)} x 4 choices; context {ctx_len:.1f} tokens, choice {choice_len:.1f} tokens; "
        f"unique tokens {n_unique}, scored tokens {n_scored}"
    )
    print(
        f"agreement with lm-eval acc: {agreement:.2%} ({len(records)} probes); max |log-prob difference| {max_diff:.2e}"
    )
    print(f"\n{'':12}{'median s':>10}{'runs':>40}")
    for k, v in times.items():
        print(f"{k:12}{med[k]:10.3f}    " + " ".join(f"{x:.3f}" for x in v))
    ratios = {
        "forgetwatch / floor": med["forgetwatch"] / med["floor"],
        "lm-eval / forgetwatch": med["lm-eval"] / med["forgetwatch"],
    }
    print()
    for k, v in ratios.items():
        print(f"{k:24}{v:6.2f}x")
    ok = agreement == 1.0 and ratios["forgetwatch / floor"] <= 1.3 and ratios["lm-eval / forgetwatch"] >= 2
    print(f"\ntargets (100% agreement, <= 1.3x floor, >= 2x faster than lm-eval): {'met' if ok else 'NOT met'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "times": times,
                    "median": med,
                    "ratios": ratios,
                    "agreement": agreement,
                    "max_logprob_difference": max_diff,
                    "args": vars(args),
                },
                f,
                indent=2,
            )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
