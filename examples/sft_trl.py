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

Probes are scored with ``chat_template=True``: each question is wrapped as a user turn of the
model's chat template, as lm-eval's ``--apply_chat_template`` does. Harmon et al. (ICLR 2026)
evaluated instruct models this way; for a base model without a chat template, pass
``--no-chat-template``.

Needs internet (model and datasets) and, realistically, a GPU: bf16 mixed precision is used
when CUDA is available. The weights are loaded in float32 (the optimizer's master copy), and
forgetwatch scores in those float32 weights, autocast off (``Scoring(precision="weights")``).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from common import build_probes, common_settings, load_probes, parser, watched_trainer

if TYPE_CHECKING:
    from trl import SFTTrainer

    from forgetwatch import ProbeSet

DATASET = "trl-lib/Capybara"
__all__ = ["build_probes", "build_trainer", "main"]


def build_trainer(
    model,
    tokenizer,
    train_dataset,
    probes: ProbeSet,
    output_dir: str,
    *,
    max_steps: int = 200,
    eval_steps: int = 50,
    max_forgetting: float | None = None,
    use_cpu: bool = False,
    report_to: str | list[str] | None = None,
    chat_template: bool = True,
    lora: bool = False,
    **extra: Any,
) -> SFTTrainer:
    """An ``SFTTrainer`` with a ``ForgetWatchCallback`` attached (as ``trainer.forgetwatch``).

    ``extra`` overrides any ``SFTConfig`` field (batch size, learning rate, max_length, ...).
    """
    from trl import SFTConfig, SFTTrainer

    defaults = {
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 4,
        "learning_rate": 2e-5,
        "max_length": 1024,
    }
    return watched_trainer(
        SFTTrainer,
        SFTConfig,
        output_dir,
        probes,
        defaults=defaults,
        max_steps=max_steps,
        eval_steps=eval_steps,
        max_forgetting=max_forgetting,
        use_cpu=use_cpu,
        report_to=report_to,
        chat_template=chat_template,
        extra=extra,
        lora=lora,
        model=model,
        train_dataset=train_dataset,
        processing_class=tokenizer,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser(
        __doc__,
        dataset=DATASET,
        dataset_help="conversational SFT dataset ('messages' column)",
        output_dir="out/sft",
        learning_rate=2e-5,
    )
    p.add_argument("--batch-size", type=int, default=4, help="per device")
    p.add_argument("--grad-accum", type=int, default=4, help="gradient accumulation steps")
    p.add_argument("--max-length", type=int, default=1024, help="truncate training sequences to this")
    return p.parse_args(argv)


def main(argv: list[str] | None = None):
    args = parse_args(argv)
    # the heavy imports come after the arguments: --help and mistakes answer at once
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    probes = load_probes(args.probes, load_dataset)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    trainer = build_trainer(
        model,
        tokenizer,
        load_dataset(args.dataset, split="train"),
        probes,
        args.output_dir,
        **common_settings(args),
        per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=args.grad_accum,
        max_length=args.max_length,
    )
    trainer.train()
    print(trainer.forgetwatch.summary())
    return trainer


if __name__ == "__main__":
    main()
