"""Answers in bf16 and fp16 against fp32, on the toy model: how often they are identical.

forgetwatch always takes the log-softmax in fp32, whatever the weights' dtype; what still
differs in half precision is the forward itself. This prints, for each dtype, the share of
probes whose answer (correct or not, and the choice picked) is the same as in fp32, and the
largest difference of a choice's summed log-probability.

    python benchmarks/bench_precision.py [--seeds 3]
"""

from __future__ import annotations

import argparse
import copy
import json
import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="toy worlds (models and probes) to average over")
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


if __name__ == "__main__":
    main()
