"""Answers in bf16 and fp16 against fp32, on the toy model: how often they are identical.

forgetwatch always takes the log-softmax in fp32, whatever the weights' dtype; what still
differs in half precision is the forward itself. This prints, for each dtype, the share of
probes whose answer (correct or not, and the choice picked) is the same as in fp32, and the
largest difference of a choice's summed log-probability.

With ``--real``, on SmolLM2-135M-Instruct and 5-shot MMLU through lm-eval's template: the same
for bf16 weights and for float32 weights under bf16 autocast (what a trainer in mixed precision
computes); then TRL's SFTTrainer with its defaults (bf16 mixed precision, even on a CPU), watched
twice, scoring in the weights' precision (the default) and under the trainer's autocast, its last
evaluation's forgotten and gained documents against lm-eval's recount of the final weights.

    python benchmarks/bench_precision.py [--seeds 3]
    python benchmarks/bench_precision.py --real [--docs 8]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="toy worlds (models and probes) to average over")
    parser.add_argument("--real", action="store_true", help="SmolLM2-135M-Instruct, MMLU and a watched SFT run")
    parser.add_argument("--docs", type=int, default=8, help="--real: MMLU documents per subject (3 subjects)")
    parser.add_argument("--json", help="--real: also write the figures here")
    return parser.parse_args(argv)


if __name__ == "__main__":
    parse_args()  # before the slow imports below: --help and mistakes answer at once

import numpy as np  # noqa: E402
import torch  # noqa: E402

from forgetwatch import ProbeSet, evaluate  # noqa: E402
from forgetwatch.toy import ToyWorld  # noqa: E402


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    if args.real:
        return real_model(args)
    same = {"bfloat16": [], "float16": []}
    drift = {"bfloat16": 0.0, "float16": 0.0}
    n = 0
    for seed in range(args.seeds):
        world = ToyWorld(seed=seed)
        tokenizer, base, tuned = world.base_and_tuned()
        probes = ProbeSet.from_records(world.probe_records(generative=False))
        for model in (base, tuned):
            full = evaluate(model, tokenizer, probes, batch_size=16, show_progress=False)
            n += len(probes)
            for name in same:
                half = evaluate(
                    copy.deepcopy(model).to(getattr(torch, name)), tokenizer, probes, batch_size=16, show_progress=False
                )
                same[name].extend(np.array(half.predicted) == np.array(full.predicted))
                drift[name] = max(
                    drift[name],
                    max(float(np.abs(a - b).max()) for a, b in zip(half.choice_logprobs, full.choice_logprobs)),
                )
    print(
        json.dumps(
            {
                name: {
                    "identical_answers": round(float(np.mean(v)), 4),
                    "probes": n,
                    "max_logprob_difference": round(drift[name], 4),
                }
                for name, v in same.items()
            },
            indent=1,
        )
    )


SUBJECTS = ("astronomy", "high_school_geography", "nutrition")


def real_model(args) -> None:
    import tempfile
    import warnings
    from pathlib import Path

    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from forgetwatch import ForgetWatchCallback, Scoring

    root = Path(__file__).resolve().parents[1]
    sys.path[:0] = [str(root / "tests"), str(root / "examples")]
    import real_world as real
    from test_real_model import lm_eval_verdicts  # lm-eval's per-document verdicts, as the tests take them

    model, tokenizer = real.smollm2()
    root = Path(tempfile.mkdtemp(prefix="bench_precision_"))
    tasks = real.write_mmlu_tasks(root, SUBJECTS, docs=args.docs)
    probes = ProbeSet.from_lm_eval(tasks, include_path=root, include_defaults=False, num_fewshot=5)

    full = evaluate(model, tokenizer, probes, show_progress=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = evaluate(model, tokenizer, probes, show_progress=False, scoring=Scoring(precision="autocast"))
    half = evaluate(copy.deepcopy(model).to(torch.bfloat16), tokenizer, probes, show_progress=False)
    figures: dict[str, object] = {"documents": len(probes)}
    for name, answers in (("bf16 autocast, fp32 weights", autocast), ("bf16 weights", half)):
        figures[name] = {
            "verdicts_differing": int((answers.correct != full.correct).sum()),
            "max_logprob_difference": round(
                max(float(np.abs(a - b).max()) for a, b in zip(answers.choice_logprobs, full.choice_logprobs)), 4
            ),
        }

    base = lm_eval_verdicts(model, tokenizer, tasks, root, "acc", num_fewshot=5)
    runs = {}
    for precision in ("weights", "autocast"):
        callback = ForgetWatchCallback(
            probes, eval_steps=2, output_dir=str(root / precision / "fw"), scoring=Scoring(precision=precision)
        )
        config = SFTConfig(
            str(root / precision / "sft"),
            max_steps=4,
            per_device_train_batch_size=2,
            learning_rate=1e-3,
            max_length=128,
            use_cpu=True,
            report_to=[],
            save_strategy="no",
            disable_tqdm=True,
            seed=0,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = SFTTrainer(
                model=copy.deepcopy(model),
                args=config,
                train_dataset=Dataset.from_dict({"text": real.cpython_texts(8)}),
                processing_class=tokenizer,
                callbacks=[callback],
            )
            trainer.train()
        runs[precision] = (callback.history[-1][1], trainer.model.state_dict())
    same_weights = all(torch.equal(runs["weights"][1][k], v) for k, v in runs["autocast"][1].items())
    figures["both runs trained the same weights"] = same_weights  # scoring never touches training
    final = copy.deepcopy(model)
    final.load_state_dict(runs["weights"][1])
    after = lm_eval_verdicts(final, tokenizer, tasks, root, "acc", num_fewshot=5)
    forgotten = sorted(i for i in base if base[i] and not after[i])
    gained = sorted(i for i in base if not base[i] and after[i])
    figures["lm-eval recount"] = {
        "forgotten": len(forgotten),
        "gained": len(gained),
        "right at the base": sum(base.values()),
    }
    for precision, (report, _) in runs.items():
        figures[f"watched, precision={precision}"] = {
            "forgotten": report.forgotten,
            "gained": report.gained,
            "same documents as lm-eval": sorted(report.forgotten_ids) == forgotten
            and sorted(report.gained_ids) == gained,
        }
    print(json.dumps(figures, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
