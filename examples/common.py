"""What the TRL examples share: MMLU probes, the callback on a TRL trainer, common options.

Keep this file beside the example you copy. torch and forgetwatch are imported inside the
functions that use them, so that an example's ``--help`` answers before they load.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from forgetwatch import ProbeSet

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


def build_probes(mmlu_rows: Any, n: int = 500, seed: int = 0) -> ProbeSet:
    """``n`` MMLU probes in lm-eval-harness's zero-shot format, sampled across subjects.

    ``mmlu_rows``: a ``datasets.Dataset`` or a list of dicts in the ``cais/mmlu`` layout
    (``question``, ``subject``, ``choices``, ``answer``). Each subject gets a share of ``n``
    proportional to its size; the sample is deterministic for ``seed``; with fewer rows than
    ``n`` every row is kept.
    """
    from forgetwatch import ProbeSet

    probes = ProbeSet.from_hf(mmlu_rows, preset="mmlu")
    return probes.sample(min(n, len(probes)), seed=seed)


def watched_trainer(
    trainer_class,
    config_class,
    output_dir: str,
    probes: ProbeSet,
    *,
    defaults: dict[str, Any],
    max_steps: int,
    eval_steps: int,
    max_forgetting: float | None,
    use_cpu: bool,
    report_to: str | list[str] | None,
    chat_template: bool,
    extra: dict[str, Any],
    lora: bool = False,
    **trainer_kwargs: Any,
):
    """A TRL trainer with a ``ForgetWatchCallback`` attached (as ``trainer.forgetwatch``).

    ``defaults`` are the example's config values; ``extra`` overrides any config field.
    ``lora``: train LoRA adapters on every linear layer, and score the base with them
    disabled (no snapshot to keep).
    """
    import torch

    from forgetwatch import ForgetWatchCallback, Scoring

    settings = {
        "max_steps": max_steps,
        "logging_steps": 10,
        "use_cpu": use_cpu,
        "bf16": torch.cuda.is_available() and not use_cpu,
        "report_to": report_to or "none",
        **defaults,
        **extra,
    }
    if lora:
        from peft import LoraConfig

        trainer_kwargs["peft_config"] = LoraConfig(
            r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM"
        )
    callback = ForgetWatchCallback(
        probes,
        eval_steps=eval_steps,
        max_forgetting=max_forgetting,
        base="adapter_disabled" if lora else None,
        scoring=Scoring(chat_template=chat_template),
    )
    trainer = trainer_class(args=config_class(output_dir, **settings), callbacks=[callback], **trainer_kwargs)
    trainer.forgetwatch = callback
    return trainer


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except for on/off flags."""

    def _get_help_string(self, action):
        return action.help if action.nargs == 0 else super()._get_help_string(action)


def probes_option(text: str) -> int | ProbeSet:
    """``--probes``: a number of MMLU probes to sample, or a JSONL probe file, loaded here so that
    a bad file stops the script before any download.

    Example:
        >>> probes_option("200")
        200
    """
    try:
        n = int(text)
    except ValueError:
        pass
    else:
        if n < 1:
            raise argparse.ArgumentTypeError(f"{text}: give at least 1 probe, or a probe file")
        return n
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"no such file: {text} (give a number of MMLU probes or a JSONL probe file)")
    from forgetwatch import ProbeError, ProbeSet

    try:
        return ProbeSet.from_jsonl(text)
    except (ProbeError, OSError) as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def load_probes(option: int | ProbeSet, load_dataset) -> ProbeSet:
    """The probes ``--probes`` asked for: its probe file's, or that many MMLU probes from
    ``cais/mmlu`` (``load_dataset`` is ``datasets.load_dataset``, called only then)."""
    if isinstance(option, int):
        return build_probes(load_dataset("cais/mmlu", "all", split="test"), option, seed=0)
    return option


def parser(
    doc: str, *, dataset: str, dataset_help: str, output_dir: str, learning_rate: float
) -> argparse.ArgumentParser:
    """The options every example has; each adds its trainer's own."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--model", default=MODEL, help="hub id or local path of an instruct model")
    p.add_argument("--dataset", default=dataset, help=dataset_help)
    p.add_argument("--output-dir", default=output_dir, help="where checkpoints and forgetwatch/ go")
    p.add_argument("--max-steps", type=int, default=200, help="optimizer steps")
    p.add_argument(
        "--probes",
        type=probes_option,
        default=500,
        metavar="N|FILE",
        help="N MMLU probes, stratified by subject (downloads cais/mmlu), or a JSONL probe file",
    )
    p.add_argument("--eval-steps", type=int, default=50, help="re-score the probes every N steps")
    p.add_argument(
        "--max-forgetting",
        type=float,
        default=None,
        help="stop training once this share of the probes is forgotten (e.g. 0.05)",
    )
    p.add_argument("--learning-rate", type=float, default=learning_rate, help="peak learning rate")
    p.add_argument("--report-to", default="none", help="wandb, tensorboard, ... or none")
    p.add_argument("--seed", type=int, default=0, help="training seed (the probe sample is fixed: seed 0)")
    p.add_argument(
        "--no-chat-template",
        dest="chat_template",
        action="store_false",
        help="score probes as plain text (for base models without a chat template)",
    )
    p.add_argument(
        "--lora",
        action="store_true",
        help="train LoRA adapters (pip install peft); the base is the model with them disabled",
    )
    p.add_argument("--cpu", action="store_true", help="train on the CPU (slow; for trying things out)")
    return p


def common_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of ``build_trainer`` that come from the common options."""
    return dict(
        max_steps=args.max_steps,
        eval_steps=args.eval_steps,
        max_forgetting=args.max_forgetting,
        use_cpu=args.cpu,
        report_to=args.report_to,
        chat_template=args.chat_template,
        learning_rate=args.learning_rate,
        seed=args.seed,
        lora=args.lora,
    )
