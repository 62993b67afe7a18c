"""Direct preference optimization with TRL while forgetwatch watches MMLU forgetting.

    pip install forgetwatch trl datasets
    python examples/dpo_trl.py                       # Qwen2.5-0.5B-Instruct on ultrafeedback_binarized
    python examples/dpo_trl.py --max-steps 500 --max-forgetting 0.05 --report-to wandb

Trains ``Qwen/Qwen2.5-0.5B-Instruct`` (``--model``) with TRL's ``DPOTrainer`` on
``trl-lib/ultrafeedback_binarized``: conversational preference pairs, ``chosen`` and
``rejected`` conversations that share their user turn (an implicit prompt, which TRL splits
off; datasets with an explicit ``prompt`` column work too). The model is given to the trainer
as its id, so TRL loads it twice: the policy, and the frozen reference model.

A ``ForgetWatchCallback`` scores a stratified sample of MMLU (``--probes``, from ``cais/mmlu``
with lm-eval-harness's zero-shot prompt) once before training and again every
``--eval-steps`` optimizer steps, logs the ``forgetwatch/*`` metrics to ``--report-to``,
writes ``<output-dir>/forgetwatch/history.jsonl``, and stops training (saving a checkpoint)
once the share of forgotten probes exceeds ``--max-forgetting``.

Probes are scored with ``chat_template=True``: each question is wrapped as a user turn of the
model's chat template, as lm-eval's ``--apply_chat_template`` does. Harmon et al. (ICLR 2026)
evaluated instruct models this way; for a base model without a chat template, pass
``--no-chat-template``.

Needs internet (model and datasets) and, realistically, a GPU: bf16 mixed precision is used
when CUDA is available (TRL loads the weights in float32, the optimizer's master copy).
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from datasets import load_dataset
from transformers import AutoTokenizer
from trl import DPOConfig, DPOTrainer

from forgetwatch import ForgetWatchCallback, ProbeSet

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
DATASET = "trl-lib/ultrafeedback_binarized"


def build_probes(mmlu_rows: Any, n: int = 500, seed: int = 0) -> ProbeSet:
    """``n`` MMLU probes in lm-eval-harness's zero-shot format, sampled across subjects.

    ``mmlu_rows``: a ``datasets.Dataset`` or a list of dicts in the ``cais/mmlu`` layout
    (``question``, ``subject``, ``choices``, ``answer``). Each subject gets a share of ``n``
    proportional to its size; the sample is deterministic for ``seed``; with fewer rows than
    ``n`` every row is kept.
    """
    probes = ProbeSet.from_hf(mmlu_rows, preset="mmlu")
    return probes.sample(min(n, len(probes)), seed=seed)


def build_trainer(model: str, tokenizer, train_dataset, probes: ProbeSet, output_dir: str, *,
                  max_steps: int = 200, eval_steps: int = 50, max_forgetting: float | None = None,
                  use_cpu: bool = False, report_to: str | list[str] | None = None,
                  chat_template: bool = True, **extra: Any) -> DPOTrainer:
    """A ``DPOTrainer`` with a ``ForgetWatchCallback`` attached (as ``trainer.forgetwatch``).

    ``model`` is a hub id or local path: TRL builds both the policy and the reference model
    from it. ``extra`` overrides any ``DPOConfig`` field (beta, batch size, max_length, ...).
    """
    settings: dict[str, Any] = {
        "max_steps": max_steps,
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 8,
        "learning_rate": 1e-6,
        "beta": 0.1,
        "max_length": 1024,
        "logging_steps": 10,
        "bf16": torch.cuda.is_available() and not use_cpu,
        "use_cpu": use_cpu,
        "report_to": report_to or "none",
    }
    settings.update(extra)
    callback = ForgetWatchCallback(probes, eval_steps=eval_steps, max_forgetting=max_forgetting,
                                   chat_template=chat_template)
    trainer = DPOTrainer(model=model, args=DPOConfig(output_dir, **settings), train_dataset=train_dataset,
                         processing_class=tokenizer, callbacks=[callback])
    trainer.forgetwatch = callback
    return trainer


def summarize(trainer) -> str:
    """The final forgetting table, whether training was stopped, and where the history is."""
    callback = trainer.forgetwatch
    lines = []
    if callback.history:
        step, report = callback.history[-1]
        lines += [f"forgetting at step {step} (vs. the model before training):", report.summary()]
    else:
        lines.append("no forgetwatch evaluation ran")
    if callback.stop_reason:
        lines.append(f"forgetwatch stopped training at {callback.stop_reason}")
    lines.append(f"history: {callback.history_path}")
    return "\n".join(lines)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except for on/off flags."""

    def _get_help_string(self, action):
        return action.help if action.nargs == 0 else super()._get_help_string(action)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=_HelpFormatter)
    parser.add_argument("--model", default=MODEL, help="hub id or local path of an instruct model")
    parser.add_argument("--dataset", default=DATASET, help="preference dataset (chosen/rejected, optional prompt)")
    parser.add_argument("--output-dir", default="out/dpo", help="where checkpoints and forgetwatch/ go")
    parser.add_argument("--max-steps", type=int, default=200, help="optimizer steps")
    parser.add_argument("--probes", type=int, default=500, help="MMLU probes, stratified by subject")
    parser.add_argument("--eval-steps", type=int, default=50, help="re-score the probes every N steps")
    parser.add_argument("--max-forgetting", type=float, default=None,
                        help="stop training once this share of the probes is forgotten (e.g. 0.05)")
    parser.add_argument("--learning-rate", type=float, default=1e-6, help="peak learning rate")
    parser.add_argument("--beta", type=float, default=0.1, help="DPO's KL strength")
    parser.add_argument("--batch-size", type=int, default=2, help="per device")
    parser.add_argument("--grad-accum", type=int, default=8, help="gradient accumulation steps")
    parser.add_argument("--max-length", type=int, default=1024, help="truncate prompt + completion to this")
    parser.add_argument("--report-to", default="none", help="wandb, tensorboard, ... or none")
    parser.add_argument("--seed", type=int, default=0, help="training seed (the probe sample is fixed: seed 0)")
    parser.add_argument("--no-chat-template", dest="chat_template", action="store_false",
                        help="score probes as plain text (for base models without a chat template)")
    parser.add_argument("--cpu", action="store_true", help="train on the CPU (slow; for trying things out)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None):
    args = parse_args(argv)
    probes = build_probes(load_dataset("cais/mmlu", "all", split="test"), args.probes, seed=0)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    train_dataset = load_dataset(args.dataset, split="train")
    trainer = build_trainer(
        args.model, tokenizer, train_dataset, probes, args.output_dir,
        max_steps=args.max_steps, eval_steps=args.eval_steps, max_forgetting=args.max_forgetting,
        use_cpu=args.cpu, report_to=args.report_to, chat_template=args.chat_template,
        learning_rate=args.learning_rate, beta=args.beta, per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=args.grad_accum, max_length=args.max_length, seed=args.seed,
    )
    trainer.train()
    print(summarize(trainer))
    return trainer


if __name__ == "__main__":
    main()
