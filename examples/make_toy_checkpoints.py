"""Make two small local checkpoints, a probe file and training text to try forgetwatch offline.

The base model learns made-up facts (capitals, flag colours, numbers of rivers); the tuned
model is the base trained further on unrelated arithmetic, so it forgets some of them.
Runs on a CPU in well under a minute; nothing is downloaded.

    python examples/make_toy_checkpoints.py out/toy
    forgetwatch compare --base out/toy/base --model out/toy/tuned --probes out/toy/probes.jsonl

``train.txt`` holds the arithmetic the tuned model was trained on, one example per line: the
training text of ``examples/custom_loop.py``.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "out",
        nargs="?",
        default="out/toy",
        help="folder to write base/, tuned/, probes.jsonl and train.txt into (default: out/toy)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    out = Path(parse_args(argv).out)
    # the heavy imports come after the arguments: --help and mistakes answer at once
    from forgetwatch import ProbeSet
    from forgetwatch.toy import ToyWorld

    world = ToyWorld(seed=0)
    tokenizer, base, tuned = world.base_and_tuned()
    for name, model in (("base", base), ("tuned", tuned)):
        model.save_pretrained(out / name)
        tokenizer.save_pretrained(out / name)
    ProbeSet.from_records(world.probe_records(), source="toy").to_jsonl(out / "probes.jsonl")
    (out / "train.txt").write_text("\n".join(world.distraction_texts()) + "\n", encoding="utf-8")
    print(f"wrote {out}/base, {out}/tuned, {out}/probes.jsonl and {out}/train.txt")


if __name__ == "__main__":
    main()
