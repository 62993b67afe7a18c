"""Supervised fine-tuning with TRL while forgetwatch watches MMLU forgetting.

    pip install forgetwatch trl datasets
    python examples/sft_trl.py                                  # Qwen2.5-0.5B-Instruct on Capybara
    python examples/sft_trl.py --max-steps 500 --max-forgetting 0.05 --report-to wandb

Trains ``Qwen/Qwen2.5-0.5B-Instruct`` (``--model``) with TRL's ``SFTTrainer`` on
``trl-lib/Capybara`` (conversational: a ``messages`` column of user / assistant turns). A
``ForgetWatchCallback`` scores a stratified sample of MMLU (``--probes N``, from ``cais/mmlu``
with lm-eval-harness's zero-shot prompt), or your own probe file (``--probes FILE.jsonl``),
once before training and again every ``--eval-steps`` optimizer steps, logs the
``forgetwatch/*`` metrics to ``--report-to``, writes ``<output-dir>/forgetwatch/history.jsonl``,
and stops training (saving a checkpoint) once the share of forgotten probes exceeds
``--max-forgetting``.

What forgetwatch does meanwhile, what the run needs and the options the TRL examples share:
``common.py``.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from common import build_probes, parser, train, watched_trainer

if TYPE_CHECKING:
    from trl import SFTTrainer

    from forgetwatch import ProbeSet

DATASET = "trl-lib/Capybara"
DEFAULTS = {
    "per_device_train_batch_size": 4,
    "gradient_accumulation_steps": 4,
    "learning_rate": 2e-5,
    "max_length": 1024,
}
__all__ = ["build_probes", "build_trainer", "main"]


def build_trainer(model, tokenizer, train_dataset, probes: ProbeSet, output_dir: str, **settings: Any) -> SFTTrainer:
    """An ``SFTTrainer`` with a ``ForgetWatchCallback`` attached (as ``trainer.forgetwatch``).

    ``settings``: the watch's (``eval_steps``, ``max_forgetting``, ``chat_template``, ``lora``)
    and any ``SFTConfig`` field (batch size, learning rate, max_length, ...).
    """
    from trl import SFTConfig, SFTTrainer

    return watched_trainer(
        SFTTrainer, SFTConfig, model, tokenizer, train_dataset, probes, output_dir, {**DEFAULTS, **settings}
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser(
        __doc__,
        DEFAULTS,
        dataset=DATASET,
        dataset_help="conversational SFT dataset ('messages' column)",
        output_dir="out/sft",
    )
    p.add_argument("--batch-size", dest="per_device_train_batch_size", type=int, help="per device")
    p.add_argument("--grad-accum", dest="gradient_accumulation_steps", type=int, help="gradient accumulation steps")
    p.add_argument("--max-length", type=int, help="truncate training sequences to this")
    return p.parse_args(argv)


def main(argv: list[str] | None = None):
    return train(parse_args(argv), build_trainer)


if __name__ == "__main__":
    main()
