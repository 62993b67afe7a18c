"""How long does the leak check take on a large pool? ``ReplayPool.check_disjoint`` against a probe set.

Builds a pool of ``--rows`` rows (made-up sentences of 12 to 40 words from a 5,000-word
vocabulary; ``--unicode`` makes one row in four carry accents, other scripts and punctuation)
and ``--probes`` probe questions of 6 to 24 words, none of them in the pool, then times the
check (medians of ``--repeats`` runs, wall time and this process's CPU time, which a shared
machine disturbs less; building the pool is not timed).

    python benchmarks/bench_leak_check.py [--rows 1000000] [--probes 1000] [--repeats 3] [--unicode]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

EXTRA = ["café", "naïve", "Straße", "Ελλάδα", "москва", "東京", "l'été", "co-op", "(see:", "it's"]


def sentence(rng: random.Random, vocab: list[str], n: int, unicode: bool) -> str:
    words = [rng.choice(vocab) for _ in range(n)]
    if unicode:
        words[rng.randrange(n)] = rng.choice(EXTRA)
    return " ".join(words).capitalize() + "."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="pool rows (default 1,000,000)")
    parser.add_argument("--probes", type=int, default=1000, help="probe questions (default 1000)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs; the median is reported (default 3)")
    parser.add_argument("--unicode", action="store_true", help="one row in four with non-ASCII words")
    args = parser.parse_args()
    # imported after the arguments are read: --help does no work
    from forgetwatch import ProbeSet, ReplayPool

    rng = random.Random(0)
    vocab = [f"w{i}x" for i in range(5000)]
    probes = ProbeSet.from_records(
        [
            {"id": f"p{i}", "question": "Q" + sentence(rng, vocab, rng.randint(6, 24), False) + " A:", "answer": "yes"}
            for i in range(args.probes)
        ]
    )
    pool = ReplayPool.from_records(
        [
            {"id": f"r{i}", "text": sentence(rng, vocab, rng.randint(12, 40), args.unicode and i % 4 == 0)}
            for i in range(args.rows)
        ]
    )
    wall, cpu = [], []
    for _ in range(args.repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        pool.check_disjoint(probes)
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    print(
        f"check_disjoint: {args.rows:,} rows, {args.probes:,} probes"
        f"{' (a quarter of the rows non-ASCII)' if args.unicode else ''}: median of {args.repeats}: "
        f"{statistics.median(wall):.2f} s wall, {statistics.median(cpu):.2f} s CPU"
    )


if __name__ == "__main__":
    main()
