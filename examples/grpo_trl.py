"""GRPO with TRL while forgetwatch watches MMLU forgetting.

    pip install forgetwatch trl datasets
    python examples/grpo_trl.py                          # Qwen2.5-0.5B-Instruct on trl-lib/tldr
    python examples/grpo_trl.py --max-steps 500 --max-forgetting 0.05 --report-to wandb

Trains ``Qwen/Qwen2.5-0.5B-Instruct`` (``--model``) with TRL's ``GRPOTrainer`` on the prompts
of ``trl-lib/tldr`` (Reddit posts ending in ``TL;DR:``; a plain-text ``prompt`` column, though
conversational prompts work too) with a toy reward: summaries close to ``--target-words``
words score best. Completions are sampled with ``transformers``' ``generate`` (no vLLM),
``--num-generations`` per prompt.

On-policy RL is expected to forget less than SFT on the same budget; this is a place to check.

What forgetwatch does meanwhile, what the run needs and the options the TRL examples share:
``common.py``.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from common import build_probes, parser, train, watched_trainer

if TYPE_CHECKING:
    from trl import GRPOTrainer

    from forgetwatch import ProbeSet

DATASET = "trl-lib/tldr"
TARGET_WORDS = 20
DEFAULTS = {
    "per_device_train_batch_size": 8,
    "num_generations": 4,
    "max_completion_length": 64,
    "learning_rate": 1e-6,
    "use_vllm": False,
}
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
    target_words: int = TARGET_WORDS,
    **settings: Any,
) -> GRPOTrainer:
    """A ``GRPOTrainer`` with a ``ForgetWatchCallback`` attached (as ``trainer.forgetwatch``).

    The reward is :func:`make_length_reward` for ``target_words``. ``settings``: the watch's
    (``eval_steps``, ``max_forgetting``, ``chat_template``, ``lora``) and any ``GRPOConfig`` field
    (num_generations, max_completion_length, ...). The batch is counted in completions:
    ``per_device_train_batch_size`` must be a multiple of ``num_generations`` (8 completions =
    2 prompts x 4 generations by default).
    """
    from trl import GRPOConfig, GRPOTrainer

    return watched_trainer(
        GRPOTrainer,
        GRPOConfig,
        model,
        tokenizer,
        train_dataset,
        probes,
        output_dir,
        {**DEFAULTS, **settings},
        reward_funcs=make_length_reward(target_words),
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser(__doc__, DEFAULTS, dataset=DATASET, dataset_help="dataset with a 'prompt' column", output_dir="out/grpo")
    p.add_argument(
        "--batch-size",
        dest="per_device_train_batch_size",
        type=int,
        help="completions per device and step (a multiple of --num-generations)",
    )
    p.add_argument("--num-generations", type=int, help="completions sampled per prompt")
    p.add_argument("--max-completion-length", type=int, help="tokens per completion")
    p.add_argument("--target-words", type=int, default=TARGET_WORDS, help="the reward's ideal summary length")
    return p.parse_args(argv)


def main(argv: list[str] | None = None):
    return train(parse_args(argv), build_trainer)


if __name__ == "__main__":
    main()
