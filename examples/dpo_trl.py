"""Direct preference optimization with TRL while forgetwatch watches MMLU forgetting.

    pip install forgetwatch trl datasets
    python examples/dpo_trl.py                       # Qwen2.5-0.5B-Instruct on ultrafeedback_binarized
    python examples/dpo_trl.py --max-steps 500 --max-forgetting 0.05 --report-to wandb

Trains ``Qwen/Qwen2.5-0.5B-Instruct`` (``--model``) with TRL's ``DPOTrainer`` on
``trl-lib/ultrafeedback_binarized``: conversational preference pairs, ``chosen`` and
``rejected`` conversations that share their user turn (an implicit prompt, which TRL splits
off; datasets with an explicit ``prompt`` column work too). The model is given to the trainer
as its id, so TRL loads it twice: the policy, and the frozen reference model.

A ``ForgetWatchCallback`` scores a stratified sample of MMLU (``--probes N``, from ``cais/mmlu``
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
when CUDA is available (TRL loads the weights in float32, the optimizer's master copy).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from common import build_probes, common_settings, load_probes, parser, watched_trainer

if TYPE_CHECKING:
    from trl import DPOTrainer

    from forgetwatch import ProbeSet

DATASET = "trl-lib/ultrafeedback_binarized"
__all__ = ["build_probes", "build_trainer", "main"]


def build_trainer(
    model: str,
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
) -> DPOTrainer:
    """A ``DPOTrainer`` with a ``ForgetWatchCallback`` attached (as ``trainer.forgetwatch``).

    ``model`` is a hub id or local path: TRL builds both the policy and the reference model
    from it. ``extra`` overrides any ``DPOConfig`` field (beta, batch size, max_length, ...).
    """
    from trl import DPOConfig, DPOTrainer

    defaults = {
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 8,
        "learning_rate": 1e-6,
        "beta": 0.1,
        "max_length": 1024,
    }
    return watched_trainer(
        DPOTrainer,
        DPOConfig,
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
        dataset_help="preference dataset (chosen/rejected, optional prompt)",
        output_dir="out/dpo",
        learning_rate=1e-6,
    )
    p.add_argument("--beta", type=float, default=0.1, help="DPO's KL strength")
    p.add_argument("--batch-size", type=int, default=2, help="per device")
    p.add_argument("--grad-accum", type=int, default=8, help="gradient accumulation steps")
    p.add_argument("--max-length", type=int, default=1024, help="truncate prompt + completion to this")
    return p.parse_args(argv)


def main(argv: list[str] | None = None):
    args = parse_args(argv)
    # the heavy imports come after the arguments: --help and mistakes answer at once
    from datasets import load_dataset
    from transformers import AutoTokenizer

    probes = load_probes(args.probes, load_dataset)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    trainer = build_trainer(
        args.model,
        tokenizer,
        load_dataset(args.dataset, split="train"),
        probes,
        args.output_dir,
        **common_settings(args),
        beta=args.beta,
        per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=args.grad_accum,
        max_length=args.max_length,
    )
    trainer.train()
    print(trainer.forgetwatch.summary())
    return trainer


if __name__ == "__main__":
    main()
