"""The public API as a user's code calls it, for ``mypy`` (``.ci/run``): the exports'
signatures and return types check. Never run; checked only."""

from __future__ import annotations

import torch

from forgetwatch import (
    Answers,
    Evaluation,
    ForgetWatchCallback,
    MergeAtEnd,
    MergeSweep,
    Monitor,
    Output,
    ProbeSet,
    Replay,
    ReplayPool,
    Scoring,
    TransitionReport,
    Watch,
    compare,
    evaluate,
    load_trajectory,
    merge_sweep,
)


def a_loop(model: torch.nn.Module, tokenizer: object, steps: int) -> float:
    probes = ProbeSet.from_jsonl("probes.jsonl")
    few_shot: ProbeSet = ProbeSet.from_lm_eval(
        ["arc_easy", "mmlu"], num_fewshot=5, limit=20, metric={"arc_easy": "acc_norm"}
    )
    answers_5shot: Answers = evaluate(model, tokenizer, few_shot, scoring=Scoring(shared_prefixes=True))
    pool = ReplayPool.from_jsonl("pool.jsonl")
    answered: ReplayPool = ReplayPool.from_prompts({"geo": ["Name a river."]}, max_new_tokens=32, stop=["\n"])
    assert answered.answering is not None and answered.answering.max_new_tokens == 32
    watch = Watch(
        probes,
        eval_steps=50,
        output_dir="run/forgetwatch",
        max_forgetting=0.1,
        scoring=Scoring(batch_size=8),
        output=Output(verbose=False),
        monitor=Monitor(patience=2),
    )
    replay = Replay(pool, loss="kl", weight=5.0, select="categories")
    watch.keep(replay)
    watch.start(model, tokenizer)
    replay.begin(model, watch.view)
    for step in range(1, steps + 1):
        replay.before_optimizer_step(model, max_grad_norm=1.0)
        if watch.due(step):
            evaluation: Evaluation | None = watch.evaluate(model, step)
            if evaluation is not None:
                replay.on_evaluation(evaluation.report)
            if evaluation is not None and evaluation.stop:
                break
    watch.finish(model, steps)
    state: dict[str, object] = watch.state_dict()
    watch.load_state_dict(state)
    merge = MergeAtEnd(["def f(): pass"], keep=0.9, alphas=[0.25, 0.5], by_layer=4, save=True)
    callback = ForgetWatchCallback(probes, eval_steps=50, replay=pool, merge_at_end=merge)
    sweep: MergeSweep = merge_sweep(model, model, tokenizer, probes, target=["x = 1"], alphas=[0.5])
    chosen: float = sweep.best(keep=0.9)
    sweep.save(chosen, "merged", tokenizer)
    history: list[tuple[int, TransitionReport]] = callback.history
    base: Answers = evaluate(model, tokenizer, probes, batch_size=32, show_progress=False)
    report: TransitionReport = compare(base, evaluate(model, tokenizer, probes))
    return report.forgetting + len(history) + float(load_trajectory("run").correct.mean()) + answers_5shot.accuracy
