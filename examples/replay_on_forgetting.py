"""Repair forgetting while training: replay a pool of text chosen by what the run forgets.

    python examples/replay_on_forgetting.py                  # offline toy world, CPU, ~20 s
    python examples/replay_on_forgetting.py --output-dir out/replay --max-steps 40 --replay-weight 0.5

The probes must stay held out: what the model is trained on may never hold a probe's question,
or the probe measures nothing. So the toy world is split in two. The probes ask about the facts
of one half of the countries the model knows; the replay pool holds the facts of the *other*
half (``ForgetWatchCallback`` refuses a pool that holds a probe's question, naming both ids).

The script fine-tunes the same base model twice on unrelated arithmetic with TRL's
``SFTTrainer``, with the same seed: once without replay, once with
``ForgetWatchCallback(probes, replay=pool)``, which before each optimizer step adds the loss
gradient of a few pool rows, drawn by category in proportion to the forgetting measured at the
last evaluation. It prints both runs' forgetting side by side.

A function in ``sinks=`` (``f(report, step)``, after each evaluation) is room for a policy of your own: here
:class:`AtRiskLog` keeps, at each evaluation, the probes still right but slipping
(``report.at_risk_ids``), which is where forgetting comes next.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from common import HelpFormatter


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("--output-dir", default="out/replay", help="the two runs' trainer output and forgetwatch/")
    parser.add_argument("--max-steps", type=int, default=30, help="fine-tuning steps on the arithmetic")
    parser.add_argument("--eval-steps", type=int, default=5, help="re-score the probes every N steps")
    parser.add_argument("--replay-weight", type=float, default=1.0, help="how much the replay loss counts")
    parser.add_argument("--base-steps", type=int, default=200, help="steps teaching the base model the facts")
    return parser.parse_args(argv)


if __name__ == "__main__":
    parse_args()  # before the slow imports below: --help and mistakes answer at once

import datasets  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

from forgetwatch import (  # noqa: E402
    ForgetWatchCallback,
    Output,
    ProbeSet,
    Replay,
    ReplayPool,
    TransitionReport,
)
from forgetwatch.common.text import pct  # noqa: E402
from forgetwatch.toy import ToyWorld  # noqa: E402


def split_world(world: ToyWorld) -> tuple[ProbeSet, ReplayPool]:
    """Probes on the facts of one half of the known countries, a replay pool of the other half's."""
    probes, pool = world.replay_split()
    return ProbeSet.from_records(probes, source="toy probes"), ReplayPool.from_records(pool, source="toy pool")


class AtRiskLog:
    """A function in ``sinks=``: at each evaluation, the probes at risk (still right, slipping).

    Example:
        >>> log = AtRiskLog()
        >>> log(TransitionReport(at_risk_ids=["q1"]), 10); log.by_step
        {10: ['q1']}
    """

    def __init__(self) -> None:
        self.by_step: dict[int, list[str]] = {}

    def __call__(self, report: TransitionReport, step: int) -> None:
        self.by_step[step] = list(report.at_risk_ids)


def build_trainer(
    model,
    tokenizer,
    texts: list[str],
    probes: ProbeSet,
    output_dir: str | os.PathLike[str],
    *,
    pool: ReplayPool | None = None,
    max_steps: int = 30,
    eval_steps: int = 5,
    replay_weight: float = 1.0,
    **extra: Any,
) -> SFTTrainer:
    """A CPU ``SFTTrainer`` on ``texts`` watched by ``ForgetWatchCallback`` (replaying ``pool``
    when given); the callback is ``trainer.forgetwatch``, ``extra`` overrides ``SFTConfig`` fields."""
    settings: dict[str, Any] = {
        "max_steps": max_steps,
        "per_device_train_batch_size": 8,
        "learning_rate": 3e-3,
        "max_length": 64,
        "packing": False,
        "logging_steps": max(1, eval_steps),
        "save_strategy": "no",
        "report_to": "none",
        "use_cpu": True,
        "bf16": False,
        "activation_checkpointing": False,
        "dataloader_num_workers": 0,
        "dataloader_pin_memory": False,
        "disable_tqdm": True,
        "seed": 0,
    }
    settings.update(extra)
    replay = None if pool is None else Replay(pool, weight=replay_weight)
    callback = ForgetWatchCallback(
        probes, eval_steps=eval_steps, output=Output(verbose=False), sinks=[AtRiskLog()], replay=replay
    )
    trainer = SFTTrainer(
        model=model,
        args=SFTConfig(str(output_dir), **settings),
        processing_class=tokenizer,
        train_dataset=datasets.Dataset.from_dict({"text": list(texts)}),
        callbacks=[callback],
    )
    trainer.forgetwatch = callback
    return trainer


def run(world: ToyWorld, tokenizer, model, output_dir: str | os.PathLike[str], **options: Any) -> dict[str, SFTTrainer]:
    """Fine-tune copies of ``model`` on arithmetic without and with replay; the two trainers."""
    import copy

    probes, pool = split_world(world)
    trainers = {}
    for name, replayed in (("without replay", None), ("with replay", pool)):
        trainer = build_trainer(
            copy.deepcopy(model),
            tokenizer,
            world.distraction_texts(),
            probes,
            Path(output_dir) / name.replace(" ", "-"),
            pool=replayed,
            **options,
        )
        trainer.train()
        trainers[name] = trainer
    return trainers


def describe(trainers: dict[str, SFTTrainer]) -> str:
    """Forgetting at each evaluation, both runs side by side."""
    runs = {name: dict(t.forgetwatch.history) for name, t in trainers.items()}
    steps = sorted(set().union(*runs.values()))
    lines = ["step  " + "  ".join(f"{name:>16}" for name in runs)]
    lines += [
        f"{step:>4}  "
        + "  ".join(f"{pct(runs[name][step].forgetting) if step in runs[name] else '-':>16}" for name in runs)
        for step in steps
    ]
    return "forgetting (right at the base, wrong now):\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, SFTTrainer]:
    args = parse_args(argv)
    datasets.disable_progress_bars()
    world = ToyWorld(seed=0)
    print(f"teaching a tiny model {len(world.fact_texts())} made-up facts ...", flush=True)
    tokenizer, base, _ = world.base_and_tuned(base_steps=args.base_steps, tuned_steps=0)
    print("fine-tuning it on unrelated arithmetic, without and with replay ...", flush=True)
    trainers = run(
        world,
        tokenizer,
        base,
        args.output_dir,
        max_steps=args.max_steps,
        eval_steps=args.eval_steps,
        replay_weight=args.replay_weight,
    )
    print(describe(trainers))
    return trainers


if __name__ == "__main__":
    main()
