"""Does replay aimed at what is lost beat uniform replay at equal replayed tokens?

The world (``benchmarks/skill_world.py``) has four separate skills: facts (multiple choice),
arithmetic (``add 3 4 = 7``), uppercase (``up b a d = B A D``) and refusal. Each is probed on
one half of its items; the replay pool holds the other half. A base pre-trained on all of them
(once per seed, cached under ``--out``) is post-trained with TRL's SFTTrainer on ``max a b = m``
(the larger digit) plus a share of ``rev x y z = z y x`` (an operator on the uppercase skill's
letters), and with DPOTrainer on the same as preference pairs: arithmetic forgets hard,
uppercase mildly, facts not at all. The arms (``--arms``):

- ``none``: no replay;
- ``uniform``: the curated pool, drawn evenly (``select="uniform"``);
- ``category``: the curated pool, drawn by the forgetting of each category (``select="categories"``);
- ``synthetic``: the pool's prompts answered by the base (``ReplayPool.from_prompts``), by category;
- ``kl``: the curated pool by category with ``loss="kl"``, SFT only, at 4 rows.

``uniform``, ``category`` and ``synthetic`` run at 1, 2, 4 and 8 replay rows per step (``--rows``),
``loss="lm"``, weight ``rows × --weight-per-row``: forgetwatch's replay loss is a mean over the
replayed tokens, so at one fixed weight a single row per step would pull as hard as eight; scaled,
every replayed token pulls alike and "equal tokens" means equal replay.

The x axis of every comparison is the tokens replayed over the run (``replay/tokens`` of the last
history record, as forgetwatch counts them). The target loss is the mean next-token loss on the
answer tokens (after ``=``) of target lines on pairs never trained on; the base's is printed beside
it, so that how far post-training lowers it shows the task is learned, not guessed. Printed per
trainer: median [per seed] probes forgotten (1->0) at the end, forgetting, tokens, held-out target
loss and wall time; then the void check (exit status 2 when the post-training forgets every skill
alike), the goal of forgetting-driven replay (uniform@k's forgetting with at most half its tokens,
target loss no more than 2 % above uniform@k's), synthetic against curated, and how the probe-free
train-KL signal tracks forgetting (6 more SFT runs without replay; ``--no-train-kl`` leaves them out).

    python benchmarks/bench_replay.py --seeds 5 --jobs 2 --json benchmarks/results/replay.json --png docs/img/replay_pareto.png
    python benchmarks/bench_replay.py --quick   # 2 seeds, SFT, rows 2 and 8
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import statistics
import sys
import time
import warnings

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore")

CURATED = ("uniform", "category", "synthetic")  # the arms swept over rows per step
SFT_ONLY = ("kl",)  # at 4 rows, SFT only
ARMS = ("none", *CURATED, *SFT_ONLY)
DRIVEN = ("category", "synthetic")  # the arms the goal is about
TRAIN_KL_RUNS = [(lr, steps) for lr in (5e-4, 1e-3, 2e-3) for steps in (40, 80)]  # SFT, seed 0, no replay


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, help="seeds (default 5; 2 with --quick)")
    ap.add_argument("--trainers", nargs="+", choices=("sft", "dpo"), help="default both (SFT with --quick)")
    ap.add_argument("--rows", type=int, nargs="+", help="replay rows per step to sweep (default 1 2 4 8)")
    ap.add_argument("--arms", nargs="+", choices=ARMS, help="default every arm")
    ap.add_argument("--steps", type=int, default=40, help="optimizer steps of the post-training")
    ap.add_argument("--eval-steps", type=int, default=5)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--target-mix", type=float, help="share of rev lines in the target (default: TARGET_MIX)")
    ap.add_argument("--pretrain-steps", type=int, default=800)
    ap.add_argument("--hidden", type=int, default=96)
    ap.add_argument(
        "--weight-per-row", type=float, default=0.125, help="replay weight per row per step (8 rows: weight 1)"
    )
    ap.add_argument("--no-train-kl", action="store_true", help="leave out the train-KL tracking runs")
    ap.add_argument("--quick", action="store_true", help="development run: 2 seeds, SFT, rows 2 and 8")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes (1 thread each)")
    ap.add_argument("--out", default="/tmp/forgetwatch-bench-replay", help="bases are cached here")
    ap.add_argument("--png", help="draw replay tokens against forgetting here")
    ap.add_argument("--json", help="write every per-seed figure here")
    args = ap.parse_args(argv)
    if args.seeds is None:
        args.seeds = 2 if args.quick else 5
    if args.trainers is None:
        args.trainers = ["sft"] if args.quick else ["sft", "dpo"]
    if args.rows is None:
        args.rows = [2, 8] if args.quick else [1, 2, 4, 8]
    for name in ("seeds", "steps", "eval_steps", "pretrain_steps", "hidden", "jobs"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if min(args.rows) < 1:
        ap.error("--rows must be at least 1")
    return args


if __name__ == "__main__":
    parse_args()  # before the slow imports below: --help and mistakes answer at once
    os.environ["OMP_NUM_THREADS"] = "1"  # before torch is imported, here and in the workers spawned

import torch  # noqa: E402
from skill_world import SKILLS, TARGET_MIX, SkillWorld  # noqa: E402

from forgetwatch import ForgetWatchCallback, Monitor, Output, ProbeSet, Replay, ReplayPool, Scoring  # noqa: E402
from forgetwatch.store.read import read_history  # noqa: E402

SYNTHETIC_TOKENS = 16  # answer budget of synthetic rows: the longest pool answer (a refusal) is 12 tokens


# -- one process's work ---------------------------------------------------------------------------


def init_worker() -> None:
    """One thread per process: with other processes on the cores, OpenMP's spinning threads make a
    multi-threaded run several times slower, while one thread keeps its pace."""
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


def base_path(cfg: dict, seed: int) -> str:
    """Where the base of ``seed`` is kept: named by everything that makes it."""
    world = SkillWorld(seed)
    made = [1, world.pretrain_texts(), world.tokenizer_texts(), cfg["pretrain_steps"], cfg["hidden"], torch.__version__]
    key = hashlib.sha256(json.dumps(made).encode()).hexdigest()[:12]
    return os.path.join(cfg["out"], "bases", f"{seed}-{key}")


def ensure_base(cfg: dict, seed: int) -> float:
    """Pre-train the base of ``seed`` unless kept; returns the seconds it took (0 when kept)."""
    path = base_path(cfg, seed)
    if os.path.isdir(path):
        return 0.0
    start = time.perf_counter()
    tokenizer, model = SkillWorld(seed).pretrained(steps=cfg["pretrain_steps"], hidden=cfg["hidden"])
    partial = f"{path}.part-{os.getpid()}"
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    try:
        os.replace(partial, path)  # whole or absent: a killed run never leaves half a base
    except OSError:  # made meanwhile by another process
        shutil.rmtree(partial, ignore_errors=True)
    return time.perf_counter() - start


def finite(x) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def replay_for(job: dict, world: SkillWorld, probes, weight_per_row: float):
    """The arm's repair (None for ``none``)."""
    arm = job["arm"]
    if arm == "none":
        return None
    if arm == "synthetic":
        pool = ReplayPool.from_prompts(world.prompt_records(), max_new_tokens=SYNTHETIC_TOKENS)
    else:
        pool = ReplayPool.from_records(world.pool_records())
    select = "uniform" if arm == "uniform" else "categories"
    loss = "kl" if arm == "kl" else "lm"
    weight = job["rows"] * weight_per_row
    return Replay(pool, loss=loss, weight=weight, select=select, batch_size=job["rows"], seed=job["seed"])


def target_loss(model, tokenizer, records: list[dict]) -> float:
    """Mean next-token loss on the answer tokens of held-out target lines (``{"prompt",
    "answer"}``): the prompt's tokens are context, not scored, so that the figure is how well the
    rule is known, not how well the line's format is."""
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for r in records:
            prompt = tokenizer(r["prompt"])["input_ids"]
            answer = tokenizer(r["answer"], add_special_tokens=False)["input_ids"]
            ids = torch.tensor([prompt + answer])
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
            losses = torch.nn.functional.cross_entropy(logits.float(), ids[0, len(prompt) :], reduction="none")
            total += float(losses.sum())
            count += len(answer)
    return total / count


def run_job(cfg: dict, job: dict) -> dict:
    """One post-training run of one arm; every figure the report needs, as plain data."""
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback

    began = time.perf_counter()
    seed, steps = job["seed"], job["steps"]
    world = SkillWorld(seed, target_mix=job.get("target_mix", cfg["target_mix"]))
    path = base_path(cfg, seed)
    tokenizer = AutoTokenizer.from_pretrained(path)
    probes = ProbeSet.from_records(world.probe_records())
    repair = replay_for(job, world, probes, cfg["weight_per_row"])
    name = f"{job['trainer']}-{seed}-{job['arm']}-{job['rows']}-{job['lr']:g}-{steps}"
    run_dir = os.path.join(cfg["out"], "runs", f"{name}-{os.getpid()}")
    shutil.rmtree(run_dir, ignore_errors=True)
    cb = ForgetWatchCallback(
        probes,
        eval_steps=cfg["eval_steps"],
        replay=repair,
        output_dir=os.path.join(run_dir, "forgetwatch"),
        scoring=Scoring(batch_size=64, max_new_tokens=8, behaviour_max_new_tokens=16),
        output=Output(verbose=False),
        monitor=Monitor(noise_check=False),
    )
    common = dict(
        max_steps=steps,
        learning_rate=job["lr"],
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        seed=seed,
        disable_tqdm=True,
        logging_steps=1000,
        dataloader_num_workers=0,
    )
    if job["trainer"] == "dpo":
        config = trl.DPOConfig(run_dir, per_device_train_batch_size=8, max_length=48, beta=0.1, **common)
        data = Dataset.from_list(world.target_pairs(400, seed=seed + 1))
        trainer = trl.DPOTrainer(
            model=path, args=config, processing_class=tokenizer, train_dataset=data, callbacks=[cb]
        )
    else:
        config = trl.SFTConfig(run_dir, per_device_train_batch_size=16, max_length=64, packing=False, **common)
        data = Dataset.from_dict({"text": world.target_texts(400, seed=seed + 1)})
        model = AutoModelForCausalLM.from_pretrained(path)
        trainer = trl.SFTTrainer(
            model=model, args=config, processing_class=tokenizer, train_dataset=data, callbacks=[cb]
        )
    trainer.remove_callback(PrinterCallback)  # the trainer's closing figures, printed per run otherwise
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    records = read_history(cb.watch.output_dir / "history.jsonl")
    final = cb.history[-1][1]
    tokens = float(records[-1]["replay"]["tokens"]) if repair is not None else 0.0
    curve = []
    for (step, report), record in zip(cb.history, records):
        point = {
            "step": step,
            "forgetting": finite(report.forgetting),
            "forgotten": report.forgotten,
            "categories": {c: finite(r.forgetting_relative) for c, r in report.by_category.items()},
        }
        kl = (record.get("drift") or {}).get("train_kl")
        if kl is not None and math.isfinite(kl):
            point["train_kl"] = float(kl)
        curve.append(point)
    shutil.rmtree(run_dir, ignore_errors=True)
    return {
        **job,
        "forgotten": final.forgotten,
        "forgetting": finite(final.forgetting),
        "by_category": {
            c: {
                "n": r.n,
                "accuracy_before": finite(r.accuracy_before),
                "forgotten": r.forgotten,
                "forgetting_relative": finite(r.forgetting_relative),
            }
            for c, r in final.by_category.items()
        },
        "tokens": tokens,
        "target_loss": finite(target_loss(trainer.model, tokenizer, world.held_out_target())),
        "base_target_loss": finite(
            target_loss(AutoModelForCausalLM.from_pretrained(path), tokenizer, world.held_out_target())
        ),
        "seconds": seconds,
        "job_seconds": time.perf_counter() - began,
        "curve": curve,
        "train_kl": [p["train_kl"] for p in curve if "train_kl" in p],
        # what each evaluation cost, in seconds (medians): scoring, train KL
        "costs": {
            name: med(values)
            for name, values in (
                ("scoring", [r["seconds"] for r in records]),
                ("train_kl", [r["drift"]["seconds"] for r in records if "seconds" in r.get("drift", {})]),
            )
            if values
        },
        "monitoring_seconds": cb.watch.monitoring_seconds,
    }


def work(task: tuple[dict, dict]) -> dict:
    return run_job(*task)


def base_work(task: tuple[dict, int]) -> float:
    return ensure_base(*task)


# -- the plan, and running it ---------------------------------------------------------------------


def plan(args: argparse.Namespace) -> tuple[list[dict], list[str]]:
    """Every run, and notes on what was left out."""
    arms = args.arms or list(ARMS)
    notes, jobs = [], []
    base = {"lr": args.lr, "steps": args.steps}
    for trainer in args.trainers:
        for seed in range(args.seeds):
            for arm in arms:
                if arm == "none":
                    jobs.append({"trainer": trainer, "seed": seed, "arm": arm, "rows": 0, **base})
                elif arm in CURATED:
                    jobs += [{"trainer": trainer, "seed": seed, "arm": arm, "rows": r, **base} for r in args.rows]
                elif trainer == "sft":
                    jobs.append({"trainer": trainer, "seed": seed, "arm": arm, "rows": 4, **base})
    if "sft" in args.trainers and not args.no_train_kl:
        for lr, steps in TRAIN_KL_RUNS:  # their table is printed when the records hold drift/train_kl
            job = {"trainer": "sft", "seed": 0, "arm": "none", "rows": 0, "lr": lr, "steps": steps}
            if not any(_same(job, j) for j in jobs):
                jobs.append({**job, "extra": "train_kl"})
    return jobs, notes


def _same(a: dict, b: dict) -> bool:
    return all(a[k] == b[k] for k in ("trainer", "seed", "arm", "rows", "lr", "steps"))


def execute(cfg: dict, seeds: list[int], jobs: list[dict], processes: int) -> tuple[list[dict], float]:
    """Bases first (one per seed), then the runs; longest first so the workers finish together."""
    order = sorted(jobs, key=lambda j: (j["trainer"] != "dpo", -j["steps"], -j["rows"]))
    if processes == 1:
        init_worker()
        pretrain = sum(ensure_base(cfg, s) for s in seeds)
        return [run_job(cfg, j) for j in order], pretrain
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(processes, initializer=init_worker) as pool:
        pretrain = sum(pool.map(base_work, [(cfg, s) for s in seeds], chunksize=1))
        results = []
        for i, result in enumerate(pool.imap_unordered(work, [(cfg, j) for j in order], chunksize=1), 1):
            results.append(result)
            if i % max(1, len(order) // 10) == 0 or i == len(order):
                print(f"  {i}/{len(order)} runs done", file=sys.stderr, flush=True)
        pool.close()  # let the workers end on their own: no semaphore left behind
        pool.join()
    return results, pretrain


# -- figures --------------------------------------------------------------------------------------


def med(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def runs_of(results: list[dict], trainer: str, arm: str, rows: int | None = None) -> list[dict]:
    found = [
        r
        for r in results
        if r["trainer"] == trainer and r["arm"] == arm and "extra" not in r and (rows is None or r["rows"] == rows)
    ]
    return sorted(found, key=lambda r: r["seed"])


def void_check(results: list[dict], trainer: str) -> dict:
    """Per category, the median relative forgetting of ``none`` at the end; void unless the
    largest is at least 3 times the smallest (with the smallest 0: whenever the largest is > 0)."""
    none = runs_of(results, trainer, "none")
    if not none:
        return {"medians": {}, "hi": None, "lo": None, "void": False, "computed": False}
    medians = {c: med(r["by_category"].get(c, {}).get("forgetting_relative") for r in none) for c in SKILLS}
    known = [v for v in medians.values() if v is not None]
    hi, lo = (max(known), min(known)) if known else (0.0, 0.0)
    void = not (hi > 0 and hi >= 3 * lo)
    return {"medians": medians, "hi": hi, "lo": lo, "void": void, "computed": True}


def summary(runs: list[dict]) -> dict:
    return {
        "forgotten": med(r["forgotten"] for r in runs),
        "forgetting": med(r["forgetting"] for r in runs),
        "tokens": med(r["tokens"] for r in runs),
        "target_loss": med(r["target_loss"] for r in runs),
        "seconds": med(r["seconds"] for r in runs),
    }


def goal(results: list[dict], trainer: str, rows: list[int]) -> dict:
    """For each uniform budget k (rows > 1) and forgetting-driven arm: met where some setting of
    the arm forgets no more than uniform@k with at most half its tokens and a held-out target
    loss at most 2 % above uniform@k's (the cheapest such setting); otherwise the fewest rows at
    which the arm forgets no more, with what it costs."""
    out: dict = {"by_k": {}}
    ks = [k for k in sorted(rows) if k > 1 and runs_of(results, trainer, "uniform", k)]
    for k in ks:
        u = summary(runs_of(results, trainer, "uniform", k))
        entry = {"uniform": u, "arms": {}}
        for arm in DRIVEN:
            measured = [r for r in sorted(rows) if runs_of(results, trainer, arm, r)]
            if not measured:
                continue
            options = []
            for r in measured:
                a = summary(runs_of(results, trainer, arm, r))
                if a["forgotten"] > u["forgotten"]:
                    continue
                share = a["tokens"] / u["tokens"]  # uniform@k replays: its tokens are > 0
                both = a["target_loss"] is not None and u["target_loss"]  # None: a loss that was not finite
                loss = (a["target_loss"] - u["target_loss"]) / u["target_loss"] if both else math.inf
                met = share <= 0.5 and loss <= 0.02
                options.append(
                    {
                        "reaches": r,
                        "forgotten": a["forgotten"],
                        "token_share": share,
                        "loss_change": finite(loss),
                        "met": met,
                    }
                )
            met = [o for o in options if o["met"]]
            entry["arms"][arm] = (met or options or [{"reaches": None, "met": False}])[0]
        out["by_k"][k] = entry
    positive = [k for k in ks if (out["by_k"][k]["uniform"]["forgotten"] or 0) > 0]
    out["headline"] = 8 if 8 in positive else (max(positive) if positive else (max(ks) if ks else None))
    return out


def change(x: float | None) -> str:
    return f"{100 * x:+.1f} %" if x is not None else "not finite"


def verdict(g: dict, k: int | None) -> str:
    if k is None or k not in g["by_k"]:
        return "no uniform budget above 1 row was measured"
    entry = g["by_k"][k]
    u = entry["uniform"]
    if not u["forgotten"]:
        return f"no comparison at k = {k}: uniform@{k} forgets nothing (a floor every arm reaches)"
    met = [(a, e) for a, e in entry["arms"].items() if e["met"]]
    if met:
        arm, e = min(met, key=lambda x: x[1]["token_share"])
        return (
            f"met at k = {k}: {arm} reaches uniform@{k}'s {u['forgotten']:g} forgotten with "
            f"{100 * e['token_share']:.0f} % of its tokens, target loss {change(e['loss_change'])}"
        )
    parts = []
    for arm, e in entry["arms"].items():
        if e["reaches"] is None:
            parts.append(f"{arm} never forgets as little")
        else:
            parts.append(
                f"{arm} at {e['reaches']} rows: {100 * e['token_share']:.0f} % of the tokens, "
                f"target loss {change(e['loss_change'])}"
            )
    return f"not met at k = {k} (uniform@{k}: {u['forgotten']:g} forgotten): " + "; ".join(
        parts or ["no driven arm ran"]
    )


def spearman(x: list[float], y: list[float]) -> float | None:
    """Rank correlation (ties share their mean rank); None when either side is constant."""
    if len(x) < 3:
        return None

    def ranks(v):
        order = sorted(range(len(v)), key=v.__getitem__)
        r = [0.0] * len(v)
        i = 0
        while i < len(v):
            j = i
            while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for t in range(i, j + 1):
                r[order[t]] = (i + j) / 2
            i = j + 1
        return r

    rx, ry = ranks(x), ranks(y)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return sxy / math.sqrt(sxx * syy) if sxx and syy else None


def train_kl_table(results: list[dict], args) -> list[dict]:
    """Per run of the train-KL set: Spearman's rho of train KL against forgetting (all probes,
    arithmetic, facts) over its evaluations; and pooled over every run."""
    runs = [
        r
        for r in results
        if r["trainer"] == "sft"
        and r["seed"] == 0
        and r["arm"] == "none"
        and (r["lr"], r["steps"]) in TRAIN_KL_RUNS
        and r["train_kl"]
    ]
    rows, pooled = [], {"all": ([], []), "arithmetic": ([], []), "facts": ([], [])}
    for r in sorted(runs, key=lambda r: (r["lr"], r["steps"])):
        points = [p for p in r["curve"] if "train_kl" in p]
        row = {"lr": r["lr"], "steps": r["steps"], "evaluations": len(points)}
        for name in pooled:
            pairs = [(p["train_kl"], p["forgetting"] if name == "all" else p["categories"].get(name)) for p in points]
            pairs = [(a, b) for a, b in pairs if b is not None]
            row[name] = spearman([a for a, _ in pairs], [b for _, b in pairs])
            pooled[name][0].extend(a for a, _ in pairs)
            pooled[name][1].extend(b for _, b in pairs)
        rows.append(row)
    if rows:
        rows.append(
            {"lr": "pooled", "steps": "", "evaluations": len(pooled["all"][0])}
            | {n: spearman(*v) for n, v in pooled.items()}
        )
    return rows


def num(x: float | None, width: int, digits: int) -> str:
    return f"{x:{width}.{digits}f}" if x is not None else f"{'-':>{width}}"


def per_seed(runs: list[dict], key: str, fmt: str) -> str:
    return "[" + ", ".join(format(r[key], fmt) if r[key] is not None else "-" for r in runs) + "]"


def print_report(results: list[dict], args, checks: dict, goals: dict) -> None:
    n = len(SkillWorld(0).probe_records())
    for trainer in args.trainers:
        print(
            f"\nTRL {trainer.upper()} on the skill world (max + {100 * args.target_mix:g} % rev), "
            f"{args.steps} steps, lr {args.lr:g}; {n} probes; medians of {args.seeds} seeds [per seed]"
        )
        base = med(r["base_target_loss"] for r in results if r["trainer"] == trainer)
        print(f"target loss: held-out pairs, answer tokens only (the base's: {num(base, 0, 3)}, median over seeds)")
        print(
            f"{'arm':12}{'rows':>5}  {'1->0 [per seed]':32}{'forgetting':>11}{'tokens':>10}{'target loss':>13}{'wall s':>8}"
        )
        for arm in ARMS:
            for rows in sorted({r["rows"] for r in runs_of(results, trainer, arm)}):
                runs = runs_of(results, trainer, arm, rows)
                s = summary(runs)
                forgotten = f"{s['forgotten']:g} {per_seed(runs, 'forgotten', 'd')}"
                print(
                    f"{arm:12}{rows:5d}  {forgotten:32}{100 * (s['forgetting'] or 0):10.1f}%{s['tokens']:10.0f}"
                    f"{num(s['target_loss'], 13, 3)}{s['seconds']:8.1f}"
                )
        c = checks[trainer]
        if not c["computed"]:
            print("void check: not computed (the none arm did not run)")
            continue
        medians = ", ".join(f"{k} {v:.2f}" if v is not None else f"{k} -" for k, v in c["medians"].items())
        state = "VOID" if c["void"] else "not void"
        print(
            f"void check: {state} (relative forgetting of none, medians: {medians}; hi {c['hi']:.2f}, lo {c['lo']:.2f})"
        )
        if not c["void"]:
            g = goals[trainer]
            for k in g["by_k"]:
                print(f"goal{' (headline)' if k == g['headline'] else ''}: {verdict(g, k)}")
        mine = [r for r in results if r["trainer"] == trainer and "extra" not in r]
        costs = {k: med(r["costs"].get(k) for r in mine) for k in ("scoring", "train_kl")}
        names = {"scoring": "scoring the probes", "train_kl": "train KL"}
        parts = [f"{names[k]} {1000 * v:.1f} ms" for k, v in costs.items() if v is not None]
        print("per evaluation, medians: " + ", ".join(parts))
        synthetic = {r["rows"] for r in runs_of(results, trainer, "synthetic")}
        for rows in sorted(synthetic):
            s, cat = (
                summary(runs_of(results, trainer, "synthetic", rows)),
                summary(runs_of(results, trainer, "category", rows)),
            )
            if cat["forgotten"] is not None:
                print(
                    f"synthetic vs curated (category) at {rows} rows: {s['forgotten']:g} vs {cat['forgotten']:g} "
                    f"forgotten, {s['tokens']:.0f} vs {cat['tokens']:.0f} tokens, target loss "
                    f"{num(s['target_loss'], 0, 3)} vs {num(cat['target_loss'], 0, 3)}"
                )
    table = train_kl_table(results, args)
    if not table and any("extra" in r for r in results):
        print("\ntrain-KL table left out: the history records hold no drift/train_kl")
    if table:
        print("\ntrain KL against forgetting (Spearman rho over each run's evaluations; SFT, seed 0, no replay)")
        print(f"{'lr':>8}{'steps':>7}{'evals':>7}{'all':>8}{'arith':>8}{'facts':>8}")
        for row in table:
            cells = "".join(
                f"{row[n]:8.2f}" if row[n] is not None else f"{'-':>8}" for n in ("all", "arithmetic", "facts")
            )
            lr = f"{row['lr']:g}" if isinstance(row["lr"], float) else row["lr"]
            print(f"{lr:>8}{row['steps']!s:>7}{row['evaluations']:7d}{cells}")


def draw(results: list[dict], args, goals: dict, path: str) -> None:
    """Two panels (one per trainer): replay tokens (log) against forgetting, a line per arm
    through its medians, seeds as faint dots, no replay as a dashed line, the goal's point marked."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    fig = Figure(figsize=(6 * len(args.trainers), 4.5))
    FigureCanvasAgg(fig)
    colors = dict(zip(ARMS[1:], ("#888888", "#1f77b4", "#d62728", "#2ca02c")))
    for i, trainer in enumerate(args.trainers):
        ax = fig.add_subplot(1, len(args.trainers), i + 1)
        none = summary(runs_of(results, trainer, "none"))
        if none["forgetting"] is not None:
            ax.axhline(100 * none["forgetting"], color="#444", linestyle="--", label="none")
        for arm in ARMS[1:]:
            rows = sorted({r["rows"] for r in runs_of(results, trainer, arm)})
            if not rows:
                continue
            xs, ys = [], []
            for r in rows:
                runs = runs_of(results, trainer, arm, r)
                ax.scatter(
                    [x["tokens"] for x in runs],
                    [100 * (x["forgetting"] or 0) for x in runs],
                    color=colors[arm],
                    alpha=0.2,
                    s=12,
                )
                s = summary(runs)
                xs.append(s["tokens"])
                ys.append(100 * (s["forgetting"] or 0))
            ax.plot(xs, ys, marker="o", color=colors[arm], label=arm)
        g = goals.get(trainer)
        if g and g["headline"] in g["by_k"]:
            u = g["by_k"][g["headline"]]["uniform"]
            ax.scatter(
                [u["tokens"] / 2],
                [100 * (u["forgetting"] or 0)],
                marker="*",
                s=160,
                color="black",
                zorder=5,
                label=f"goal: uniform@{g['headline']} at half its tokens",
            )
        ax.set_xscale("log")
        ticks = FuncFormatter(lambda x, _: f"{x:.0f}" if f"{x:.0f}"[0] in "1235" else "")  # 3×10²4×10² runs together
        ax.xaxis.set_major_formatter(ticks)
        ax.xaxis.set_minor_formatter(ticks)
        ax.set_xlabel("replay tokens over the run (log)")
        ax.set_ylabel("forgetting (%)")
        ax.set_title(f"TRL {trainer.upper()}: replay tokens against forgetting")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def versions() -> dict:
    import transformers
    import trl

    import forgetwatch

    return {
        "forgetwatch": forgetwatch.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    began = time.perf_counter()
    os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the spawned workers
    if args.target_mix is None:
        args.target_mix = TARGET_MIX
    jobs, notes = plan(args)
    for note in notes:
        print(f"note: {note}")
    cfg = {
        "out": args.out,
        "pretrain_steps": args.pretrain_steps,
        "hidden": args.hidden,
        "eval_steps": args.eval_steps,
        "target_mix": args.target_mix,
        "weight_per_row": args.weight_per_row,
    }
    os.makedirs(os.path.join(args.out, "bases"), exist_ok=True)
    print(f"{len(jobs)} runs over {args.seeds} seed(s) in {args.jobs} process(es) of 1 thread", flush=True)
    results, pretrain = execute(cfg, list(range(args.seeds)), jobs, args.jobs)
    checks = {t: void_check(results, t) for t in args.trainers}
    void = any(c["void"] for c in checks.values())
    goals = {t: goal(results, t, args.rows) for t in args.trainers}
    if void:
        for t, c in checks.items():
            if c["void"]:
                medians = ", ".join(f"{k} {v:.2f}" if v is not None else f"{k} -" for k, v in c["medians"].items())
                print(
                    f"VOID: {t.upper()} without replay forgets every skill alike ({medians}: hi {c['hi']:.2f} < 3 x lo {c['lo']:.2f})"
                )
    print_report(results, args, checks, goals)
    wall = time.perf_counter() - began
    run_seconds = [r["job_seconds"] for r in results]
    print(
        f"\nwall {wall:.0f} s ({args.jobs} process(es)); pre-training {pretrain:.0f} s; "
        f"median run {med(run_seconds) or 0:.1f} s over {len(results)} runs"
    )
    if args.png and not void:
        draw(results, args, goals, args.png)
    if args.json:
        meta = {
            "settings": {k: v for k, v in vars(args).items() if k not in ("png", "json")},
            "versions": versions(),
            "notes": notes,
            "wall_seconds": wall,
            "pretrain_seconds": pretrain,
        }
        data = {
            "meta": meta,
            "void": void,
            "void_check": checks,
            "goal": {t: {**g, "verdict": verdict(g, g["headline"])} for t, g in goals.items()},
            "train_kl": train_kl_table(results, args),
            "runs": sorted(results, key=lambda r: (r["trainer"], r["arm"], r["rows"], r["seed"], r["lr"], r["steps"])),
        }
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1, allow_nan=False)
    return 2 if void else 0


if __name__ == "__main__":
    sys.exit(main())
