"""lm-eval tasks as probes: few-shot at the cost of zero-shot, against lm-eval's own model calls.

One run, side by side, on the same small model and the same documents of two local lm-eval
tasks (YAMLs and JSONL data written to a temporary folder):

- a 5-shot multiple-choice task (ARC-like: a passage, a question, four multi-token choices;
  ``first_n`` few-shot from a separate split, so every document shares one few-shot block);
- an 8-shot generative task (GSM8K-like: worked answers ending in ``#### N``, regex filters,
  ``exact_match`` on the last number, gsm8k's ``flexible-extract``).

Timed, each repeat in turn (interleaved, so drift hits all alike), medians reported:

- forgetwatch 5-shot: ``Scorer`` on ``ProbeSet.from_lm_eval(num_fewshot=5)`` (the few-shot block
  once per evaluation, from the KV cache for every document);
- forgetwatch 5-shot whole: the same with ``shared_prefixes=False`` (every prompt whole);
- forgetwatch 0-shot: the same documents with ``num_fewshot=0``;
- floor: every unique token of the 5-shot prompts once (the block once, each document's own
  tokens once), packed densely into rows with no padding, one plain forward per batch;
- lm-eval: ``HFLM.loglikelihood`` on the task's 5-shot requests and on its 0-shot ones (built once), same batch size;
- the same for the 8-shot generative task: forgetwatch (shared prefix, and whole) against
  ``HFLM.generate_until``.

Per-sample agreement: forgetwatch's verdict against lm-eval's metric on HFLM's outputs
(``process_results`` after the task's filters), for every document of both tasks.

With ``--real``, the same on the real model and data (``examples/real_world.py``): SmolLM2-135M-Instruct,
MMLU 5-shot through lm-eval's own template on ``--subjects`` (``--docs`` each), and country
capitals generated in the chat template (``--docs`` x subjects countries, up to 16 new tokens,
a local ``generate_until`` task); beside ``HFLM.loglikelihood`` it also times lm-eval's whole
``simple_evaluate`` on the 5-shot tasks (task building, requests, model calls, metrics), what a
user runs.

    python benchmarks/bench_lmeval_tasks.py [--docs 160] [--repeats 5] [--hidden 512]
    python benchmarks/bench_lmeval_tasks.py --real [--subjects ...] [--docs 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, help="documents per task (default 160; --real: per subject, 8)")
    ap.add_argument("--real", action="store_true", help="SmolLM2-135M-Instruct on MMLU and country capitals")
    ap.add_argument("--subjects", nargs="+", default=["astronomy", "high_school_geography", "nutrition"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--max-gen-toks", type=int, default=48)
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args(argv)
    args.docs = args.docs or (8 if args.real else 160)
    return args


if __name__ == "__main__":
    parse_args()  # before the slow imports below: --help and mistakes answer at once

import numpy as np  # noqa: E402
import torch  # noqa: E402
from bench_scoring import floor_batches, run_floor  # noqa: E402  (the same floor as the scoring benchmark's)

from forgetwatch import ProbeSet, Scorer, Scoring  # noqa: E402
from forgetwatch.scoring.encoding import EncodedChoices  # noqa: E402
from forgetwatch.toy import ToyWorld  # noqa: E402

MC_TASK = """task: bench_mc
dataset_path: json
dataset_kwargs:
  data_files:
    train: {dir}/mc_train.jsonl
    test: {dir}/mc_test.jsonl
training_split: train
test_split: test
fewshot_split: train
fewshot_config:
  sampler: first_n
description: "The following are questions about the capitals of made-up countries.\\n\\n"
output_type: multiple_choice
doc_to_text: "{{{{passage}}}}\\nQuestion: What is the capital of {{{{name}}}}?\\nAnswer:"
doc_to_choice: choices
doc_to_target: answer
metric_list:
  - metric: acc
"""

GEN_TASK = """task: bench_gen
dataset_path: json
dataset_kwargs:
  data_files:
    train: {dir}/gen_train.jsonl
    test: {dir}/gen_test.jsonl
training_split: train
test_split: test
fewshot_split: train
fewshot_config:
  sampler: first_n
  doc_to_target: "{{{{worked}}}} #### {{{{rivers}}}}"
output_type: generate_until
doc_to_text: "Question: How many rivers does {{{{name}}}} have?\\nAnswer:"
doc_to_target: "{{{{rivers}}}}"
fewshot_delimiter: "\\n\\n"
generation_kwargs:
  until: ["\\n\\n", "Question:"]
  max_gen_toks: {max_gen_toks}
  do_sample: false
filter_list:
  - name: strict-match
    filter:
      - function: regex
        regex_pattern: "#### (\\\\d+)"
      - function: take_first
  - name: flexible-extract
    filter:
      - function: regex
        regex_pattern: "(\\\\d+)"
        group_select: -1
      - function: take_first
metric_list:
  - metric: exact_match
"""


def write_tasks(world: ToyWorld, root: Path, docs: int, max_gen_toks: int, seed: int = 0) -> None:
    """The two tasks' YAMLs and data: ``docs`` test documents each, 8 few-shot ones."""
    rng = random.Random(seed)
    facts = world.fact_texts()
    capitals = [c.capital for c in world.countries]
    mc = []
    for i in range(docs + 8):
        c = world.countries[i % len(world.countries)]
        choices = rng.sample([x for x in capitals if x != c.capital], 3)
        gold = rng.randrange(4)
        choices.insert(gold, c.capital)
        mc.append({"name": c.name, "passage": " ".join(rng.sample(facts, 3)), "choices": choices, "answer": gold})
    gen = gen_rows(world, docs)
    for name, rows in (("mc", mc), ("gen", gen)):
        (root / f"{name}_train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:8]))
        (root / f"{name}_test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[8:]))
    (root / "bench_mc.yaml").write_text(MC_TASK.format(dir=root))
    (root / "bench_gen.yaml").write_text(GEN_TASK.format(dir=root, max_gen_toks=max_gen_toks))


def gen_rows(world: ToyWorld, docs: int) -> list[dict]:
    """The generative task's documents: a worked answer ending in the number of rivers."""
    rows = []
    for i in range(docs + 8):
        c = world.countries[i % len(world.countries)]
        worked = f"{c.name} has {c.rivers} rivers."
        rows.append({"name": c.name, "worked": worked, "rivers": str(c.rivers)})
    return rows


def lm_eval_verdicts(probes: ProbeSet, outputs) -> np.ndarray:
    """lm-eval's per-document metric (through its filters) on HFLM's outputs, in probe order."""
    from lm_eval.api.instance import Instance

    verdicts = []
    k = 0
    for p in probes:
        judge = p.judge
        if p.is_multiple_choice:
            results = outputs[k : k + p.n_choices]
            k += p.n_choices
            value = judge.task.process_results(judge.doc, list(results))[judge.metric]
        else:
            inst = Instance("generate_until", judge.doc, ("", {}), 0, (judge.task.task_name, judge.doc_id, 1))
            inst.resps.append(outputs[k])
            k += 1
            for ensemble in judge.task._filters:
                ensemble.apply([inst])
            value = judge.task.process_results(judge.doc, [inst.filtered_resps[judge.filter]])[judge.metric]
        verdicts.append(value == 1)
    return np.array(verdicts)


def requests_of(probes: ProbeSet):
    """The lm-eval requests the probes were built from (the tasks keep them), in probe order."""
    tasks = {p.judge.task.task_name: p.judge.task for p in probes}
    by_doc = {}
    for task in tasks.values():
        for inst in task.instances:
            by_doc.setdefault(f"{task.task_name}/{inst.doc_id}", []).append(inst)
    return [inst for p in probes for inst in sorted(by_doc[p.id], key=lambda i: i.idx)]


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def toy_setup(args, root: Path):
    """A Llama of ``--hidden`` x ``--layers`` that learned the toy facts and the worked answers'
    form; the two local tasks in ``root``."""
    world = ToyWorld(n_countries=args.docs + 8, seed=0)
    tokenizer = world.tokenizer()
    tokenizer.model_max_length = 2048  # few-shot prompts are longer than the toy's 256 tokens
    config = world.model(tokenizer, hidden=args.hidden, layers=args.layers).config
    config.max_position_embeddings = 2048
    torch.manual_seed(0)
    model = type(world.model(tokenizer, hidden=8, layers=1))(config)
    # it learns the facts, and the worked answers' form (so that some generated answers are right)
    worked = [
        f"Question: How many rivers does {r['name']} have?\nAnswer: {r['worked']} #### {r['rivers']}"
        for r in gen_rows(world, args.docs)
    ]
    world.train(model, tokenizer, world.fact_texts() + 4 * worked, steps=120, lr=1e-3, batch_size=32)
    write_tasks(world, root, args.docs, args.max_gen_toks)
    # generation: the last number counts (gsm8k's flexible-extract): a small model's worked
    # answers are rarely in the strict form
    return model, tokenizer, ["bench_mc"], ["bench_gen"], 8, {"bench_gen": "flexible-extract"}


def real_setup(args, root: Path):
    """SmolLM2-135M-Instruct; MMLU's ``--subjects`` on lm-eval's template and a capitals task in ``root``."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import real_world as real

    model, tokenizer = real.smollm2()
    mc = real.write_mmlu_tasks(root, args.subjects, docs=args.docs, shots=5)
    asked = real.sample(real.countries(), args.docs * len(args.subjects))
    return model, tokenizer, mc, [real.write_capital_task(root, tokenizer, asked)], 0, None


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    logging.getLogger("lm-eval").setLevel(logging.ERROR)
    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    from lm_eval.models.huggingface import HFLM

    root = Path(tempfile.mkdtemp(prefix="bench_lmeval_"))
    model, tokenizer, mc_tasks, gen_tasks, gen_shots, filters = (real_setup if args.real else toy_setup)(args, root)
    model.to(args.device).eval()

    def load(tasks: list[str], shots: int) -> ProbeSet:
        return ProbeSet.from_lm_eval(
            tasks, num_fewshot=shots, include_path=root, include_defaults=False, filter=filters
        )

    mc5, mc0, gen = load(mc_tasks, 5), load(mc_tasks, 0), load(gen_tasks, gen_shots)
    mc_requests, gen_requests = requests_of(mc5), requests_of(gen)
    gen_name = f"{gen_shots}-shot gen" if gen_shots else "gen"
    scorers = {
        "forgetwatch 5-shot": Scorer(tokenizer, mc5),
        "forgetwatch 5-shot whole": Scorer(tokenizer, mc5, scoring=Scoring(shared_prefixes=False)),
        "forgetwatch 0-shot": Scorer(tokenizer, mc0),
        f"forgetwatch {gen_name}": Scorer(tokenizer, gen, reference_logprobs=False),
        f"forgetwatch {gen_name} whole": Scorer(
            tokenizer, gen, reference_logprobs=False, scoring=Scoring(shared_prefixes=False)
        ),
    }
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=args.batch_size)
    batches, keep, n_unique, _ = floor_batches(scorers["forgetwatch 5-shot"], args.batch_size)
    runs = {
        name: (lambda s=s: s(model, batch_size=args.batch_size, show_progress=False)) for name, s in scorers.items()
    }
    runs["floor 5-shot"] = lambda: run_floor(model, batches, keep, args.device)
    runs["lm-eval 5-shot"] = lambda: lm.loglikelihood(mc_requests, disable_tqdm=True)
    zero_shot_requests = requests_of(mc0)
    runs["lm-eval 0-shot"] = lambda: lm.loglikelihood(zero_shot_requests, disable_tqdm=True)
    runs[f"lm-eval {gen_name}"] = lambda: lm.generate_until(gen_requests, disable_tqdm=True)
    if args.real:  # what a user runs: tasks built, requests made, the model called, metrics computed
        from lm_eval import simple_evaluate
        from lm_eval.tasks import TaskManager

        manager = TaskManager(include_path=str(root), include_defaults=False)
        runs["lm-eval simple_evaluate 5-shot"] = lambda: simple_evaluate(
            model=lm, tasks=mc_tasks, num_fewshot=5, task_manager=manager, verbosity="ERROR"
        )

    # warm-up, and per-sample agreement on its results
    results = {name: run() for name, run in runs.items()}
    agreement = {}
    for ours, theirs, probes in (
        ("forgetwatch 5-shot", "lm-eval 5-shot", mc5),
        (f"forgetwatch {gen_name}", f"lm-eval {gen_name}", gen),
    ):
        mine, lm_eval = results[ours].correct, lm_eval_verdicts(probes, results[theirs])
        agreement["5-shot choices" if probes is mc5 else gen_name] = {
            "same": int((mine == lm_eval).sum()),
            "documents": len(probes),
            "right (lm-eval)": int(lm_eval.sum()),
        }
    same_as_whole = {
        "5-shot": results["forgetwatch 5-shot"].correct.tolist()
        == results["forgetwatch 5-shot whole"].correct.tolist(),
        gen_name: results[f"forgetwatch {gen_name}"].outputs == results[f"forgetwatch {gen_name} whole"].outputs,
    }

    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, run in runs.items():
            times[name].append(timed(run))
    med = {k: statistics.median(v) for k, v in times.items()}

    enc = [e for e in scorers["forgetwatch 5-shot"].encoded if isinstance(e, EncodedChoices)]
    skip = scorers["forgetwatch 5-shot"]._tokenized(0).skips
    what = "SmolLM2-135M-Instruct" if args.real else f"llama hidden={args.hidden} layers={args.layers}"
    print(
        f"model: {what} vocab={len(tokenizer)}; {args.threads} CPU threads; device {args.device}; batch size {args.batch_size}"
    )
    print(
        f"5-shot multiple choice: {len(mc5)} documents x 4 choices; prompt {statistics.mean(len(e.context) for e in enc):.0f} "
        f"tokens, of which a shared prefix of up to {int(max(skip))}; unique tokens {n_unique}"
    )
    print(f"{gen_name}: {len(gen)} documents, up to {16 if args.real else args.max_gen_toks} new tokens")
    for task, a in agreement.items():
        print(
            f"agreement with lm-eval on {task}: {a['same']}/{a['documents']} documents "
            f"({a['right (lm-eval)']} right by lm-eval)"
        )
    print(f"shared prefix on and off give the same answers: {same_as_whole}")
    print(f"a generated answer: {results[f'forgetwatch {gen_name}'].outputs[0]!r}")
    print(f"\n{'':34}{'median s':>10}   runs")
    for k, v in times.items():
        print(f"{k:34}{med[k]:10.3f}   " + " ".join(f"{x:.3f}" for x in v))
    ratios = {
        "5-shot / 0-shot": med["forgetwatch 5-shot"] / med["forgetwatch 0-shot"],
        "5-shot / floor": med["forgetwatch 5-shot"] / med["floor 5-shot"],
        "5-shot whole / 5-shot": med["forgetwatch 5-shot whole"] / med["forgetwatch 5-shot"],
        "lm-eval / forgetwatch 5-shot": med["lm-eval 5-shot"] / med["forgetwatch 5-shot"],
        "lm-eval / forgetwatch 0-shot": med["lm-eval 0-shot"] / med["forgetwatch 0-shot"],
        "gen whole / gen": med[f"forgetwatch {gen_name} whole"] / med[f"forgetwatch {gen_name}"],
        f"lm-eval / forgetwatch {gen_name}": med[f"lm-eval {gen_name}"] / med[f"forgetwatch {gen_name}"],
    }
    if args.real:
        ratios["simple_evaluate / forgetwatch 5-shot"] = (
            med["lm-eval simple_evaluate 5-shot"] / med["forgetwatch 5-shot"]
        )
    print()
    for k, v in ratios.items():
        print(f"{k:38}{v:6.2f}x")
    agreed = all(a["same"] == a["documents"] for a in agreement.values()) and all(same_as_whole.values())
    if args.real:
        ok = (
            agreed
            and ratios["5-shot / floor"] <= 1.2
            and ratios["simple_evaluate / forgetwatch 5-shot"] >= 3
            and ratios[f"lm-eval / forgetwatch {gen_name}"] >= 2
        )
        goals = "100% agreement; 5-shot <= 1.2x floor; >= 3x faster than simple_evaluate; >= 2x faster on generation"
    else:
        ok = (
            agreed
            and ratios["5-shot / 0-shot"] <= 1.3
            and ratios["5-shot / floor"] <= 1.2
            and ratios["lm-eval / forgetwatch 5-shot"] >= 12
            and ratios[f"lm-eval / forgetwatch {gen_name}"] >= 3
        )
        goals = (
            "100% agreement; 5-shot <= 1.3x 0-shot and <= 1.2x floor; lm-eval >= 12x slower on choices, "
            ">= 3x on generation"
        )
    print(f"\ntargets ({goals}): {'met' if ok else 'NOT met'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"times": times, "median": med, "ratios": ratios, "agreement": agreement, "args": vars(args)},
                f,
                indent=2,
            )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
