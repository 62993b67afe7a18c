"""With LoRA and ``replay_loss="kl"``: is the base distribution faster kept once or computed live?

Kept (what forgetwatch does): the base's top-k next-token log-probabilities on every pool row
are computed once and read at each replay step. Live: at each replay step, one more forward
without gradients through the model with its adapters disabled gives the same figures. This
times one replay step both ways, side by side, on a LoRA model (toy world tokenizer, models of a
few sizes), medians of several runs, and prints the ratio and what keeping costs in memory.

    python benchmarks/bench_kl_base.py [--repeats 7] [--rows 8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--rows", type=int, default=8, help="replay rows per step")
    ap.add_argument("--k", type=int, default=32)
    return ap.parse_args(argv)


if __name__ == "__main__":
    parse_args()  # before the slow imports below: --help and mistakes answer at once

import torch  # noqa: E402

from forgetwatch.replay.penalty import replay_backward  # noqa: E402
from forgetwatch.scoring.batching import padded  # noqa: E402
from forgetwatch.scoring.next_tokens import base_distribution  # noqa: E402
from forgetwatch.toy import ToyWorld  # noqa: E402

SIZES = ((64, 2), (256, 4), (512, 6))  # hidden width, layers


def live_targets(model, token_ids, pad_id: int, k: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The base's top-k and tail per row, from the model with its adapters disabled (no gradients)."""
    ids, mask = padded(token_ids, pad_id)
    with torch.no_grad(), model.disable_adapter():
        logp = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits[:, :-1].float(), -1)
    top_lp, top_ids = logp.topk(k, dim=-1)
    tail = torch.log1p(-top_lp.exp().sum(-1).clamp(max=1 - 1e-7))
    return [(top_ids[r, : len(x) - 1], top_lp[r, : len(x) - 1], tail[r, : len(x) - 1]) for r, x in enumerate(token_ids)]


def main(argv=None) -> int:
    args = parse_args(argv)
    import peft

    torch.set_num_threads(min(2, torch.get_num_threads()))
    world = ToyWorld(seed=0)
    tokenizer = world.tokenizer()
    pad = tokenizer.pad_token_id
    facts = world.fact_texts()
    texts = [" ".join(facts[8 * i : 8 * i + 8]) for i in range(args.rows)]  # rows of a few sentences each
    token_ids = tokenizer(texts)["input_ids"]
    tokens = sum(len(x) - 1 for x in token_ids)
    print(
        f"one replay step of {args.rows} rows ({tokens} predicted tokens), LoRA r=8 on every linear layer, "
        f"k={args.k}, vocabulary {len(tokenizer)}; medians of {args.repeats} runs\n"
    )
    print(f"{'model':>16}{'kept ms':>10}{'live ms':>10}{'live/kept':>11}")
    for hidden, layers in SIZES:
        base = world.model(tokenizer, hidden=hidden, layers=layers, seed=0)
        model = peft.get_peft_model(
            base,
            peft.LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=0.0, task_type="CAUSAL_LM"),
        ).train()
        with model.disable_adapter():
            kept = base_distribution(
                model,
                tokenizer,
                [str(i) for i in range(len(token_ids))],
                token_ids,
                pad,
                args.k,
                rows_per_batch=args.rows,
            )
        stored = [kept.row(str(i)) for i in range(len(token_ids))]
        times = {"kept": [], "live": []}
        for _ in range(args.repeats + 1):  # the first round warms up, and is dropped
            for way in ("kept", "live"):
                start = time.perf_counter()
                targets = stored if way == "kept" else live_targets(model, token_ids, pad, args.k)
                replay_backward(model, token_ids, pad, 1.0, rows_per_batch=args.rows, targets=targets)
                times[way].append(time.perf_counter() - start)
                model.zero_grad(set_to_none=True)
        med = {w: 1000 * statistics.median(t[1:]) for w, t in times.items()}
        print(f"{f'{hidden}x{layers}':>16}{med['kept']:10.1f}{med['live']:10.1f}{med['live'] / med['kept']:10.2f}x")
    per_token = args.k * (4 + 2) + 4  # top ids int32, log-probs float16, tail float32
    print(
        f"\nkept: {per_token} bytes per pool token on disk and in memory (k={args.k}); "
        f"a pool of a million tokens holds {per_token * 1e6 / 2**20:.0f} MiB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
