"""``forgetwatch demo``: a tiny model learns made-up facts, then TRL's SFT on arithmetic makes it forget (CPU only)."""

from __future__ import annotations

import copy
import functools
import importlib.util
import math
import os
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from forgetwatch.common.text import pct

DEFAULT_OUT = "forgetwatch-demo"
#: as the README and ``forgetwatch demo --help`` say it (measured: 18 s on a first run, 9 s after)
TAKES = "under a minute on two CPU cores"
RATES = ("forgetting", "backward_transfer")


def run_demo(out_dir: str | os.PathLike[str] = DEFAULT_OUT, steps: int = 60, eval_steps: int = 5, replay: bool = False):
    """Run the demo; returns the callback. With ``replay``, probes on half the facts and a replay pool of the other
    half: the run without and with replay, side by side."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # it trains on the CPU: no deepspeed notice that it found no GPU
    if importlib.util.find_spec("trl") is None:
        raise ImportError('forgetwatch demo needs TRL: pip install "forgetwatch[demo]"')

    from forgetwatch.config.settings import Output
    from forgetwatch.page.html import write_report
    from forgetwatch.probes import ProbeSet
    from forgetwatch.replay import ReplayPool
    from forgetwatch.store.read import read_history
    from forgetwatch.toy import ToyWorld

    out = Path(out_dir)
    start = time.perf_counter()
    world = ToyWorld()
    print("1/3 teaching a tiny model some made-up facts ...")
    tokenizer = world.tokenizer()
    base = world.model(tokenizer)
    world.train(base, tokenizer, world.fact_texts(), steps=200)
    records, pool = world.replay_split() if replay else (world.probe_records(), None)
    probes = ProbeSet.from_records(records, source="demo facts")

    print(
        f"2/3 post-training it on arithmetic with TRL SFT for {steps} steps, "
        f"scoring {len(probes)} probes every {eval_steps} steps{', without and with replay' if replay else ''} ..."
    )
    train = functools.partial(
        _post_train, world, tokenizer, base, probes, steps, eval_steps, output=Output(verbose=not replay)
    )
    runs = [out / "without-replay", out / "with-replay"] if replay else [out]
    plain = train(runs[0])
    callback = train(runs[1], replay=ReplayPool.from_records(pool, source="demo pool")) if replay else plain

    print("3/3 results")
    if replay:
        print(_side_by_side({"without replay": plain, "with replay": callback}))
    else:
        print("\nforgetting (F) and backward transfer (BT) against the base model:")
        print(text_curve(read_history(out / "history.jsonl")))
    print("\nat the last step:")
    print(callback.history[-1][1].summary())
    written = [r / "history.jsonl" for r in runs]
    try:
        written.insert(0, write_report(runs, out / "report.html"))
    except ImportError as err:
        print(f"(no report: {err})")
    print(f"\nwrote {', '.join(str(p) for p in written)} in {time.perf_counter() - start:.0f} s")
    return callback


def text_curve(history: Sequence[Mapping[str, Any]], width: int = 60) -> str:
    """The overall forgetting (F) and backward transfer (BT) of a history's records, a line per evaluation with a
    bar of ``#`` proportional to F (the largest fills the line to ``width``)."""
    by_step = {int(r["step"]): r["report"] for r in history}  # a step evaluated twice (a resume): the later
    if not by_step:
        raise ValueError("the history has no evaluations to show (has the run reached its first evaluation?)")
    points = sorted(by_step.items())
    step_w = max(len(str(step)) for step in by_step)
    rates = [[math.nan if r.get(k) is None else float(r[k]) for k in RATES] for _, r in points]
    heads = [
        f"step {step:>{step_w}}  F {pct(f, 4, '-')}  BT {pct(bt, 4, '-')}" for (step, _), (f, bt) in zip(points, rates)
    ]
    top = max((f for f, _ in rates if math.isfinite(f)), default=0.0)
    bar_max = max(width - max(len(h) for h in heads) - 2, 10)
    # negative or NaN rates get no bar
    bars = [max(0, min(round(bar_max * f / top), bar_max)) if top > 0 and math.isfinite(f) else 0 for f, _ in rates]
    return "\n".join(f"{head}  {'#' * n}".rstrip() for head, n in zip(heads, bars))


def run_real_demo(argv: list[str]):
    """``forgetwatch demo --real``: this checkout's ``examples/real_model.py`` with ``argv``; returns its callback."""
    path = Path(__file__).resolve().parents[2] / "examples" / "real_model.py"
    if not path.is_file():
        raise ImportError(
            "forgetwatch demo --real runs examples/real_model.py from a clone of the repository "
            '(git clone ...; pip install -e ".[real]"); it is not in this installation'
        )
    sys.path.insert(0, str(path.parent))  # the example imports real_world.py beside it
    spec = importlib.util.spec_from_file_location("forgetwatch_real_model_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(argv)


def _post_train(world, tokenizer, base, probes, steps: int, eval_steps: int, out: Path, **settings):
    """TRL SFT of a copy of ``base`` on the world's arithmetic, watched; the callback."""
    import datasets
    import trl
    from transformers import PrinterCallback

    from forgetwatch.integrations.callback import ForgetWatchCallback

    callback = ForgetWatchCallback(probes, eval_steps=eval_steps, output_dir=str(out), **settings)
    quiet = dict(logging_steps=steps, save_strategy="no", report_to=[], disable_tqdm=True)
    cpu = dict(use_cpu=True, bf16=False, activation_checkpointing=False, dataloader_pin_memory=False)
    training = dict(max_steps=steps, per_device_train_batch_size=16, learning_rate=3e-3, max_length=64, packing=False)
    args = trl.SFTConfig(str(out / "sft"), **training, seed=0, **quiet, **cpu)
    data = datasets.Dataset.from_dict({"text": world.distraction_texts()})
    datasets.disable_progress_bars()  # a bar per pass of TRL over the data says nothing here
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        trainer = trl.SFTTrainer(
            model=copy.deepcopy(base), args=args, train_dataset=data, processing_class=tokenizer, callbacks=[callback]
        )
        trainer.remove_callback(PrinterCallback)  # the one-line summaries say enough
        trainer.train()
    return callback


def _side_by_side(callbacks) -> str:
    runs = {name: dict(cb.history) for name, cb in callbacks.items()}
    steps = sorted(set().union(*runs.values()))
    lines = ["\nforgetting against the base model:", "step  " + "  ".join(f"{n:>15}" for n in runs)]
    lines += [
        f"{s:>4}  " + "  ".join(f"{pct(r[s].forgetting) if s in r else '-':>15}" for r in runs.values()) for s in steps
    ]
    return "\n".join(lines)
