"""Make two small local checkpoints and a probe file to try ``forgetwatch compare`` offline.

The base model learns made-up facts (capitals, flag colours, numbers of rivers); the tuned
model is the base trained further on unrelated arithmetic, so it forgets some of them.
Runs on a CPU in well under a minute; nothing is downloaded.

    python examples/make_toy_checkpoints.py out/toy
    forgetwatch compare --base out/toy/base --model out/toy/tuned --probes out/toy/probes.jsonl
"""

from __future__ import annotations

import sys
from pathlib import Path

from forgetwatch import ProbeSet
from forgetwatch.toy import ToyWorld


def main(out: str = "out/toy") -> None:
    root = Path(out)
    world = ToyWorld(seed=0)
    tokenizer, base, tuned = world.base_and_tuned()
    for name, model in (("base", base), ("tuned", tuned)):
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    ProbeSet.from_records(world.probe_records(), source="toy").to_jsonl(root / "probes.jsonl")
    print(f"wrote {root}/base, {root}/tuned and {root}/probes.jsonl")


if __name__ == "__main__":
    main(*sys.argv[1:2])
