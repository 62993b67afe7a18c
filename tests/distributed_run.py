"""Run by tests/test_distributed.py under ``torchrun --nproc_per_node 2`` (gloo, CPU).

Each rank trains the toy model with ForgetWatchCallback on the default budget schedule and an
early-stop rule; rank 1 is made slower, so the ranks' clocks disagree. Each writes what it saw
to ``<out>/rank<N>.json``.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import DataCollatorForLanguageModeling, Trainer, TrainerCallback, TrainingArguments  # noqa: E402

from forgetwatch import ProbeSet  # noqa: E402
from forgetwatch.callback import ForgetWatchCallback  # noqa: E402
from forgetwatch.toy import ToyWorld  # noqa: E402


class SlowerOnRankOne(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if args.process_index == 1:
            time.sleep(0.03)


def main(out: str) -> None:
    torch.set_num_threads(1)
    world = ToyWorld(seed=0)
    tokenizer, base, _ = world.base_and_tuned(base_steps=150, tuned_steps=0)
    probes = ProbeSet.from_records(world.probe_records(generative=False))
    data = Dataset.from_dict({"text": world.distraction_texts()}).map(
        lambda b: tokenizer(b["text"]), batched=True, remove_columns=["text"])
    cb = ForgetWatchCallback(probes, max_overhead=0.2, max_forgetting=0.45, verbose=False)
    args = TrainingArguments(out, max_steps=150, per_device_train_batch_size=8, learning_rate=3e-3,
                             report_to=[], save_strategy="no", use_cpu=True, seed=0, disable_tqdm=True,
                             logging_steps=1000, ddp_backend="gloo")
    trainer = Trainer(model=base, args=args, train_dataset=data, processing_class=tokenizer,
                      data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
                      callbacks=[cb, SlowerOnRankOne()])
    trainer.train()
    rank = args.process_index
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"world_size": args.world_size, "steps": [s for s, _ in cb.history],
                   "forgotten": [r.forgotten for _, r in cb.history], "stopped": cb.stop_reason is not None,
                   "global_step": trainer.state.global_step}, f)


if __name__ == "__main__":
    main(sys.argv[1])
