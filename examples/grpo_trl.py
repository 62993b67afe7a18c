"""GRPO with TRL while forgetwatch watches MMLU forgetting.

    pip install forgetwatch trl datasets
    python examples/grpo_trl.py                          # Qwen2.5-0.5B-Instruct on trl-lib/tldr
    python examples/grpo_trl.py --max-steps 500 --max-forgetting 0.05 --report-to wandb

Trains ``Qwen/Qwen2.5-0.5B-Instruct`` (``--model``) with TRL's ``GRPOTrainer`` on the prompts
of ``trl-lib/tldr`` (Reddit posts ending in ``TL;DR:``; a plain-text ``prompt`` column, though
conversational prompts work too) with a toy reward: summaries close to ``--target-words``
words score best. Completions are sampled with ``transformers``' ``generate`` (no vLLM),
``--num-generations`` per prompt.

A ``ForgetWatchCallback`` scores a stratified sample of MMLU (``--probes N``, from ``cais/mmlu``
with lm-eval-harness's zero-shot prompt), or your own probe file (``--probes FILE.jsonl``),
once before training and again every ``--eval-steps`` optimizer steps, logs the
``forgetwatch/*`` metrics to ``--report-to``, writes ``<output-dir>/forgetwatch/history.jsonl``,
and stops training (saving a checkpoint) once the share of forgotten probes exceeds
``--max-forgetting``. On-policy RL is expected to forget less than SFT on the same budget;
this is a place to check.

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
    from trl import GRPOTrainer

    from forgetwatch import ProbeSet

DATASET = "trl-lib/tldr"
TARGET_WORDS = 20
__all__ = ["build_probes", "build_trainer", "make_length_reward", "main"]


def completion_text(completion: Any) -> str:
    """A completion as text: TRL passes strings for plain prompts and a list of messages
    (``[{"role": "assistant", "content": ...}]``) for conversational ones."""
    if isinstance(completion, str):
        return completion
    return "".join(message.get("content") or "" for message in completion)


def make_length_reward(target_words: int = TARGET_WORDS):
    """A reward function: 1 for a completion of exactly ``target_words`` words, falling
    linearly to 0 at twice (or zero times) that length, and below 0 beyond.

    TRL calls it with the batch's ``prompts`` and ``completions`` and every other dataset
    column as keywords (tldr's reference ``completion``, ...), which it ignores.
    """

    def length_reward(completions: list[Any], **kwargs: Any) -> list[float]:
        return [1.0 - abs(len(completion_text(c).split()) - target_words) / target_words for c in completions]

    return length_reward


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
    target_words: int = TARGET_WORDS,
    lora: bool = False,
    **extra: Any,
) -> GRPOTrainer:
    """A ``GRPOTrainer`` with a ``ForgetWatchCallback`` attached (as ``trainer.forgetwatch``).

    ``extra`` overrides any ``GRPOConfig`` field (num_generations, max_completion_length, ...).
    The reward is :func:`make_length_reward` for ``target_words``.
    The batch is counted in completions: ``per_device_train_batch_size`` must be a multiple of
    ``num_generations`` (8 completions = 2 prompts x 4 generations by default).
    """
    from trl import GRPOConfig, GRPOTrainer

    defaults = {
        "per_device_train_batch_size": 8,
        "num_generations": 4,
        "max_completion_length": 64,
        "learning_rate": 1e-6,
        "use_vllm": False,
    }
    return watched_trainer(
        GRPOTrainer,
        GRPOConfig,
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
        reward_funcs=make_length_reward(target_words),
        train_dataset=train_dataset,
        processing_class=tokenizer,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser(
        __doc__,
        dataset=DATASET,
        dataset_help="dataset with a 'prompt' column",
        output_dir="out/grpo",
        learning_rate=1e-6,
    )
    p.add_argument(
        "--batch-size", type=int, default=8, help="completions per device and step (a multiple of --num-generations)"
    )
    p.add_argument("--num-generations", type=int, default=4, help="completions sampled per prompt")
    p.add_argument("--max-completion-length", type=int, default=64, help="tokens per completion")
    p.add_argument("--target-words", type=int, default=TARGET_WORDS, help="the reward's ideal summary length")
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
        target_words=args.target_words,
        per_device_train_batch_size=args.batch_size,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
    )
    trainer.train()
    print(trainer.forgetwatch.summary())
    return trainer


if __name__ == "__main__":
    main()
