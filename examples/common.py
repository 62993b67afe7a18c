"""What the TRL examples (``sft_trl.py``, ``dpo_trl.py``, ``grpo_trl.py``) share: MMLU probes,
the callback on a TRL trainer, the common options, ``main``.

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

The examples need internet (model and datasets) and, realistically, a GPU: bf16 mixed
precision is used when CUDA is available. The weights are loaded in float32 (the optimizer's
master copy), and forgetwatch scores in those float32 weights, autocast off
(``Scoring(precision="weights")``).

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
    trainer_class, config_class, model, tokenizer, train_dataset, probes: ProbeSet, output_dir: str, settings, **parts
):
    """A TRL trainer with a ``ForgetWatchCallback`` attached (as ``trainer.forgetwatch``).

    ``settings``: the watch's ``eval_steps`` (50), ``max_forgetting`` (none), ``chat_template``
    (on) and ``lora`` (off: on trains LoRA adapters on every linear layer and scores the base with
    them disabled, no snapshot to keep); every other key is a field of ``config_class``.
    ``parts``: the trainer's other arguments (GRPO's reward functions).
    """
    import torch

    from forgetwatch import ForgetWatchCallback, Scoring

    settings = dict(settings)
    lora = settings.pop("lora", False)
    callback = ForgetWatchCallback(
        probes,
        eval_steps=settings.pop("eval_steps", 50),
        max_forgetting=settings.pop("max_forgetting", None),
        base="adapter_disabled" if lora else None,
        scoring=Scoring(chat_template=settings.pop("chat_template", True)),
    )
    if lora:
        from peft import LoraConfig

        parts["peft_config"] = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    config = {
        "max_steps": 200,
        "logging_steps": 10,
        "bf16": torch.cuda.is_available() and not settings.get("use_cpu", False),
        **settings,
        "report_to": settings.get("report_to") or "none",
    }
    trainer = trainer_class(
        model=model,
        args=config_class(output_dir, **config),
        train_dataset=train_dataset,
        processing_class=tokenizer,
        callbacks=[callback],
        **parts,
    )
    trainer.forgetwatch = callback
    return trainer


def train(args: argparse.Namespace, build_trainer, *, load_model: bool = True):
    """``main`` of every example: the probes, tokenizer, model and data the options name, the
    trainer built by the example's ``build_trainer``, trained; its summary printed.

    Every option but ``--model``, ``--dataset``, ``--output-dir`` and ``--probes`` is passed on to
    ``build_trainer`` under its ``dest`` name. ``load_model=False`` passes the model's id instead
    of its weights (DPO's trainer loads the policy and the reference model itself).
    """
    # the heavy imports come after the arguments: --help and mistakes answer at once
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    probes = load_probes(args.probes, load_dataset)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    # float32: the optimizer's master copy, which forgetwatch scores (bf16 autocast trains)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32) if load_model else args.model
    settings = {k: v for k, v in vars(args).items() if k not in ("model", "dataset", "output_dir", "probes")}
    data = load_dataset(args.dataset, split="train")
    trainer = build_trainer(model, tokenizer, data, probes, args.output_dir, **settings)
    trainer.train()
    print(trainer.forgetwatch.summary())
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
    doc: str, defaults: dict[str, Any], *, dataset: str, dataset_help: str, output_dir: str
) -> argparse.ArgumentParser:
    """The options every example has; each adds its trainer's own, named by their config field
    (``dest``) and defaulting to the example's ``defaults`` (its config values)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0], formatter_class=HelpFormatter)
    p.set_defaults(**defaults)  # an option added without a default takes its field's from here
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
    p.add_argument("--learning-rate", type=float, help="peak learning rate")
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
    p.add_argument("--cpu", dest="use_cpu", action="store_true", help="train on the CPU (slow; for trying things out)")
    return p
