"""Does attribution find the training rows that made a probe forget? The planted toy benchmark of issue 37.

The toy world's base learns its facts. It is then trained on 216 rows:
- 16 planted rows, each stating a wrong capital for a probe the base gets right;
- the other known facts, so that training wipes out only the planted facts;
- arithmetic.

Each row's output-head gradient is captured in its training step (``HeadGradients``, projected) and kept as
the sum of its visits' unit vectors (``RowGradients``). For each planted probe forgotten at the end, every row
is ranked by harm at the final model, and the planted row's rank is read.

Beside it are two rankings:
- random: k/N, analytic;
- the referee: plain TracIn over the evaluation checkpoints, −Σ_c lr·⟨∇probe, ∇row⟩ with exact per-row gradients
  of all parameters, written here in a few lines.

Counterfactual:
- drop the top-k rows, where k is the number planted and the rows are ordered by harm summed over every probe
  forgotten (planted or not: a user does not know which);
- or drop k random rows;
- then retrain from the base with the same seed, and count what is still forgotten.

Cost: the training steps' wall time with capture and without, the same run twice (capture changes nothing of
training), as the median of each seed's ratio.

    python benchmarks/bench_attribution.py --seeds 5 --json benchmarks/results/attribution.json
    python benchmarks/bench_attribution.py --quick   # a run-through of every step, not a measurement
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import statistics
import sys
import time
import warnings

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--planted", type=int, default=16)
    ap.add_argument("--neutral", type=int, default=200)
    ap.add_argument("--pretrain-steps", type=int, default=200)
    ap.add_argument("--eval-steps", type=int, default=6, help="steps between the referee's checkpoints")
    ap.add_argument("--out-dim", type=int, default=256)
    ap.add_argument("--in-dim", type=int, default=64)
    ap.add_argument("--objective", choices=["margin", "gold"], default="margin", help="what a flip raised")
    ap.add_argument("--no-referee", action="store_true", help="skip the referee (TracIn over checkpoints)")
    ap.add_argument("--quick", action="store_true", help="a run-through: 1 seed, 44 rows, 30 pre-training steps")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    if args.quick:
        args.seeds, args.epochs, args.pretrain_steps, args.neutral, args.planted = 1, 2, 30, 40, 4
    return args


if __name__ == "__main__":
    parse_args()  # before the slow imports below: --help and mistakes answer at once

import numpy as np  # noqa: E402
import torch  # noqa: E402

from forgetwatch import ProbeSet, evaluate  # noqa: E402
from forgetwatch.attribution import HeadGradients, RowGradients  # noqa: E402
from forgetwatch.toy import ToyWorld  # noqa: E402


def planted_world(seed: int, args: argparse.Namespace):
    """The base, its probes and answers, the training rows (shuffled) and each planted probe's row index."""
    world = ToyWorld(seed=seed)
    tokenizer = world.tokenizer()
    base = world.model(tokenizer)
    world.train(base, tokenizer, world.fact_texts(), steps=args.pretrain_steps, seed=seed)
    known = {c.name for c in world.known}
    records = [
        r for r in world.probe_records(generative=False) if r["id"].startswith("capital/") and r["id"][8:] in known
    ]
    probes = ProbeSet.from_records(records, source="planted")
    before = evaluate(base, tokenizer, probes, show_progress=False)
    rng = random.Random(seed)
    right = [r for r, ok in zip(records, before.correct) if ok]
    targets = rng.sample(right, min(args.planted, len(right)))
    rows = [f"The capital of {r['id'][8:]} is {r['choices'][(r['answer'] + 1) % len(r['choices'])]}." for r in targets]
    planted_countries = {r["id"][8:] for r in targets}
    facts = [
        line
        for c in world.known
        for line in world.fact_lines(c)
        if not (c.name in planted_countries and line.startswith("The capital"))
    ][: args.neutral]
    rows += facts + world.distraction_texts(n=args.neutral - len(facts), seed=seed + 1)
    order = list(range(len(rows)))
    rng.shuffle(order)
    planted = {r["id"]: order.index(i) for i, r in enumerate(targets)}
    return tokenizer, base, probes, before, {r["id"]: r for r in records}, [rows[i] for i in order], planted


def encode(tokenizer, texts):
    enc = tokenizer([t + tokenizer.eos_token for t in texts], return_tensors="pt", padding=True)
    return enc, enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)


def train(base, tokenizer, rows, seed, args, capture=None, keep=()):
    """AdamW at lr 3e-3, batch 8, ``args.epochs`` shuffled epochs over ``rows`` (indices not in ``keep`` dropped
    when ``keep`` is given); returns the model, the training steps' seconds and the referee's checkpoints."""
    model, lr = copy.deepcopy(base).train(), 3e-3
    grads = HeadGradients(model, args.out_dim, args.in_dim, seed=seed) if capture is not None else None
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    index = [i for i in range(len(rows)) if not keep or i in keep]
    seconds, checkpoints, step = 0.0, [], 0
    for epoch in range(args.epochs):
        random.Random(seed * 100 + epoch).shuffle(index)
        for start in range(0, len(index), 8):
            batch = index[start : start + 8]
            enc, labels = encode(tokenizer, [rows[i] for i in batch])
            began = time.perf_counter()
            with grads.capturing() if grads else torch.enable_grad():
                model(**enc, labels=labels).loss.backward()
            if grads:
                capture.add([str(i) for i in batch], grads.take())
            opt.step()
            opt.zero_grad()
            seconds += time.perf_counter() - began
            step += 1
            if step % args.eval_steps == 0:
                checkpoints.append({k: v.clone() for k, v in model.state_dict().items()})
    if grads:
        grads.remove()
    return model.eval(), seconds, checkpoints, lr


def choice_logprob(model, tokenizer, record, choice: int):
    """A choice's summed log-probability after the question (after a space, as the probes are scored)."""
    question = tokenizer([record["question"]], return_tensors="pt")["input_ids"]
    full = tokenizer([f"{record['question']} {record['choices'][choice]}"], return_tensors="pt")["input_ids"]
    labels = full.clone()
    labels[:, : question.shape[1]] = -100
    return -model(input_ids=full, labels=labels).loss * (labels[:, 1:] != -100).sum()


def probe_loss(model, tokenizer, record):
    """What a forgotten probe's flip raised: ``margin``, the chosen wrong choice's log-probability minus the gold
    one's (what decides the answer); ``gold``, the gold choice's loss alone."""
    gold = choice_logprob(model, tokenizer, record, record["answer"])
    if OBJECTIVE == "gold":
        return -gold
    return choice_logprob(model, tokenizer, record, record["chosen"]) - gold


OBJECTIVE = "margin"


def forgotten(model, tokenizer, probes, before, records=None):
    """The probes right before and wrong now; with ``records``, each forgotten one's chosen choice noted in it."""
    after = evaluate(model, tokenizer, probes, show_progress=False)
    lost = [
        (pid, chosen)
        for pid, was, now, chosen in zip(after.ids, before.correct, after.correct, after.predicted)
        if was and not now
    ]
    for pid, chosen in lost if records is not None else ():
        records[pid] = {**records[pid], "chosen": chosen}
    return [pid for pid, _ in lost]


def head_harm(model, tokenizer, record, store, args, seed):
    grads = HeadGradients(model, args.out_dim, args.in_dim, seed=seed)
    with grads.capturing():
        probe_loss(model, tokenizer, record).backward()
    model.zero_grad()
    grads.remove()
    return store.harm(grads.take()[0])


def tracin_harm(model, tokenizer, records, rows, checkpoints, lr):
    """The referee: each probe's −Σ_checkpoints lr·⟨∇probe, ∇row⟩, every parameter, one row at a time."""
    model = copy.deepcopy(model)
    params = list(model.parameters())
    harm = torch.zeros(len(records), len(rows))
    for state in checkpoints:
        model.load_state_dict(state)
        flat = lambda loss: torch.cat([g.flatten() for g in torch.autograd.grad(loss, params)])  # noqa: E731
        queries = torch.stack([flat(probe_loss(model, tokenizer, record)) for record in records])
        for i, row in enumerate(rows):
            enc, labels = encode(tokenizer, [row])
            harm[:, i] -= lr * (queries @ flat(model(**enc, labels=labels).loss))
    return harm


def rank_of(harm: torch.Tensor, row: int) -> int:
    return int((harm > harm[row]).sum()) + 1


def one_seed(seed: int, args: argparse.Namespace) -> dict:
    tokenizer, base, probes, before, records, rows, planted = planted_world(seed, args)
    vocabulary, hidden = base.get_output_embeddings().weight.shape  # exact where a dimension allows
    store = RowGradients(min(args.out_dim, vocabulary) * min(args.in_dim, hidden))
    model, captured_s, checkpoints, lr = train(base, tokenizer, rows, seed, args, capture=store)
    _, plain_s, _, _ = train(base, tokenizer, rows, seed, args)
    lost = forgotten(model, tokenizer, probes, before, records)
    order = {key: i for i, key in enumerate(store.keys)}
    by_probe = {pid: head_harm(model, tokenizer, records[pid], store, args, seed) for pid in lost}
    hit = [p for p in lost if p in planted]
    head = [rank_of(by_probe[pid], order[str(planted[pid])]) for pid in hit]
    tracin = (
        [] if args.no_referee else tracin_harm(model, tokenizer, [records[pid] for pid in hit], rows, checkpoints, lr)
    )
    referee = [rank_of(harm, planted[pid]) for pid, harm in zip(hit, tracin)]
    # the flips the planted row is known to cause: to the very answer it states (others flipped to a third choice,
    # which other rows pushed: there the planted row is not the cause, and ranking it low is right)
    to_planted = [r for r, pid in zip(head, hit) if records[pid]["chosen"] == (records[pid]["answer"] + 1) % 4]
    k = len(planted)
    # each forgotten probe's most harmful row in turn, then each one's second, ...: k rows (a sum over the probes
    # would favour rows that rehearse other facts, whose removal makes those facts forgotten)
    rankings = [torch.argsort(harm, descending=True).tolist() for harm in by_probe.values()]
    top: set[int] = set()
    for depth in range(len(store.keys)):
        for ranking in rankings:
            if len(top) < k:
                top.add(int(store.keys[ranking[depth]]))
    drawn = set(random.Random(seed + 5).sample(range(len(rows)), k))
    kept_top = forgotten(
        train(base, tokenizer, rows, seed, args, keep=set(range(len(rows))) - top)[0], tokenizer, probes, before
    )
    kept_random = forgotten(
        train(base, tokenizer, rows, seed, args, keep=set(range(len(rows))) - drawn)[0], tokenizer, probes, before
    )
    return {
        "seed": seed,
        "rows": len(rows),
        "planted": k,
        "forgotten": len(lost),
        "planted_forgotten": len(head),
        "head_ranks": head,
        "head_ranks_to_planted_answer": to_planted,
        "tracin_ranks": referee,
        "top_k_planted": len(top & set(planted.values())),
        "forgotten_without_top_k": len(kept_top),
        "forgotten_without_random_k": len(kept_random),
        "planted_forgotten_without_top_k": len(set(kept_top) & set(planted)),
        "planted_forgotten_without_random_k": len(set(kept_random) & set(planted)),
        "train_seconds_captured": captured_s,
        "train_seconds_plain": plain_s,
    }


def recall(ranks: list[int]) -> dict | None:
    if not ranks:  # none measured (no referee, or nothing forgotten): no figure, never NaN
        return None
    r = np.array(ranks, dtype=float)
    return {
        "n": len(r),
        "recall@1": float(np.mean(r == 1)),
        "recall@5": float(np.mean(r <= 5)),
        "mrr": float(np.mean(1 / r)),
    }


def main(argv=None) -> int:
    global OBJECTIVE
    args = parse_args(argv)
    OBJECTIVE = args.objective
    torch.set_num_threads(1)
    runs = []
    for seed in range(args.seeds):
        runs.append(one_seed(seed, args))
        print(json.dumps(runs[-1]), flush=True)
    n = runs[0]["rows"]
    prevented_top = [r["forgotten"] - r["forgotten_without_top_k"] for r in runs]
    prevented_random = [r["forgotten"] - r["forgotten_without_random_k"] for r in runs]
    summary = {
        "head": recall([x for r in runs for x in r["head_ranks"]]),
        "head_to_planted_answer": recall([x for r in runs for x in r["head_ranks_to_planted_answer"]]),
        "tracin": recall([x for r in runs for x in r["tracin_ranks"]]),
        "random": {"recall@1": 1 / n, "recall@5": 5 / n, "mrr": sum(1 / i for i in range(1, n + 1)) / n},
        "prevented_by_top_k": statistics.median(prevented_top),
        "prevented_by_random_k": statistics.median(prevented_random),
        "capture_overhead": statistics.median(r["train_seconds_captured"] / r["train_seconds_plain"] - 1 for r in runs),
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "runs": runs, "summary": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
