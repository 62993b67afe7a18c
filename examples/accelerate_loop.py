"""An Accelerate training loop on several processes, watched by forgetwatch.

    accelerate launch --multi_gpu --num_processes 2 examples/accelerate_loop.py --model out/toy/base
    accelerate launch --multi_gpu --num_processes 2 examples/accelerate_loop.py --cpu
    python examples/accelerate_loop.py --cpu --max-forgetting 0.05

The loop of ``custom_loop.py`` (same options and defaults, the toy files of
``examples/make_toy_checkpoints.py out/toy``; same checkpoints) with the model and optimizer
prepared by ``accelerate`` (DDP over the processes). Every process drives the same
:class:`forgetwatch.Watch` at the same steps: each scores its share of the probes and all
get every answer; rank 0 writes the files and decides, for every rank, when to stop. Each
process says at the end at which step it stopped, if forgetwatch stopped it. ``--cpu`` runs
the processes on the CPU (gloo), as the second command does on a machine without GPUs.
"""

from __future__ import annotations

import json
from pathlib import Path

from custom_loop import batch_at, lm_loss, load_optimizer, parser, save_optimizer


def main(argv: list[str] | None = None) -> None:
    options = parser()
    options.description = __doc__.split("\n\n")[0]
    options.add_argument("--cpu", action="store_true", help="run every process on the CPU (gloo), GPUs or not")
    args = options.parse_args(argv)
    # the heavy imports come after the arguments: --help and mistakes answer at once
    import torch
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from forgetwatch import ProbeSet, Watch

    accelerator = Accelerator(cpu=args.cpu)
    out = Path(args.output_dir)
    texts = [line for line in Path(args.text).read_text(encoding="utf-8").splitlines() if line.strip()]
    probes = ProbeSet.from_jsonl(args.probes)
    source = args.resume_from or args.model
    model = AutoModelForCausalLM.from_pretrained(source)
    tokenizer = AutoTokenizer.from_pretrained(source)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    if args.resume_from:
        load_optimizer(optimizer, Path(args.resume_from))
    model, optimizer = accelerator.prepare(model, optimizer)

    watch = Watch(
        probes, output_dir=out / "forgetwatch", eval_steps=args.eval_steps, max_forgetting=args.max_forgetting
    )
    if args.resume_from:
        watch.load_state_dict(json.loads((Path(args.resume_from) / "forgetwatch.json").read_text()))
    watch.start(model, tokenizer)  # on every process: each takes part in scoring the base
    step = first = watch.state_dict()["step"]
    model.train()
    rank, ranks = accelerator.process_index, accelerator.num_processes
    for step in range(first + 1, args.max_steps + 1):
        batch = batch_at(texts, step, args.batch_size, args.seed)[rank::ranks]  # this process's share
        accelerator.backward(lm_loss(model, tokenizer, batch))
        optimizer.step()
        optimizer.zero_grad()
        evaluation = watch.evaluate(model, step) if watch.due(step) else None  # None: skipped, with a warning
        stop = evaluation is not None and evaluation.stop  # the same on every process
        if (step % args.save_steps == 0 or stop) and accelerator.is_main_process:
            folder = out / f"checkpoint-{step}"
            accelerator.unwrap_model(model).save_pretrained(folder)
            tokenizer.save_pretrained(folder)
            save_optimizer(optimizer.optimizer, folder)
            (folder / "forgetwatch.json").write_text(json.dumps(watch.state_dict()))
        accelerator.wait_for_everyone()
        if stop:
            break
    watch.finish(model, step)
    if watch.stop_step is not None:
        print(f"[rank {rank}] forgetwatch stopped training at step {watch.stop_step}", flush=True)
    if accelerator.is_main_process:
        print(watch.summary())


if __name__ == "__main__":
    main()
