"""Undo forgetting by merging: does an alpha < 1 keep most of the target's gain at a fraction of the forgetting,
and does it beat taking an earlier checkpoint of equal gain (early stopping)?

A model is post-trained on its target (toy: arithmetic after made-up facts; --real: SmolLM2-135M-Instruct on
CPython's source, probed on MMLU and country capitals), with a checkpoint kept every --every steps. Then, side by
side: each checkpoint's forgetting and target loss, and forgetwatch's merge sweep of the last one (alpha from 0 to
1). It also times the sweep against scoring the probes and the target once per alpha on models built apart (the
sweep should cost no more, plus its in-place moves), and says what memory the sweep adds.

With --by-layer N it also tries a layer-wise merge chosen from the by-layer table (groups of N blocks): groups are
reverted to the base one by one, those bringing back the most forgotten probes first, while the target keeps --keep
of its gain; both it and the global alpha are chosen on the same probes they are scored on.

    python benchmarks/bench_merge.py [--steps 40] [--every 10] [--alphas 0:1:0.25] [--lora] [--seed 0]
    python benchmarks/bench_merge.py --real [--steps 30] [--every 10] [--docs 4] [--countries 16] [--by-layer 6]
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
    ap.add_argument("--real", action="store_true", help="SmolLM2-135M-Instruct, MMLU and capitals, SFT on CPython")
    ap.add_argument("--steps", type=int, default=None, help="training steps (default 40; --real: 30)")
    ap.add_argument("--every", type=int, default=10, help="a checkpoint every N steps (default 10)")
    ap.add_argument("--alphas", default="0:1:0.25", help="FROM:TO:STEP or A,B,... (default 0:1:0.25)")
    ap.add_argument("--keep", type=float, default=0.9, help="share of the target's gain to keep (default 0.9)")
    ap.add_argument("--lora", action="store_true", help="train a LoRA adapter and sweep its scale instead")
    ap.add_argument("--docs", type=int, default=4, help="--real: MMLU documents per subject (default 4)")
    ap.add_argument("--countries", type=int, default=16, help="--real: capital probes (default 16)")
    ap.add_argument("--lr", type=float, default=None, help="learning rate (default 3e-3; --real: 2e-4; LoRA x5)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the training batches and the adapter (default 0)")
    ap.add_argument("--by-layer", type=int, default=0, metavar="N", help="also a layer-wise merge, N blocks a group")
    return ap.parse_args(argv)


if __name__ == "__main__":
    parse_args()  # before the slow imports below: --help and mistakes answer at once

import torch  # noqa: E402

from forgetwatch import ProbeSet, compare, evaluate, merge_sweep  # noqa: E402
from forgetwatch.cli.merge import parse_alphas  # noqa: E402
from forgetwatch.merge.sweep import mean_token_loss  # noqa: E402

MAX_LENGTH = 256  # tokens of a training or held-out text


def toy_setup(args):
    from forgetwatch.toy import ToyWorld

    world = ToyWorld()
    tokenizer = world.tokenizer()
    base = world.model(tokenizer)
    world.train(base, tokenizer, world.fact_texts(), steps=200)
    probes = ProbeSet.from_records(world.probe_records(), source="toy facts")
    texts = world.distraction_texts(n=400)
    held_out = world.distraction_texts(n=16, seed=9)
    return base, tokenizer, probes, texts, held_out, 16, 3e-3


def real_setup(args):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import real_world as real

    base, tokenizer = real.smollm2()
    subjects = ("astronomy", "world_religions", "high_school_geography")
    rows = [r for s in subjects for r in real.mmlu_rows([s])[: args.docs]]
    mmlu = ProbeSet.from_hf(rows, preset="mmlu")
    capitals = ProbeSet.from_records(
        real.capital_probe_records(tokenizer, real.sample(real.countries(), args.countries))
    )
    probes = ProbeSet([*mmlu, *capitals], source="mmlu and capitals")
    texts = real.cpython_texts(64, chars=900)
    held_out = real.cpython_texts(8, chars=900, seed=7)
    return base, tokenizer, probes, texts, held_out, 2, 2e-4


def train(model, tokenizer, texts, steps, every, lr, batch_size, seed=0):
    """A plain causal-LM loop; a CPU copy of the trainable weights every ``every`` steps."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    g = torch.Generator().manual_seed(seed)
    saved = {}
    model.train()
    for step in range(1, steps + 1):
        batch = [texts[i] for i in torch.randint(len(texts), (batch_size,), generator=g).tolist()]
        enc = tokenizer(batch, return_tensors="pt", padding=True, truncation=True, max_length=MAX_LENGTH)
        labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
        model(**enc, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad()
        if step % every == 0:
            saved[step] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model.eval()
    return saved


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    torch.manual_seed(args.seed)
    base, tokenizer, probes, texts, held_out, batch, lr = (real_setup if args.real else toy_setup)(args)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    steps = args.steps or (30 if args.real else 40)
    lr = args.lr or lr * (5 if args.lora else 1)
    alphas = parse_alphas(args.alphas)
    tuned = copy.deepcopy(base)
    if args.lora:
        import peft

        tuned = peft.get_peft_model(tuned, peft.LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"))
    began = time.perf_counter()
    saved = train(tuned, tokenizer, texts, steps, args.every, lr, batch, args.seed)
    print(f"trained {steps} steps in {time.perf_counter() - began:.0f} s; {len(probes)} probes")
    rows_ids = [tokenizer(t)["input_ids"][:MAX_LENGTH] for t in held_out]

    base_answers = evaluate(base, tokenizer, probes, show_progress=False)
    base_loss = mean_token_loss(base, tokenizer, rows_ids)

    # early stopping: each saved checkpoint, scored apart
    checkpoints = []
    final_state = {k: v.clone() for k, v in tuned.state_dict().items()}
    for step, state in saved.items():
        tuned.load_state_dict(state)
        report = compare(base_answers, evaluate(tuned, tokenizer, probes, show_progress=False))
        checkpoints.append((step, report, mean_token_loss(tuned, tokenizer, rows_ids)))
    tuned.load_state_dict(final_state)

    began = time.perf_counter()
    sweep = merge_sweep(
        None if args.lora else base,
        tuned,
        tokenizer,
        probes,
        target=held_out,
        alphas=alphas,
        max_length=MAX_LENGTH,
        by_layer=args.by_layer,
    )
    sweep_seconds = time.perf_counter() - began
    # the same evaluations on a model built apart, once per alpha: what a sweep by hand costs
    began = time.perf_counter()
    for _ in range(len(sweep.alphas) + len(sweep.layers)):  # each alpha, each group reverted
        evaluate(tuned, tokenizer, probes, show_progress=False)
        mean_token_loss(tuned, tokenizer, rows_ids)
    apart_seconds = time.perf_counter() - began
    moved = (
        0
        if args.lora
        else sum(
            p.numel() * p.element_size()
            for n, p in tuned.named_parameters()
            if not torch.equal(p, dict(base.named_parameters())[n])
        )
    )

    what = "LoRA, scaled" if args.lora else "full weights"
    print(f"\n{'':>16}  {'forgotten':>9}  {'forgetting':>10}  {'adjusted':>8}  {'held-out loss':>13}")
    print(f"{'base':>16}  {0:9d}  {'0.0%':>10}  {'':>8}  {base_loss:13.4f}")
    named = [(f"step {s}", r, loss) for s, r, loss in checkpoints]
    named += [(f"alpha {a:g}", r, loss) for a, r, loss in zip(sweep.alphas, sweep.reports, sweep.target)]
    for name, r, loss in named:
        print(f"{name:>16}  {r.forgotten:9d}  {r.forgetting:10.1%}  {r.forgetting_adjusted:8.1%}  {loss:13.4f}")
    best = sweep.best(args.keep)
    i = sweep.alphas.index(best)
    print(f"\n{what}: {sweep.summary(args.keep).splitlines()[-1]}")
    # early stopping at the same gain: the first checkpoint whose held-out loss is as low as the chosen alpha's
    equal = [(s, r, loss) for s, r, loss in checkpoints if loss <= sweep.target[i]]
    if equal:
        s, r, loss = equal[0]
        print(f"early stopping at that held-out loss: step {s}, {r.forgotten} probes forgotten ({loss:.4f})")
    else:
        print(f"early stopping: no saved checkpoint reaches a held-out loss of {sweep.target[i]:.4f}")
    print(
        f"sweep {sweep_seconds:.1f} s for {len(sweep.alphas)} alphas and {len(sweep.layers)} groups; "
        f"the same evaluations apart {apart_seconds:.1f} s "
        f"({sweep_seconds / apart_seconds:.2f}x); memory added: {moved / 2**20:.0f} MiB "
        + ("(a CPU copy of the parameters that trained)" if moved else "(the adapters are scaled: no copy)")
    )
    if sweep.layers:
        layer_wise(
            sweep,
            base,
            tuned,
            tokenizer,
            probes,
            base_answers,
            rows_ids,
            base_loss,
            args.keep,
            args.lora,
            args.by_layer,
        )
    return 0


def layer_wise(sweep, base, tuned, tokenizer, probes, base_answers, rows_ids, base_loss, keep, lora, span):
    """Revert groups to the base one at a time (most probes restored first, then least gain lost) while the held-out
    loss keeps ``keep`` of its gain: a layer-wise merge chosen from the by-layer table, against the global alpha."""
    from forgetwatch.merge.weights import AdapterScaling, Interpolation, layer_groups, moved

    print(f"\n{'reverted group':>16}  {'params':>6}  {'restored':>8}  {'forgotten':>9}  {'gain':>6}")
    for row in sweep.layers:
        gain = "" if row.gain is None else f"{row.gain:.0%}"
        print(f"{row.group:>16}  {row.parameters:6d}  {row.restored:8d}  {row.forgotten:9d}  {gain:>6}")
    end_loss = sweep.target[-1]
    order = sorted((r for r in sweep.layers if r.restored > 0), key=lambda r: (-r.restored, -(r.gain or 0)))
    mover = AdapterScaling(tuned) if lora else Interpolation(dict(base.named_parameters()), tuned)
    groups = layer_groups(mover.names, span)
    reverted, chosen = [], (sweep.reports[-1].forgotten, 1.0)
    with moved(mover):
        for row in order:
            trial = [*reverted, row.group]
            mover.set(1.0, {n: 0.0 for g in trial for n in groups[g]})
            report = compare(base_answers, evaluate(tuned, tokenizer, probes, show_progress=False))
            loss = mean_token_loss(tuned, tokenizer, rows_ids)
            gain = (base_loss - loss) / (base_loss - end_loss) if base_loss > end_loss else None
            if gain is not None and gain >= keep:
                reverted, chosen = trial, (report.forgotten, gain)
    best = sweep.best(keep)
    i = sweep.alphas.index(best)
    print(
        f"layer-wise (reverted: {', '.join(reverted) or 'none'}): {chosen[0]} forgotten, {chosen[1]:.0%} of the gain; "
        f"global alpha {best:g}: {sweep.reports[i].forgotten} forgotten, "
        + ("no gain to keep" if sweep.gain[i] is None else f"{sweep.gain[i]:.0%} of the gain")
    )


if __name__ == "__main__":
    sys.exit(main())
