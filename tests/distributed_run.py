"""Run by tests/test_distributed.py under ``torchrun --nproc_per_node 2`` (gloo, CPU).

``python distributed_run.py MODE OUT``; each rank writes what it saw to ``OUT/rank<N>.json``
(modes may be joined, ``fsdp1,fsdp2``: one launch, ``OUT/rank<N>-<mode>.json`` each).

- ``sft``: TRL's SFTTrainer (DDP) with ForgetWatchCallback on the default budget schedule, an
  early-stop rule and a merge at the end; rank 1 is made slower, so the ranks' clocks disagree.
  Rank 0 saves the weights at every evaluation (``OUT/step-<N>``), for the test to score them
  independently.
- ``zero3``: the same under DeepSpeed ZeRO stage 3 (every rank holds a shard of each weight),
  with a fixed schedule; the weights are saved with ``trainer.save_model``, which gathers them.
- ``fsdp1`` / ``fsdp2``: the toy model sharded with FSDP1 (``FullyShardedDataParallel``) or
  FSDP2 (``fully_shard``), scored with ``distributed=True``, next to an unsharded copy scored
  by this rank alone (knowledge and behaviour probes).
- ``zero3key``: toy models partitioned by DeepSpeed ZeRO-3 (``zero.Init(module=...)``), for
  the weights key: the same weights twice, then others.
- ``replay`` / ``replay-fails``: SFT under DDP with replay (rank 0's replay failing at step 3);
  ``replay`` draws by the rows' loss rises and holds prompts the base answers (synthetic); the
  train-KL signal (on by default) is measured on both ranks' shares of the same rows.
- ``prefixes`` / ``prefixes-fsdp2``: few-shot probes (one shared block) scored with
  ``distributed=True`` by an unsharded copy on each rank (each rank reads the block from its
  cache) or under FSDP2 (each probe whole), next to every probe scored whole by this rank alone.
- ``oom``: the same, unsharded, where rank 1 runs out of memory (injected) on batches of more
  than 3 rows and rank 0 never does.
- ``sampled``: knowledge and behaviour probes, unsharded, answers sampled (3 a probe, each with
  its own seed), next to the same scored by this rank alone.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import warnings

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
from injected import OutOfMemoryAbove  # noqa: E402  (tests/, this script's folder)

from forgetwatch import MergeAtEnd, Monitor, Output, ProbeKind, ProbeSet, Replay, Scorer, Scoring  # noqa: E402
from forgetwatch.integrations.callback import ForgetWatchCallback  # noqa: E402
from forgetwatch.scoring.borrow import is_sharded  # noqa: E402
from forgetwatch.store.read import read_history  # noqa: E402
from forgetwatch.toy import ToyWorld  # noqa: E402


class ForwardClock:
    """Time counted in forwards of one model (a training forward with its backward as three),
    ``rate`` per unit: rank 1's runs faster, as a slower rank's would, so the ranks' budget
    clocks differ, the same on any machine however loaded (rank 0's decides for all)."""

    def __init__(self, model, rate):
        self.now, self.rate = 0.0, rate
        model.register_forward_hook(self._tick)

    def _tick(self, module, *_):
        self.now += self.rate * (3 if module.training else 1)

    def __call__(self):
        return self.now


def toy_setup():
    torch.set_num_threads(1)
    world = ToyWorld(seed=0)
    tokenizer, base, _ = world.base_and_tuned(base_steps=150, tuned_steps=0)  # seeded: alike on every rank
    probes = ProbeSet.from_records(world.probe_records(generative=True))
    return world, tokenizer, base, probes


def skip_deepspeed_shm_build() -> None:
    """DeepSpeed compiles an optional shared-memory speed-up for CPU collectives on first use
    (a minute on this machine); gloo alone is enough."""
    import importlib

    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None


def sft(out: str, zero3: bool = False) -> dict:
    import trl
    from datasets import Dataset

    extra: dict = {}
    if zero3:
        skip_deepspeed_shm_build()
        extra["deepspeed"] = {
            "train_batch_size": "auto",
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto",
            "zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True},
        }
    world, tokenizer, base, probes = toy_setup()
    rank = int(os.environ["RANK"])
    if rank == 0:
        base.save_pretrained(os.path.join(out, "step-0"))
    saved, shares = [], []

    def after_evaluation(report, step):  # runs on every rank after each evaluation
        # the weights an independent scorer will re-score (save_model gathers ZeRO-3 shards,
        # so every rank takes part)
        trainer.save_model(os.path.join(out, f"step-{step}"))
        saved.append(step)
        shares.append(cb.watch.view.scorer.scored_here)

    settings = (
        {"eval_steps": 10}
        if zero3
        else {
            "monitor": Monitor(max_overhead=0.5),
            "max_forgetting": 0.45,
            "clock": ForwardClock(base, rate=1.0 + 0.5 * rank),
            "merge_at_end": MergeAtEnd(target=world.distraction_texts(n=6, seed=7), alphas=[0.5]),
        }
    )
    cb = ForgetWatchCallback(
        probes, sinks=[after_evaluation], **settings, output=Output(verbose=False), scoring=Scoring(max_new_tokens=6)
    )
    args = trl.SFTConfig(
        out,
        max_steps=30 if zero3 else 150,
        per_device_train_batch_size=8,
        learning_rate=3e-3,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        logging_steps=1000,
        ddp_backend="gloo",
        bf16=False,
        max_length=64,
        packing=False,
        activation_checkpointing=False,
        dataloader_num_workers=0,
        **extra,
    )
    trainer = trl.SFTTrainer(
        model=base,
        args=args,
        processing_class=tokenizer,
        train_dataset=Dataset.from_dict({"text": world.distraction_texts()}),
        callbacks=[cb],
    )
    trainer.train()
    return {
        "world_size": args.world_size,
        "steps": [s for s, _ in cb.history],
        "saved": saved,
        "forgotten_ids": [r.forgotten_ids for _, r in cb.history],
        "gained_ids": [r.gained_ids for _, r in cb.history],
        "correct_base": cb.base_answers.correct.tolist(),
        "stopped": cb.stop_reason is not None,
        "global_step": trainer.state.global_step,
        "shares": shares,
        "n_probes": len(probes),
        "sharded": is_sharded(trainer.model),
        "merge": cb.ending.metrics if cb.ending else None,
        "sweep_written": os.path.isfile(os.path.join(out, "forgetwatch", "sweep.json")),
    }


def sharded(mode: str) -> dict:
    from functools import partial

    import torch.distributed as dist

    world, tokenizer, base, probes = toy_setup()
    if mode.startswith("prefixes"):  # every question behind one few-shot block
        block = "".join(f"The capital of {c.name} is {c.capital}\n\n" for c in world.countries[-5:])
        probes = ProbeSet.from_records([{**r, "question": block + r["question"]} for r in probes.to_records()])
    else:  # behaviour probes too: their responses are generated apart (no stop strings), in lockstep as well
        probes = ProbeSet(list(probes) + list(ProbeSet.from_records(world.behaviour_probe_records(world.known[:4]))))
    if not dist.is_initialized():  # several modes run one after another in one launch
        dist.init_process_group("gloo")
    sampled = {"samples": 3, "temperature": 1.0, "top_p": 0.9, "seed": 5} if mode == "sampled" else {}
    options = {"max_new_tokens": 6, "behaviour_max_new_tokens": 8, **sampled}
    alone = Scorer(tokenizer, probes, Scoring(**options, shared_prefixes=False))(
        base, batch_size=5, show_progress=False
    )
    model = copy.deepcopy(base)
    layer = type(model.model.layers[0])
    if mode in ("prefixes", "sampled"):
        pass  # a whole copy on each rank, as under DDP
    elif mode == "oom":
        model = OutOfMemoryAbove(model, limit=3 if int(os.environ["RANK"]) == 1 else float("inf"))
    elif mode == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

        model = FullyShardedDataParallel(
            model,
            device_id=torch.device("cpu"),
            use_orig_params=True,
            auto_wrap_policy=partial(transformer_auto_wrap_policy, transformer_layer_cls={layer}),
        )
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for block in model.model.layers:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    scorer = Scorer(tokenizer, probes, Scoring(**options))
    together = scorer(model, batch_size=8, show_progress=False, distributed=True)
    generated = sum(p.kind is not ProbeKind.MULTIPLE_CHOICE for p in probes)
    return {
        "alone_samples": None if alone.samples_correct is None else alone.samples_correct.tolist(),
        "together_samples": None if together.samples_correct is None else together.samples_correct.tolist(),
        "work": len(probes) + (sampled.get("samples", 1) - 1) * generated,  # what the ranks share
        "alone_correct": alone.correct.tolist(),
        "together_correct": together.correct.tolist(),
        "alone_outputs": alone.outputs,
        "together_outputs": together.outputs,
        "max_logprob_diff": max(
            (float(abs(a - b).max()) for a, b in zip(alone.choice_logprobs, together.choice_logprobs) if len(a)),
            default=0.0,
        ),
        "scored_here": scorer.scored_here,
        "n_probes": len(probes),
        "row_cap": scorer.about(model).row_cap,
        "read_prefixes": any(any(b.prefixes) for plan in scorer.about(model).plans.values() for b in plan.batches),
        "rows": getattr(model, "sizes", []),
    }


def zero3_keys() -> dict:
    import deepspeed
    import torch.distributed as dist

    from forgetwatch.common.distributed import Ranks
    from forgetwatch.run.base import weights_key

    skip_deepspeed_shm_build()
    if not dist.is_initialized():  # it may follow other modes in one launch
        dist.init_process_group("gloo")
    world = ToyWorld(seed=0)
    tokenizer = world.tokenizer()
    keys, held = [], []
    for scale in (1.0, 1.0, 1.01):
        model = world.model(tokenizer)  # the same weights each time, then scaled
        with torch.no_grad():
            model.lm_head.weight.mul_(scale)
        deepspeed.zero.Init(
            module=model, config_dict_or_path={"train_batch_size": 2, "zero_optimization": {"stage": 3}}
        )
        held.append(sum(p.numel() for p in model.parameters()))  # placeholders: nothing here
        keys.append(weights_key(model, Ranks.all()))
    return {"keys": keys, "held": held}


def replay(out: str, fail_at: int | None = None) -> dict:
    """SFT under DDP with replay: the parameters must stay the same on both ranks (with
    ``fail_at``, rank 0's replay fails at that step, rank 1's does not)."""
    import trl
    from datasets import Dataset

    from forgetwatch import ReplayPool
    from forgetwatch.replay import replay as driver

    backward = driver.replay_backward
    if fail_at and os.environ["RANK"] == "0":
        calls = []

        def failing(*args, **kwargs):
            calls.append(1)
            if len(calls) == fail_at:
                raise RuntimeError("replay failed (injected)")
            return backward(*args, **kwargs)

        driver.replay_backward = failing

    world, tokenizer, base, probes = toy_setup()
    rows = [
        {"id": f"r{i}", "text": f"Remember: a {c.color} flag flies over {c.name}.", "category": "colors"}
        for i, c in enumerate(world.known)
    ]
    if not fail_at:  # synthetic rows, each rank answering its share
        rows += [{"id": f"p{i}", "prompt": f"Rivers counted in {c.name}:"} for i, c in enumerate(world.known[:9])]
    pool = ReplayPool.from_records(rows, max_new_tokens=5)
    cb = ForgetWatchCallback(
        probes,
        eval_steps=5,
        replay=Replay(pool, batch_size=5, select="categories" if fail_at else "uniform"),
        output=Output(verbose=False),
        scoring=Scoring(max_new_tokens=6),
        monitor=Monitor(noise_check=False),
    )
    args = trl.SFTConfig(
        out,
        max_steps=10,
        per_device_train_batch_size=8,
        learning_rate=3e-3,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        logging_steps=1000,
        ddp_backend="gloo",
        bf16=False,
        max_length=64,
        packing=False,
        max_grad_norm=1.0,
        activation_checkpointing=False,
        dataloader_num_workers=0,
    )
    trainer = trl.SFTTrainer(
        model=base,
        args=args,
        processing_class=tokenizer,
        callbacks=[cb],
        train_dataset=Dataset.from_dict({"text": world.distraction_texts()}),
    )
    try:
        trainer.train()
    finally:
        driver.replay_backward = backward  # the next mode of this launch replays as it should
    params = torch.cat([p.detach().double().flatten() for p in trainer.model.parameters()])
    losses = [e["forgetwatch/replay/loss"] for e in trainer.state.log_history if "forgetwatch/replay/loss" in e]
    drift = [e["forgetwatch/drift/train_kl"] for e in trainer.state.log_history if "forgetwatch/drift/train_kl" in e]
    return {
        "train_kl": drift,
        "train_kl_kept": [
            r["drift"]["train_kl"] for r in read_history(cb.watch.output_dir / "history.jsonl") if "drift" in r
        ],
        "train_kl_rows": len(cb.watch._train_kl.tokens),
        "checksum": float(params.sum()),
        "first": params[:50].tolist(),
        "replay_losses": losses,
        "drawn": cb.replay.sampler.drawn,
        "world_size": args.world_size,
        "off": cb.replay.off,
        "state": cb.replay.state(),  # the draws and the tokens replayed
        "encoded": cb.replay.encoded,  # the prompts' rows: prompt and the base's answer
        "answered": sorted(cb.replay.starts),
    }


def run(mode: str, out: str) -> dict:
    if mode in ("replay", "replay-fails"):
        return replay(os.path.join(out, mode), fail_at=3 if mode == "replay-fails" else None)
    if mode in ("sft", "zero3"):
        return sft(out, zero3=mode == "zero3")
    return zero3_keys() if mode == "zero3key" else sharded(mode)


def main(mode: str, out: str) -> None:
    rank = os.environ["RANK"]
    if "," in mode:  # "fsdp1,fsdp2,...": each mode in turn, one launch for all (each its own file)
        for one in mode.split(","):
            with open(os.path.join(out, f"rank{rank}-{one}.json"), "w") as f:
                json.dump(run(one, out), f)
        result = {}
    else:
        result = run(mode, out)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    # the result is on disk: leave without the interpreter's teardown, where a collective
    # library's threads now and then abort the process ("terminate called without an active
    # exception") after a run that went well
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
