"""A plain PyTorch training loop watched by forgetwatch: no trainer, five lines of forgetwatch.

    python examples/custom_loop.py                                       # the toy files below
    python examples/custom_loop.py --model out/toy/base --probes out/toy/probes.jsonl --text out/toy/train.txt
    python examples/custom_loop.py --resume-from out/loop/checkpoint-20 --max-steps 60

``python examples/make_toy_checkpoints.py out/toy`` writes a small model, probes and text (the
defaults) to try it offline. Trains ``--model`` (a local folder or a hub id) on the lines of ``--text`` with AdamW, and
drives a :class:`forgetwatch.Watch` by hand: ``start`` before the first step, ``due`` and
``evaluate`` after each optimizer step, ``finish`` at the end. The base is scored once, then
every ``--eval-steps`` steps; forgetting above ``--max-forgetting`` stops the loop. Every
``--save-steps`` steps a checkpoint keeps the weights, the optimizer (safetensors) and
``watch.state_dict()`` (JSON): ``--resume-from`` goes on from one exactly. The files are under
``--output-dir`` (``forgetwatch/history.jsonl``; ``forgetwatch report`` draws them).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="out/toy/base", help="the model to train: a local folder or a hub id")
    p.add_argument("--probes", default="out/toy/probes.jsonl", help="a probe JSONL file (see the README)")
    p.add_argument("--text", default="out/toy/train.txt", help="training text: a file with one example per line")
    p.add_argument("--output-dir", default="out/loop", help="where checkpoints and forgetwatch's files go")
    p.add_argument("--max-steps", type=int, default=40, help="optimizer steps (default 40)")
    p.add_argument("--eval-steps", type=int, default=10, help="evaluate every N steps (default 10)")
    p.add_argument("--max-forgetting", type=float, default=None, help="stop above this forgetting rate")
    p.add_argument("--save-steps", type=int, default=20, help="checkpoint every N steps (default 20)")
    p.add_argument("--resume-from", default=None, help="a checkpoint folder of this loop to go on from")
    p.add_argument("--batch-size", type=int, default=16, help="examples per step (default 16)")
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW's learning rate (default 3e-3)")
    p.add_argument("--seed", type=int, default=0, help="the seed of the batches (default 0)")
    return p


def batch_at(texts: list[str], step: int, size: int, seed: int) -> list[str]:
    """The examples of ``step``: a function of the step alone, so a resumed loop sees the same data."""
    return random.Random(seed * 1_000_003 + step).sample(texts, min(size, len(texts)))


def lm_loss(model: Any, tokenizer: Any, texts: list[str]) -> Any:
    """The mean next-token loss on ``texts`` (each ended by EOS), padding left out."""
    enc = tokenizer([t + tokenizer.eos_token for t in texts], return_tensors="pt", padding=True)
    enc = {k: v.to(model.device) for k, v in enc.items()}
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    return model(**enc, labels=labels).loss


def save_optimizer(optimizer: Any, folder: Path) -> None:
    """AdamW's state as safetensors (tensors) and JSON (the rest): no pickle."""
    from safetensors.torch import save_file

    tensors, steps = {}, {}
    for i, state in optimizer.state_dict()["state"].items():
        for name, value in state.items():
            if name == "step":
                steps[str(i)] = float(value)
            else:
                tensors[f"{i}.{name}"] = value.contiguous()
    save_file(tensors, str(folder / "optimizer.safetensors"))
    (folder / "optimizer.json").write_text(json.dumps({"steps": steps}))


def load_optimizer(optimizer: Any, folder: Path) -> None:
    import torch
    from safetensors.torch import load_file

    tensors = load_file(str(folder / "optimizer.safetensors"))
    steps = json.loads((folder / "optimizer.json").read_text())["steps"]
    state = optimizer.state_dict()
    state["state"] = {
        int(i): {
            "step": torch.tensor(step),
            **{key.split(".", 1)[1]: value for key, value in tensors.items() if key.split(".", 1)[0] == i},
        }
        for i, step in steps.items()
    }
    optimizer.load_state_dict(state)


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    # the heavy imports come after the arguments: --help and mistakes answer at once
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from forgetwatch import ProbeSet, Watch

    out = Path(args.output_dir)
    texts = [line for line in Path(args.text).read_text(encoding="utf-8").splitlines() if line.strip()]
    probes = ProbeSet.from_jsonl(args.probes)  # a bad probe file fails here, before any training
    source = args.resume_from or args.model
    model = AutoModelForCausalLM.from_pretrained(source)
    tokenizer = AutoTokenizer.from_pretrained(source)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    watch = Watch(
        probes, output_dir=out / "forgetwatch", eval_steps=args.eval_steps, max_forgetting=args.max_forgetting
    )
    if args.resume_from:
        load_optimizer(optimizer, Path(args.resume_from))
        watch.load_state_dict(json.loads((Path(args.resume_from) / "forgetwatch.json").read_text()))
    watch.start(model, tokenizer)  # the base snapshot (or the kept one, on resume)
    step = first = watch.state_dict()["step"]
    model.train()
    for step in range(first + 1, args.max_steps + 1):
        lm_loss(model, tokenizer, batch_at(texts, step, args.batch_size, args.seed)).backward()
        optimizer.step()
        optimizer.zero_grad()
        evaluation = watch.evaluate(model, step) if watch.due(step) else None  # None: skipped, with a warning
        stop = evaluation is not None and evaluation.stop
        if step % args.save_steps == 0 or stop:
            folder = out / f"checkpoint-{step}"
            model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
            save_optimizer(optimizer, folder)
            (folder / "forgetwatch.json").write_text(json.dumps(watch.state_dict()))
        if stop:
            break
    watch.finish(model, step)
    print(watch.summary())


if __name__ == "__main__":
    main()
