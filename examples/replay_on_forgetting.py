"""Collect the probes a run forgets, as replay data for the next run: the ``on_forgetting`` hook.

    python examples/replay_on_forgetting.py                  # offline toy world, CPU, ~10 s
    python examples/replay_on_forgetting.py --output-dir out/replay --max-steps 24

``ForgetWatchCallback(probes, on_forgetting=hook)`` calls ``hook(report, step)`` after each
of its evaluations (every ``eval_steps``, at trainer evaluations and at the end of training),
on every rank of a distributed run, with

- ``report``: the :class:`~forgetwatch.TransitionReport` of the current model against the
  base model (the weights before training): ``forgotten_ids`` (probes the base answered right
  and the current model gets wrong), ``gained_ids`` (the reverse), counts and rates, and
  ``by_category`` (category -> the same report for that category's probes);
- ``step``: the trainer's global step.

Every rank receives the same report, so a hook that changes what the ranks do next stays
consistent; a hook that writes files should write on one rank only (as below). The hook runs
inside the training loop: keep it cheap. Whatever it returns is ignored; to stop training,
use ``max_forgetting=`` instead.

:class:`ReplayCollector` is such a hook. For every probe that becomes forgotten it records a
replay text, the probe's question followed by its correct answer, counts it under its
category, and rewrites ``replay.jsonl`` (atomically: a reader never sees half a file). A probe
stays collected once forgotten, even if a later evaluation finds it answered right again: it
was at risk. Mix the file into the next run's training data::

    replay = datasets.load_dataset("json", data_files="out/replay/replay.jsonl", split="train")
    train = datasets.concatenate_datasets([train, replay.select_columns(["text"])])

This script runs the whole loop offline on forgetwatch's toy world: a tiny Llama first learns
made-up facts (capitals, flag colours, numbers of rivers), then is fine-tuned with TRL's
``SFTTrainer`` on unrelated arithmetic while the callback watches the facts, and the collector
gathers the facts it forgets. Nothing is downloaded; it runs on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import datasets
from common import HelpFormatter
from trl import SFTConfig, SFTTrainer

from forgetwatch import ForgetWatchCallback, Probe, ProbeSet, TransitionReport
from forgetwatch.files import atomic_write
from forgetwatch.toy import ToyWorld


def replay_text(probe: Probe) -> str:
    """The probe's question followed by its correct answer, as one training text.

    Multiple choice: the right choice after a space (how it was scored). For MMLU-style
    probes, whose choices are letters, that is the question with its options and the letter.
    Generative: the reference answer after a space.
    """
    answer = probe.answer_text
    return f"{probe.question.rstrip()} {answer}"


def is_main_process() -> bool:
    """Rank 0 of a distributed run, or the only process."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return int(os.environ.get("RANK", "0")) == 0


class ReplayCollector:
    """An ``on_forgetting`` hook that gathers forgotten probes as replay texts.

    Args:
        probes: the probe set the callback watches (forgotten ids are looked up in it).
        path: the JSONL file to (re)write: one ``{"id", "category", "step", "text"}`` object
            per collected probe, ``step`` being the evaluation that first found it forgotten.

    Attributes:
        records: probe id -> its replay record, in the order they were collected.
        counts: category -> number of collected probes.

    Example:
        >>> collector = ReplayCollector(probes, "out/replay.jsonl")                     # doctest: +SKIP
        >>> callback = ForgetWatchCallback(probes, eval_steps=50, on_forgetting=collector)  # doctest: +SKIP
    """

    def __init__(self, probes: ProbeSet, path: str | os.PathLike[str] = "replay.jsonl"):
        self.probes = {p.id: p for p in probes}
        self.path = Path(path)
        self.records: dict[str, dict[str, Any]] = {}
        self.counts: Counter[str] = Counter()

    def __call__(self, report: TransitionReport, step: int) -> list[str]:
        """Collect the newly forgotten probes of ``report``; return their ids."""
        new = [i for i in report.forgotten_ids if i not in self.records]
        for probe_id in new:
            probe = self.probes[probe_id]
            self.records[probe_id] = {"id": probe_id, "category": probe.category, "step": step,
                                      "text": replay_text(probe)}
            self.counts[probe.category] += 1
        if new and is_main_process():
            self.save()
        return new

    @property
    def ids(self) -> set[str]:
        return set(self.records)

    def save(self) -> Path:
        """Write every collected record to :attr:`path`, atomically."""
        with atomic_write(self.path) as f:
            for record in self.records.values():
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
        return self.path

    def describe(self, examples: int = 3) -> str:
        """What was collected: per-category counts and a few of the texts."""
        if not self.records:
            return "no probe was forgotten: nothing to replay"
        lines = [f"collected {len(self.records)} forgotten probe(s) for replay in {self.path}"]
        lines += [f"  {category}: {count}" for category, count in sorted(self.counts.items())]
        lines.append("for example:")
        lines += [f"  step {r['step']:>3}  {r['text']!r}" for r in list(self.records.values())[:examples]]
        return "\n".join(lines)


def load_replay(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a replay file (``text`` is the training text)."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def build_trainer(model, tokenizer, texts: list[str], probes: ProbeSet, output_dir: str | os.PathLike[str],
                  collector: ReplayCollector, *, max_steps: int = 24, eval_steps: int = 4,
                  **extra: Any) -> SFTTrainer:
    """A CPU ``SFTTrainer`` on ``texts`` whose ``ForgetWatchCallback`` calls ``collector``.

    The callback is reachable as ``trainer.forgetwatch``; ``extra`` overrides ``SFTConfig`` fields.
    """
    settings: dict[str, Any] = {
        "max_steps": max_steps, "per_device_train_batch_size": 8, "learning_rate": 2e-3, "max_length": 64,
        "packing": False, "logging_steps": max(1, eval_steps), "save_strategy": "no", "report_to": "none",
        "use_cpu": True, "bf16": False, "activation_checkpointing": False, "dataloader_num_workers": 0,
        "dataloader_pin_memory": False, "disable_tqdm": True, "seed": 0,
    }
    settings.update(extra)
    callback = ForgetWatchCallback(probes, eval_steps=eval_steps, on_forgetting=collector)
    trainer = SFTTrainer(model=model, args=SFTConfig(str(output_dir), **settings), processing_class=tokenizer,
                         train_dataset=datasets.Dataset.from_dict({"text": list(texts)}), callbacks=[callback])
    trainer.forgetwatch = callback
    return trainer


def run(world: ToyWorld, tokenizer, model, output_dir: str | os.PathLike[str], *, max_steps: int = 24,
        eval_steps: int = 4, **extra: Any) -> tuple[SFTTrainer, ReplayCollector]:
    """Fine-tune ``model`` (which knows ``world``'s facts) on unrelated arithmetic, collecting
    the facts it forgets into ``<output_dir>/replay.jsonl``."""
    probes = ProbeSet.from_records(world.probe_records(), source="toy")
    collector = ReplayCollector(probes, Path(output_dir) / "replay.jsonl")
    trainer = build_trainer(model, tokenizer, world.distraction_texts(), probes, output_dir, collector,
                            max_steps=max_steps, eval_steps=eval_steps, **extra)
    trainer.train()
    return trainer, collector


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("--output-dir", default="out/replay", help="trainer output, replay.jsonl and forgetwatch/")
    parser.add_argument("--max-steps", type=int, default=24, help="fine-tuning steps on the arithmetic")
    parser.add_argument("--eval-steps", type=int, default=4, help="re-score the probes every N steps")
    parser.add_argument("--base-steps", type=int, default=200, help="steps teaching the base model the facts")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> ReplayCollector:
    args = parse_args(argv)
    datasets.disable_progress_bars()
    world = ToyWorld(seed=0)
    print(f"teaching a tiny model {len(world.fact_texts())} made-up facts ...", flush=True)
    # the base model only: the tuned one is what this script's own run produces
    tokenizer, base, _ = world.base_and_tuned(base_steps=args.base_steps, tuned_steps=0)
    print("fine-tuning it on unrelated arithmetic while forgetwatch watches the facts ...", flush=True)
    trainer, collector = run(world, tokenizer, base, args.output_dir, max_steps=args.max_steps,
                             eval_steps=args.eval_steps)
    print(f"\n{trainer.forgetwatch.summary()}\n")
    print(collector.describe())
    return collector


if __name__ == "__main__":
    main()
