"""Direct preference optimization with TRL while forgetwatch watches MMLU forgetting.

    pip install forgetwatch trl datasets
    python examples/dpo_trl.py                       # Qwen2.5-0.5B-Instruct on ultrafeedback_binarized
    python examples/dpo_trl.py --max-steps 500 --max-forgetting 0.05 --report-to wandb

Trains ``Qwen/Qwen2.5-0.5B-Instruct`` (``--model``) with TRL's ``DPOTrainer`` on
``trl-lib/ultrafeedback_binarized``: conversational preference pairs, ``chosen`` and
``rejected`` conversations that share their user turn (an implicit prompt, which TRL splits
off; datasets with an explicit ``prompt`` column work too). The model is given to the trainer
as its id, so TRL loads it twice: the policy, and the frozen reference model.

What forgetwatch does meanwhile, what the run needs and the options the TRL examples share:
``common.py``.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from common import build_probes, parser, train, watched_trainer

if TYPE_CHECKING:
    from trl import DPOTrainer

    from forgetwatch import ProbeSet

DATASET = "trl-lib/ultrafeedback_binarized"
DEFAULTS = {
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 8,
    "learning_rate": 1e-6,
    "beta": 0.1,
    "max_length": 1024,
}
__all__ = ["build_probes", "build_trainer", "main"]


def build_trainer(
    model: str, tokenizer, train_dataset, probes: ProbeSet, output_dir: str, **settings: Any
) -> DPOTrainer:
    """A ``DPOTrainer`` with a ``ForgetWatchCallback`` attached (as ``trainer.forgetwatch``).

    ``model`` is a hub id or local path: TRL builds both the policy and the reference model
    from it. ``settings``: the watch's (``eval_steps``, ``max_forgetting``, ``chat_template``,
    ``lora``) and any ``DPOConfig`` field (beta, batch size, max_length, ...).
    """
    from trl import DPOConfig, DPOTrainer

    return watched_trainer(
        DPOTrainer, DPOConfig, model, tokenizer, train_dataset, probes, output_dir, {**DEFAULTS, **settings}
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser(
        __doc__,
        DEFAULTS,
        dataset=DATASET,
        dataset_help="preference dataset (chosen/rejected, optional prompt)",
        output_dir="out/dpo",
    )
    p.add_argument("--beta", type=float, help="DPO's KL strength")
    p.add_argument("--batch-size", dest="per_device_train_batch_size", type=int, help="per device")
    p.add_argument("--grad-accum", dest="gradient_accumulation_steps", type=int, help="gradient accumulation steps")
    p.add_argument("--max-length", type=int, help="truncate prompt + completion to this")
    return p.parse_args(argv)


def main(argv: list[str] | None = None):
    return train(parse_args(argv), build_trainer, load_model=False)


if __name__ == "__main__":
    main()
