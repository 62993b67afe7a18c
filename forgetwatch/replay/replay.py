"""Replay during a run: before each optimizer step, a batch of pool rows, drawn by the forgetting
measured at the last evaluation, adds its weighted loss gradient to the trainer's.

Where: transformers clips gradients before ``on_pre_optimizer_step``, so the replay gradient
is added there and, when ``max_grad_norm`` is set, the sum is clipped again. Every rank draws
the same rows (the draws are seeded), replays its share of them, and the replay gradient is
summed over the ranks (an all-reduce, like DDP's): parameters stay identical. Under fp16's
gradient scaler the replay loss is backpropagated at the scaler's scale, then unscaled and
weighted; a replay gradient that overflowed is left out of that step. Sharded models
(DeepSpeed ZeRO-3, FSDP) are refused when training begins.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from typing import Any

import torch

from forgetwatch.common.distributed import Ranks
from forgetwatch.common.text import first_line, listing, shorten
from forgetwatch.config import checks as check
from forgetwatch.replay.coverage import Coverage, coverage, uncovered_losses, uncovered_message
from forgetwatch.replay.kept import (
    MAX_WEIGHT,
    REPLAY_ANSWERS,
    REPLAY_BASE,
    REPLAY_STATE,
    base_to_resume,
    kept_base,
    kept_state,
    state_problem,
    state_to_resume,
    tokens_key,
)
from forgetwatch.replay.penalty import encode_rows, kl_backward, replay_backward, target_count
from forgetwatch.replay.rows import ReplayPoolError
from forgetwatch.replay.sampler import ReplaySampler, category_weights
from forgetwatch.replay.synthetic import KeptAnswers, answer_prompts, answers_to_resume, kept_answers, prompts_key
from forgetwatch.results.noise import noise_by_scope
from forgetwatch.results.report import TransitionReport
from forgetwatch.scoring.borrow import is_sharded
from forgetwatch.scoring.generation import Generated, answered_row
from forgetwatch.scoring.next_tokens import BaseDistribution, base_distribution, logits_width
from forgetwatch.scoring.scorer import pad_id

__all__ = ["OPTIONS", "Replay"]

logger = logging.getLogger("forgetwatch")

#: Replay's options and their checks (in YAML and a framework's settings: ``replay_<name>``).
OPTIONS: dict[str, Any] = {
    "loss": check.choice(("lm", "kl")),
    "weight": lambda value: _weight(value),
    "select": check.choice(("categories", "uniform")),
    "batch_size": check.integer(
        1, 1024, "each row replayed costs a forward and a backward pass before every optimizer step"
    ),
    "top_k": check.integer(
        1,
        1024,
        "each costs 6 bytes at every position of every replay row, kept all run: a few dozen carry nearly "
        "all of the base's probability",
    ),
    "seed": check.integer(0),
}
#: Values a release before 0.1 took, and what to give instead.
RETIRED = {
    ("weight", "auto"): 'weight="auto" is retired: in its own benchmark it forgot more than a fixed weight '
    "(2.5 % vs 1.2 %); give a number, e.g. weight=1.0",
    ("select", "rows"): 'select="rows" is retired: drawing by category forgot fewer probes at every budget; '
    'use select="categories" (or "uniform")',
}


def _weight(value: Any) -> float:
    number = check.non_negative(value)
    if number > MAX_WEIGHT:
        raise check.Invalid(
            f"a number from 0 to {MAX_WEIGHT:g}", value, "a heavier replay loss swamps the trainer's (1e30 makes NaN)"
        )
    return number


def checked_options(**given: Any) -> dict[str, Any]:
    """Replay's options, checked: a ``ValueError`` naming the first bad one and what to give.

    Example:
        >>> checked_options(weight="auto")
        Traceback (most recent call last):
            ...
        ValueError: weight="auto" is retired: in its own benchmark it forgot more than a fixed weight (2.5 % vs 1.2 %); give a number, e.g. weight=1.0
    """
    out = {}
    for name, value in given.items():
        if isinstance(value, str) and (name, value) in RETIRED:
            raise ValueError(RETIRED[name, value])
        try:
            out[name] = OPTIONS[name](value)
        except check.Invalid as err:
            raise ValueError(f"{name}= {err}") from None
    return out


class Replay:
    """Replay of a pool while training: which rows, how much, and what it cost so far. A repair
    method (:class:`~forgetwatch.run.repair.Repair`): the run calls :meth:`begin`,
    :meth:`on_evaluation` and :meth:`before_optimizer_step`.

    Args:
        pool: the rows (a :class:`~forgetwatch.ReplayPool`; checked disjoint from the probes
            when the run is built).
        loss: ``"lm"``, the next-token loss on the rows, or ``"kl"``, the KL from the base
            model's next-token distribution on them (kept once when training begins).
        weight: how much the replay loss counts next to the trainer's (0 to 100; 0 replays nothing).
        select: how rows are drawn: ``"categories"`` (by the forgetting of the probe category
            each row names, at the last evaluation) or ``"uniform"``.
        batch_size: pool rows replayed before each optimizer step (1 to 1024).
        top_k: with ``"kl"``: the base's most likely next tokens kept per position (1 to 1024).
        seed: the seed of the draws (the same on every rank).
        max_length: tokens kept of a row.

    Example:
        >>> from forgetwatch import ReplayPool
        >>> pool = ReplayPool.from_records([{"id": "r1", "text": "Paris is in France.", "category": "geo"}])
        >>> replay = Replay(pool, loss="kl", weight=5.0)
        >>> replay.loss, replay.weight, replay.select
        ('kl', 5.0, 'categories')
    """

    name = "replay"
    #: the files it keeps in the run's folder and its checkpoints
    files = (REPLAY_STATE, REPLAY_BASE, REPLAY_ANSWERS)

    def __init__(
        self,
        pool: Any,
        *,
        loss: str = "lm",
        weight: float = 1.0,
        select: str = "categories",
        batch_size: int = 8,
        top_k: int = 32,
        seed: int = 0,
        max_length: int = 512,
    ):
        o = checked_options(loss=loss, weight=weight, select=select, batch_size=batch_size, top_k=top_k, seed=seed)
        self.loss, self.weight, self.select = o["loss"], o["weight"], o["select"]
        self.batch_size, self.top_k, self.seed = o["batch_size"], o["top_k"], o["seed"]
        self.pool, self.max_length = pool, max_length
        self.probe_categories: list[str] | None = None  # once the run is built
        self.coverage: Coverage | None = None  # which probe categories the pool covers
        self.warned: set[str] = set()  # uncovered categories warned of (once per run)
        self.noise: dict[str, float] = {}  # the base's noise floors by scope, once the run begins
        self.encoded: dict[str, list[int]] = {}  # token ids by row id, once (rows too short dropped)
        self.starts: dict[str, int] = {}  # each row's first target token, where not 1
        self.tokens = 0  # replay tokens forwarded so far (every rank's rows)
        self.dropped: list[str] = []  # ids of the rows too short to replay
        self.key: dict[str, str] = {}  # the pool and its tokens, which kept states must match
        self.base: BaseDistribution | None = None  # with "kl": the base model's distribution on the rows
        self.sampler = ReplaySampler(pool, self.seed, uniform=self.select == "uniform")
        self.weights = category_weights(None, self.sampler.categories)
        self.off: str | None = None  # why replay stopped for the rest of the run, once it did
        self._loss_sum, self._steps, self._overflows = 0.0, 0, 0
        self._run: Any = None  # the RunContext of the run begun

    def __repr__(self) -> str:
        return (
            f"Replay({self.pool!r}, loss={self.loss!r}, weight={self.weight:g}, select={self.select!r}, "
            f"batch_size={self.batch_size})"
        )

    def hold_out(self, probes: Any) -> None:
        """A pool row holding a probe's question is refused (see :meth:`ReplayPool.check_disjoint`)."""
        self.pool.check_disjoint(probes)
        self.probe_categories = list(probes.categories)

    def begin(self, model: torch.nn.Module, run: Any) -> None:
        """Training begins or resumes (``run``: the :class:`~forgetwatch.run.repair.RunContext`):
        the base's answers to prompt rows, then the pool tokenized; on resume the state from the
        run's own (``run.state``), else the first kept ``replay.json``, else rebuilt from the
        history (exact, and said), else one clear error naming each copy; then with ``"kl"`` the
        base distribution. Rank 0 reads the kept files and shares what it found."""
        self._run = run
        self.noise = noise_by_scope(dict(run.base_meta))
        self.refuse_sharded(model, run.sharded)
        answers = self._answers(model, run) if self.pool.answering is not None else None
        self.start(model, run.tokenizer, sharded=run.sharded, warn=run.writes, answers=answers)
        if run.step > 0:
            if run.state is not None:
                if problem := state_problem(self, run.state, run.step):
                    raise ValueError(f"the replay state given to load_state_dict() cannot be used: {problem}")
                kept = dict(run.state)
            else:
                paths = [d / REPLAY_STATE for d in run.resume_dirs]
                found = run.ranks.share_from_rank_zero(lambda: kept_state(self, paths, run.step))
                kept, warning = state_to_resume(self, found, paths, run.records, run.last_report, run.step)
                if warning and run.writes:
                    logger.warning("forgetwatch: %s", warning)
            self.resume(kept, run.step)
        if run.last_report is not None:
            self.reweigh(run.last_report)
        if self.loss == "kl":
            self._base_distribution(model, run)

    def _answers(self, model: torch.nn.Module, run: Any) -> dict[str, Generated]:
        """The base's answers to the pool's prompts: generated on a fresh run (sharded over the
        ranks), read back on resume (they cannot be written again from moved weights)."""
        prompt_ids = self.pool.prompt_ids(run.tokenizer)
        key = {"pool": self.pool.fingerprint(), "prompts": prompts_key(prompt_ids), **run.made_by(model)}
        if run.reads_back:
            paths = [d / REPLAY_ANSWERS for d in run.resume_dirs]
            vocab = logits_width(model)
            found = run.ranks.share_from_rank_zero(lambda: kept_answers(paths, key, vocab, list(prompt_ids)))
            kept, warning = answers_to_resume(found, paths)
            if warning and run.writes:
                logger.warning("forgetwatch: %s", warning)
        else:
            began = time.perf_counter()
            with run.as_base(model):
                answers = answer_prompts(
                    model, run.tokenizer, self.pool, prompt_ids, run.ranks, run.rows_per_batch(model)
                )
            kept = KeptAnswers(answers, key)
            if run.writes:
                logger.info(
                    "forgetwatch: replay: the base answered %d prompts in %.1f s (kept in %s)",
                    len(answers),
                    time.perf_counter() - began,
                    REPLAY_ANSWERS,
                )
        if run.writes:
            run.store.keep(REPLAY_ANSWERS, kept.save)
        return kept.answers

    def _base_distribution(self, model: torch.nn.Module, run: Any) -> None:
        """On a fresh run (and with ``base="adapter_disabled"``, never read back) from the model;
        on resume the first kept copy whose arrays check out and whose key is this run's."""
        made_by = run.made_by(model)
        if run.reads_back:
            paths = [d / REPLAY_BASE for d in run.resume_dirs]
            vocab = logits_width(model)
            found = run.ranks.share_from_rank_zero(lambda: kept_base(self, paths, made_by, vocab))
            self.base, warning = base_to_resume(found, paths)
            if warning and run.writes:
                logger.warning("forgetwatch: %s", warning)
        else:
            with run.as_base(model):
                self.cache_base(model, run.tokenizer, pad_id(run.tokenizer), run.rows_per_batch(model), made_by)
        if run.writes:
            run.store.keep(REPLAY_BASE, self.base.save)  # kept with the run (and its checkpoints)

    def on_evaluation(self, report: TransitionReport, model: torch.nn.Module | None = None) -> None:
        """An evaluation was made: the draws follow its forgetting; uncovered forgetting is warned of."""
        self.reweigh(report)
        if self.coverage is not None:
            floor = {c: 2 * self.noise.get(c, 0.0) for c in self.coverage.uncovered}
            for category, loss in uncovered_losses(report, self.coverage, floor=floor).items():
                if category not in self.warned:
                    self.warned.add(category)
                    if self._run is None or self._run.writes:
                        logger.warning("forgetwatch: %s", uncovered_message(category, loss, self.coverage))

    def reweigh(self, report: TransitionReport | None) -> None:
        """The draws until the next evaluation: categories weighted by ``report``'s forgetting."""
        self.weights = category_weights(report, self.sampler.categories)

    def before_optimizer_step(
        self, model: torch.nn.Module, *, max_grad_norm: float | None = None, grad_scaler: tuple[Any, Any] | None = None
    ) -> None:
        """This step's replay gradient (see :meth:`step`), with the run's tokenizer and ranks."""
        run = self._run
        if run is None:
            raise RuntimeError("Replay.before_optimizer_step() before the run began: call watch.start() first")
        self.step(
            model,
            run.tokenizer,
            pad_id(run.tokenizer),
            max_grad_norm or 0.0,
            run.rows_per_batch(model),
            run.ranks,
            grad_scaler,
        )

    def refuse_sharded(self, model: torch.nn.Module, sharded: bool = False) -> None:
        """Replay cannot run under DeepSpeed ZeRO or FSDP (``sharded``): refused before any work."""
        if sharded or is_sharded(model):
            raise ValueError(
                "replay does not run on sharded models (DeepSpeed ZeRO, FSDP) yet: train without replay=, or under DDP"
            )

    def start(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        sharded: bool = False,
        warn: bool = True,
        answers: Mapping[str, Generated] | None = None,
    ) -> None:
        """Refuse what replay cannot run under (before any training: ``sharded``, a DeepSpeed
        ZeRO or FSDP run); tokenize the pool once, and refuse a pool with no row long enough to
        replay (rows shorter than two tokens teach nothing, nor a prompt the base answered with
        nothing: they are left out of the draws, :attr:`dropped` names them, and ``warn`` says
        how many, once). Prompt rows are their prompt and the base's ``answers`` (by row id;
        when not given, ``model`` answers them here, in this process alone)."""
        self.refuse_sharded(model, sharded)
        rows = list(self.pool)
        texts = [r for r in rows if r.prompt is None]
        tokens = dict(zip([r.id for r in texts], encode_rows(tokenizer, texts, self.max_length, keep=True)))
        self.starts = {}
        if len(texts) < len(rows):
            prompt_ids = self.pool.prompt_ids(tokenizer)
            if answers is None:
                answers = answer_prompts(model, tokenizer, self.pool, prompt_ids, Ranks.alone(), 8)
            for pid, ids in prompt_ids.items():
                tokens[pid], self.starts[pid] = answered_row(ids, answers[pid], model, tokenizer, self.max_length)
        usable = {pid: len(ids) > self.starts.get(pid, 1) for pid, ids in tokens.items()}  # some token to learn
        self.encoded = {r.id: tokens[r.id] for r in rows if usable[r.id]}
        self.dropped = [r.id for r in rows if not usable[r.id]]
        self.starts = {pid: s for pid, s in self.starts.items() if pid in self.encoded}
        if not self.encoded:
            raise ReplayPoolError(
                [
                    (
                        self.pool.source,
                        None,
                        None,
                        (
                            f"no row is longer than one token once tokenized ({len(rows)} row(s): "
                            f"{listing(map(shorten, self.dropped))}), so replay would train on nothing: a row teaches "
                            "from its second token on (a prompt row from its answer, and the base answered none); "
                            "give rows of some text, or train without replay="
                        ),
                    )
                ]
            )
        if self.dropped and warn:
            logger.warning(
                "forgetwatch: %d of the %d replay rows are shorter than two tokens once tokenized, or "
                "prompts the base answered with nothing, and teach nothing; they are left out of the draws (%s)",
                len(self.dropped),
                len(rows),
                listing(map(shorten, self.dropped)),
            )
        usable = self.pool.subset(self.encoded) if self.dropped else self.pool
        self.sampler = ReplaySampler(usable, self.seed, uniform=self.select == "uniform")
        if self.probe_categories is not None:
            self.coverage = coverage(usable.categories, self.probe_categories)
        self.reweigh(None)
        self.key = {"pool": self.pool.fingerprint(), "tokens": tokens_key(self.encoded, self.starts)}

    def cache_base(
        self, model: torch.nn.Module, tokenizer: Any, pad_id: int, rows_per_batch: int, made_by: Mapping[str, str]
    ) -> BaseDistribution:
        """With ``"kl"``: the model's (the base's) distribution on every row, kept for the run;
        ``made_by``: the model's keys (``model``, ``weights``), kept with it."""
        ids = list(self.encoded)
        key = {**self.key, "top_k": self.top_k, **made_by}
        self.base = base_distribution(
            model,
            tokenizer,
            ids,
            [self.encoded[i] for i in ids],
            pad_id,
            self.top_k,
            rows_per_batch,
            key,
            [self.starts.get(i, 1) for i in ids],
        )
        return self.base

    def resume(self, state: Mapping[str, Any], step: int) -> None:
        """Go on from a kept state (see :meth:`state`) at ``step``; a ``ValueError`` says why it
        cannot be this run's (see :func:`~forgetwatch.replay.kept.state_problem`). The weight
        is a setting: the one given now applies."""
        if problem := state_problem(self, state, step):
            raise ValueError(f"this replay state cannot be used: {problem}")
        self.sampler.load_state_dict(state["sampler"], max_drawn=step)
        self.tokens = state["tokens"]
        loss = state.get("loss", {"sum": 0.0, "steps": 0})  # since the last evaluation: its mean goes on
        self._loss_sum, self._steps = float(loss["sum"]), loss["steps"]
        self.warned = set(state.get("warned", []))
        self.reweigh(None)

    def step(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        pad_id: int,
        max_grad_norm: float,
        rows_per_batch: int,
        ranks: Ranks,
        scaled: tuple[Any, Any] | None = None,
    ) -> None:
        """Add this optimizer step's replay gradient (then clip the sum again, if clipping).
        ``scaled``: the trainer's enabled gradient scaler and the optimizer it steps (fp16).

        Never raises for a failure while replaying (a monitoring failure: out of memory, a
        model that refuses the rows, a fault of ours): that step goes on with the trainer's
        gradient, replay switches off for the rest of the run, and one warning says why
        (:meth:`_switch_off`). Calling it before :meth:`start` is a programming error, raised."""
        if not self.key:
            raise RuntimeError("Replay.step() before Replay.start(): start() tokenizes the pool when training begins")
        if self.weight == 0:
            return
        # one batch drawn per optimizer step, replayed or not: the draws depend only on the steps
        # and the evaluations, so a resume, or a state rebuilt from the history, draws the same rows
        drawn = [r.id for r in self.sampler.next_batch(self.batch_size, self.weights)]
        if self.off and ranks.size == 1:
            return
        if not self.off:
            self.tokens += sum(len(self.encoded[i]) for i in drawn)
        params = [p for p in model.parameters() if p.requires_grad]
        kept, failure = None, RuntimeError(self.off) if self.off else None
        if failure is None:
            try:
                if scaled is not None:
                    _unscale(*scaled)  # the trainer's gradient as the optimizer will take it, if not already
                if ranks.size > 1 or scaled is not None:  # set the trainer's gradient aside; the replay's alone
                    kept = [p.grad for p in params]
                    for p in params:
                        p.grad = torch.zeros_like(p)
                multiplier = float(scaled[0].get_scale()) if scaled is not None else self.weight
                loss, total = self._backward(model, drawn, pad_id, multiplier, rows_per_batch, ranks)
            except Exception as err:  # noqa: BLE001 - a replay failure must not end the training run
                failure = err
        # before the all-reduce, every rank says whether it failed (a rank already off says so
        # again): all of them replay this step, or none, and none waits for another forever
        if ranks.size > 1 and ranks.agree_max([int(failure is not None)])[0] and failure is None:
            failure = RuntimeError("replay failed on another rank")
        if failure is None:
            try:
                self._finish(params, kept, loss, total, multiplier, max_grad_norm, ranks, scaled)
                return
            except Exception as err:  # noqa: BLE001 - as above; the next step's agreement stops every rank
                failure = err
        if kept is not None:  # this step goes on with the trainer's gradient alone
            for p, g in zip(params, kept):
                p.grad = g
        elif max_grad_norm and max_grad_norm > 0 and not self.off:  # part of the replay gradient may be in
            torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], max_grad_norm)
        if not self.off:
            self._switch_off(failure, partial=kept is None)

    def _backward(
        self,
        model: torch.nn.Module,
        drawn: list[str],
        pad_id: int,
        multiplier: float,
        rows_per_batch: int,
        ranks: Ranks,
    ) -> tuple[float, int]:
        """This rank's share of the drawn rows' loss, backpropagated at ``multiplier``: the mean
        loss over its tokens, and the tokens of every rank's rows (what the mean is over)."""
        ids, starts = [self.encoded[i] for i in drawn], [self.starts.get(i, 1) for i in drawn]
        total = target_count(ids, starts)
        mine = slice(ranks.index, None, ranks.size)
        if self.loss == "kl":
            targets = [self.base.row(i) for i in drawn[mine]]
            loss = kl_backward(model, ids[mine], targets, pad_id, multiplier, rows_per_batch, total, starts[mine])
        else:
            loss = replay_backward(model, ids[mine], pad_id, multiplier, rows_per_batch, total, starts[mine])
        return loss, total

    def _finish(
        self,
        params: list[torch.nn.Parameter],
        kept: list[Any] | None,
        loss: float,
        total: int,
        multiplier: float,
        max_grad_norm: float,
        ranks: Ranks,
        scaled: tuple[Any, Any] | None,
    ) -> None:
        """Sum the replay gradient over the ranks, unscale it, add the trainer's back, clip."""
        if ranks.size > 1:  # summed over the ranks, like DDP's for the trainer's own
            summed = torch.tensor([0.0 if math.isnan(loss) else loss * total], dtype=torch.float64, device=ranks.device)
            ranks.sum_tensors([p.grad for p in params] + [summed])
            loss = float(summed) / total
        if scaled is not None:
            replayed = [p.grad for p in params]
            for g in replayed:
                g.mul_(self.weight / multiplier)
            if not bool(torch.stack([torch.isfinite(g).all() for g in replayed]).all()):
                for p, g in zip(params, kept):  # this step goes on with the trainer's gradient alone
                    p.grad = g
                self._overflow(multiplier)
                return
        if kept is not None:
            for p, g in zip(params, kept):
                if g is not None:
                    p.grad.add_(g)
        if max_grad_norm and max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], max_grad_norm)
        if math.isfinite(loss):
            self._loss_sum += loss
            self._steps += 1

    def _switch_off(self, failure: BaseException, partial: bool) -> None:
        """Replay stops for the rest of the run, said once. Not retried at the next step: what
        failed (memory, the model, our code) would most likely fail again for the same rows
        and settings, each time at a cost; a run whose replay stopped at a known point reads
        more plainly than one that replays now and then. A resume starts it again."""
        self.off = f"{type(failure).__name__}: {first_line(failure)}"
        step = (
            "this step's gradient may hold part of the replay gradient"
            if partial
            else "this step went on with the trainer's gradient alone"
        )
        logger.warning(
            "forgetwatch: replay failed (%s) and is switched off for the rest of this run; training "
            "goes on without it (%s), and replay/weight is no longer logged. Resuming from a checkpoint "
            "starts replay again (a smaller replay batch_size if memory ran out)",
            self.off,
            step,
            exc_info=failure,
        )

    def _overflow(self, scale: float) -> None:
        self._overflows += 1
        if self._overflows == 1 or self._overflows % 100 == 0:
            logger.warning(
                "forgetwatch: the replay gradient overflowed at fp16's gradient scale %g and was "
                "left out of this optimizer step (%d step(s) so far); a smaller replay weight or a "
                "smaller initial scale avoids it",
                scale,
                self._overflows,
            )

    def metrics(self) -> dict[str, float]:
        """Since the last call: the mean replay loss, the weight and the replay tokens so far.
        Nothing that does not apply (no weight once replay is switched off and nothing was
        replayed since)."""
        out = {"replay/weight": self.weight, "replay/tokens": float(self.tokens)} if self._steps or not self.off else {}
        if self._steps:
            out["replay/loss"] = self._loss_sum / self._steps
        self._loss_sum, self._steps = 0.0, 0
        return out

    def state_of(self, sampler: ReplaySampler, weight: float, batch_size: int, tokens: int) -> dict[str, Any]:
        """A state of this replay with these draws (see :meth:`state`)."""
        return {
            "select": self.select,
            "sampler": sampler.state_dict(),
            "weight": weight,
            "batch_size": batch_size,
            "tokens": tokens,
            "key": dict(self.key),
        }

    def state(self) -> dict[str, Any]:
        """What a resumed run needs (kept in the checkpoint's ``replay.json`` and in each history
        record, as it is after the evaluation): the draws, the weight and batch size they are made
        with, the replay tokens so far, the key of the pool and its tokens, and between evaluations
        the replay loss summed since the last one."""
        state = self.state_of(self.sampler, self.weight, self.batch_size, self.tokens)
        if self.warned:
            state["warned"] = sorted(self.warned)
        if self._steps:  # between evaluations: replay/loss is the mean over all the steps since the last
            state["loss"] = {"sum": self._loss_sum, "steps": self._steps}
        return state


def _unscale(scaler: Any, optimizer: Any) -> None:
    """Unscale the optimizer's gradients now unless already done this step (transformers does it
    when it clips or measures the gradient norm); the scaler then skips it at its step."""
    try:
        scaler.unscale_(optimizer)
    except RuntimeError as err:
        if "already been called" not in str(err):
            raise
