"""Replay during a run: before each optimizer step, pool rows drawn by the forgetting at the last
evaluation add their weighted loss gradient to the trainer's (docs/replay.md says how and why)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal

import numpy as np
import torch
from pydantic import Field

from forgetwatch.common.text import first_line, listing, pct, shorten
from forgetwatch.config.settings import MAX_INT, Settings
from forgetwatch.replay import kept
from forgetwatch.replay.kept import REPLAY_ANSWERS, REPLAY_BASE, state_problem, tokens_key
from forgetwatch.replay.penalty import encode_rows, replay_backward, target_count
from forgetwatch.replay.rows import ReplayPoolError
from forgetwatch.replay.sampler import ReplaySampler, category_weights
from forgetwatch.replay.synthetic import KeptAnswers, answer_prompts
from forgetwatch.results.noise import noise_by_scope
from forgetwatch.results.report import TransitionReport
from forgetwatch.scoring.borrow import is_sharded
from forgetwatch.scoring.generation import Generated, answered_row
from forgetwatch.scoring.next_tokens import BaseDistribution, base_distribution
from forgetwatch.scoring.scorer import pad_id

logger = logging.getLogger("forgetwatch")


class ReplayOptions(Settings):
    """Replay's options, checked (in YAML and a framework's settings: ``replay_<name>``)."""

    loss: Literal["lm", "kl"] = "lm"
    weight: Annotated[float, Field(ge=0, le=kept.MAX_WEIGHT, allow_inf_nan=False)] = 1.0
    """How much the replay loss counts: a heavier one swamps the trainer's (1e30 makes NaN)."""
    select: Literal["categories", "uniform"] = "categories"
    batch_size: Annotated[int, Field(ge=1, le=1024)] = 8
    """Each row replayed costs a forward and a backward pass before every optimizer step."""
    top_k: Annotated[int, Field(ge=1, le=1024)] = 32
    """Each costs 6 bytes at every position of every replay row, kept all run: a few dozen carry nearly all of the
    base's probability."""
    seed: Annotated[int, Field(ge=0, le=MAX_INT)] = 0


#: Values a release before 0.1 took, and what to give instead.
RETIRED = {
    ("weight", "auto"): 'weight="auto" is retired: in its own benchmark it forgot more than a fixed weight '
    "(2.5 % vs 1.2 %); give a number, e.g. weight=1.0",
    ("select", "rows"): 'select="rows" is retired: drawing by category forgot fewer probes at every budget; '
    'use select="categories" (or "uniform")',
}


def checked_options(**given: Any) -> ReplayOptions:
    """Replay's options, checked: a ``ConfigError`` naming each bad one (a retired value: a ``ValueError``)."""
    for name, value in given.items():
        if isinstance(value, str) and (name, value) in RETIRED:
            raise ValueError(RETIRED[name, value])
    return ReplayOptions(**given)


def uncovered(
    report: TransitionReport,
    pool_categories: Iterable[str],
    probe_categories: Iterable[str],
    floor: Mapping[str, float],
) -> dict[str, str]:
    """A warning for each probe category no pool row names that forgot 2 probes or more, at a rate above its ``floor``
    (missing: 0); none unless some categories are covered and others not (general rows alone cover none)."""
    pool, probes = set(pool_categories), set(probe_categories)
    covered = sorted(pool & probes)
    out = {}
    for c in sorted(probes - pool) if covered else ():
        r, name = report.by_category.get(c), shorten(c)
        if r is not None and r.n > 0 and r.forgotten >= 2 and (rate := r.forgotten / r.n) > floor.get(c, 0.0):
            out[c] = (
                f"{r.forgotten} of the {r.n} {name} probes are forgotten ({pct(rate, digits=0)}), and the replay pool "
                f"has no {name} rows (it covers {listing(covered)}): replay cannot repair them; add rows of category "
                f"{name} to the pool"
            )
    return out


class Replay:
    """Replay of a pool while training: which rows, how much, and what it cost so far. A plug-in beside the
    watch, which changes training: the loop (or the trainer's callback) calls :meth:`begin` once the watch has
    started, :meth:`before_optimizer_step` at every step and :meth:`on_evaluation` after each evaluation; the watch
    keeps its figures and state (:meth:`~forgetwatch.Watch.keep`).

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

    name: str = "replay"
    #: the files it keeps in the run's folder
    files: tuple[str, ...] = (REPLAY_BASE, REPLAY_ANSWERS)

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
        self.loss, self.weight, self.select = o.loss, o.weight, o.select
        self.batch_size, self.top_k, self.seed = o.batch_size, o.top_k, o.seed
        self.pool, self.max_length = pool, max_length
        self.probe_categories: list[str] | None = None  # once the run is built
        self.covers: set[str] = set()  # the categories of the rows replayed
        self.warned: set[str] = set()  # uncovered categories warned of (once per run)
        self.floor: dict[str, float] = {}  # twice the base's noise floors, by scope: forgetting below is noise
        self.encoded: dict[str, list[int]] = {}  # token ids by row id (rows with nothing to learn left out)
        self.starts: dict[str, int] = {}  # each row's first target token, where not 1
        self.dropped: list[str] = []  # ids of the rows with nothing to learn
        self.key: dict[str, str] = {}  # the pool and its tokens, which kept states must match
        self.base: BaseDistribution | None = None  # with "kl": the base model's distribution on the rows
        self.sampler = ReplaySampler(pool, self.seed, uniform=self.select == "uniform")
        self.weights = category_weights(None, self.sampler.categories)
        self.tokens = 0  # replay tokens forwarded so far (every rank's rows)
        self.off: str | None = None  # why replay stopped for the rest of the run, once it did
        self._loss_sum, self._steps, self._overflows = 0.0, 0, 0
        self._run: Any = None  # the RunView of the run begun

    def hold_out(self, probes: Any) -> None:
        """A pool row holding a probe's question is refused (see :meth:`ReplayPool.check_disjoint`)."""
        self.pool.check_disjoint(probes)
        self.probe_categories = list(probes.categories)

    def begin(self, model: torch.nn.Module, run: Any) -> None:
        """Training begins or resumes (``run``: the watch's :class:`~forgetwatch.run.plugins.RunView`): the pool tokenized,
        the draws restored on resume, the base's distribution kept with ``"kl"``; what cannot serve is refused now."""
        if run.sharded or is_sharded(model):
            raise ValueError(
                "replay does not run on sharded models (DeepSpeed ZeRO, FSDP) yet: train without replay=, or under DDP"
            )
        self.floor = {scope: 2 * noise for scope, noise in noise_by_scope(dict(run.base_meta)).items()}
        self._tokenize(model, run)
        if run.step > 0:
            self._resume(run)
        self.weights = category_weights(run.last_report, self.sampler.categories)
        if self.loss == "kl":
            self._keep_base(model, run)
        self._run = run

    def _tokenize(self, model: torch.nn.Module, run: Any) -> None:
        """Token ids of every row; rows with nothing to learn are left out (said once); a pool of only those, refused."""
        rows = list(self.pool)
        texts = [r for r in rows if r.prompt is None]
        tokens = dict(zip([r.id for r in texts], encode_rows(run.tokenizer, texts, self.max_length)))
        starts = {}
        if len(texts) < len(rows):
            prompt_ids = self.pool.prompt_ids(run.tokenizer)
            answers = self._answers(model, run, prompt_ids)
            for pid, ids in prompt_ids.items():
                tokens[pid], starts[pid] = answered_row(ids, answers[pid], model, run.tokenizer, self.max_length)
        self.encoded = {r.id: tokens[r.id] for r in rows if len(tokens[r.id]) > starts.get(r.id, 1)}  # a token to learn
        self.dropped = [r.id for r in rows if r.id not in self.encoded]
        self.starts = {pid: s for pid, s in starts.items() if pid in self.encoded}
        if not self.encoded:
            message = (
                f"no row is longer than one token once tokenized ({len(rows)} row(s): "
                f"{listing(map(shorten, self.dropped))}), so replay would train on nothing: a row teaches "
                "from its second token on (a prompt row from its answer, and the base answered none); "
                "give rows of some text, or train without replay="
            )
            raise ReplayPoolError([(self.pool.source, None, None, message)])
        if self.dropped and run.writes:
            logger.warning(
                f"forgetwatch: {len(self.dropped)} of the {len(rows)} replay rows are shorter than two tokens once "
                "tokenized, or prompts the base answered with nothing, and teach nothing; they are left out of the "
                f"draws ({listing(map(shorten, self.dropped))})"
            )
        usable = [r for r in rows if r.id in self.encoded]
        self.sampler = ReplaySampler(usable, self.seed, uniform=self.select == "uniform")
        self.covers = {r.category for r in usable}
        self.key = {"pool": self.pool.fingerprint(), "tokens": tokens_key(self.encoded, self.starts)}

    def _answers(self, model: torch.nn.Module, run: Any, prompt_ids: dict[str, list[int]]) -> dict[str, Generated]:
        key = {"pool": self.pool.fingerprint(), "prompts": tokens_key(prompt_ids), **run.made_by(model)}

        def measure() -> KeptAnswers:
            began = time.perf_counter()
            answers = answer_prompts(model, run.tokenizer, self.pool, prompt_ids, run.ranks, run.rows_per_batch(model))
            if run.writes:
                seconds = time.perf_counter() - began
                said = f"the base answered {len(answers)} prompts in {seconds:.1f} s (kept in {REPLAY_ANSWERS})"
                logger.info("forgetwatch: replay: %s", said)
            return KeptAnswers(answers, key)

        def problem(answers: KeptAnswers, vocab: int) -> str | None:
            return answers.problem(vocab, list(prompt_ids))

        needs = "a pool of prompts replays the base model's answers to them"
        return kept.measured_once(run, model, REPLAY_ANSWERS, KeptAnswers, key, problem, needs, measure).answers

    def _keep_base(self, model: torch.nn.Module, run: Any) -> None:
        key = {**self.key, "top_k": self.top_k, **run.made_by(model)}
        ids = list(self.encoded)
        rows, starts = [self.encoded[i] for i in ids], [self.starts.get(i, 1) for i in ids]

        def problem(base: BaseDistribution, vocab: int) -> str | None:
            if base.ids != ids or np.diff(base.offsets).tolist() != [len(r) - s for r, s in zip(rows, starts)]:
                return "damaged: its rows or their lengths are not those of the tokenized pool"
            if len(base.top_ids) and (top := int(base.top_ids.max())) >= vocab:
                return f"damaged: a token id ({top}) is outside the model's vocabulary of {vocab}"
            return None

        def measure() -> BaseDistribution:
            pad, batch = pad_id(run.tokenizer), run.rows_per_batch(model)
            return base_distribution(model, run.tokenizer, ids, rows, pad, self.top_k, batch, key, starts)

        needs = 'loss="kl" needs the base model\'s distribution on the replay rows (or use loss="lm")'
        self.base = kept.measured_once(run, model, REPLAY_BASE, BaseDistribution, key, problem, needs, measure)

    def _resume(self, run: Any) -> None:
        """The draws at ``run.step``: given to ``load_state_dict()`` (a trainer's checkpoint keeps them), else
        rebuilt from the history (said)."""
        if (given := run.states.get(self.name)) is not None:
            if problem := state_problem(self, given, run.step):
                raise ValueError(f"the replay state given to load_state_dict() cannot be used: {problem}")
            return self._load(given)
        try:
            how = self._rebuild(run)
        except ValueError as err:
            raise kept.ReplayFileError(
                None,
                f"no replay state to resume step {run.step} with (the watch's state was not given); {err}. Resume "
                "from a checkpoint saved with forgetwatch's state, or train without replay=",
            ) from None
        if run.writes:
            logger.warning(
                f"forgetwatch: no replay state for step {run.step} (the watch's state was not given); rebuilt it {how} "
                "(the replay loss of the steps before the resume is not kept in the history: the next replay/loss is "
                "over the steps from here)"
            )

    def _rebuild(self, run: Any) -> str:
        """The draws at ``run.step`` rebuilt from the history, exactly, and how; else a ``ValueError`` saying why."""
        step, last = run.step, run.records[-1] if run.records else None
        self._load({"sampler": self.sampler.state_dict(), "tokens": 0})  # from the start, unless the history says
        if last is not None and "replay" not in last:
            return f"replay was not on at the last evaluation (step {last['step']}): its draws start afresh"
        since, weight, batch_size, report = 0, self.weight, self.batch_size, None
        how = (
            f"from the start of the run (no evaluation before step {step}), with this run's replay settings, "
            f"then the draws of its {step} step(s)"
        )
        if last is not None:
            since, saved = last["step"], last["replay"]
            if problem := state_problem(self, saved, since):
                raise ValueError(f"the history's replay state at step {since} cannot be used either: {problem}")
            self._load({**saved, "loss": {"sum": 0.0, "steps": 0}})
            weight, batch_size, report = saved["weight"], saved["batch_size"], run.last_report
            how = f"from the history's state at step {since}, then the draws of the {step - since} step(s) since"
        weights = category_weights(report, self.sampler.categories)
        for _ in range(step - since) if weight != 0 else ():
            self.tokens += sum(len(self.encoded[r.id]) for r in self.sampler.next_batch(batch_size, weights))
        return how

    def _load(self, state: dict[str, Any]) -> None:
        """Go on from a checked state (the weight is a setting: the one given now applies)."""
        self.sampler.load_state_dict(state["sampler"])
        self.tokens = state["tokens"]
        loss = state.get("loss", {"sum": 0.0, "steps": 0})  # since the last evaluation: its mean goes on
        self._loss_sum, self._steps = float(loss["sum"]), loss["steps"]
        self.warned = set(state.get("warned", []))

    def on_evaluation(self, report: TransitionReport, model: torch.nn.Module | None = None) -> None:
        """An evaluation was made: the draws follow its forgetting; uncovered forgetting is warned of."""
        self.weights = category_weights(report, self.sampler.categories)
        for category, message in uncovered(report, self.covers, self.probe_categories or (), self.floor).items():
            if category not in self.warned:
                self.warned.add(category)
                if self._run is None or self._run.writes:
                    logger.warning("forgetwatch: %s", message)

    def before_optimizer_step(
        self, model: torch.nn.Module, *, max_grad_norm: float | None = None, grad_scaler: tuple[Any, Any] | None = None
    ) -> None:
        """Add this step's replay gradient (then clip the sum again, if clipping); ``grad_scaler``: fp16's
        enabled scaler and the optimizer it steps. A failure while replaying never reaches the trainer:
        the step goes on with the trainer's gradient and replay is switched off, said once."""
        run = self._run
        if run is None:
            raise RuntimeError("Replay.before_optimizer_step() before the run began: call watch.start() first")
        if self.weight == 0:
            return
        # one batch drawn per optimizer step, replayed or not: a resume, or a state rebuilt from the
        # history, draws the same rows
        drawn = [r.id for r in self.sampler.next_batch(self.batch_size, self.weights)]
        ranks, scaled, max_grad_norm = run.ranks, grad_scaler, max_grad_norm or 0.0
        if self.off:  # a rank already off says so again at the agreement below: no rank waits for it forever
            if ranks.size > 1:
                ranks.agree_max([1])
            return
        self.tokens += sum(len(self.encoded[i]) for i in drawn)
        params = [p for p in model.parameters() if p.requires_grad]
        aside, failure = None, None
        try:
            if scaled is not None:  # the trainer's gradient as the optimizer will take it, if not already
                try:
                    scaled[0].unscale_(scaled[1])
                except RuntimeError as err:  # transformers unscales when it clips
                    if "already been called" not in str(err):
                        raise
            if ranks.size > 1 or scaled is not None:  # set the trainer's gradient aside; the replay's alone
                aside = [p.grad for p in params]
                for p in params:
                    p.grad = torch.zeros_like(p)
            multiplier = float(scaled[0].get_scale()) if scaled is not None else self.weight
            loss, total = self._backward(model, drawn, multiplier, run)
        except Exception as err:  # noqa: BLE001 - a replay failure must not end the training run
            failure = err
        # before the all-reduce, every rank says whether it failed: all of them replay this step, or none
        if ranks.size > 1 and ranks.agree_max([int(failure is not None)])[0] and failure is None:
            failure = RuntimeError("replay failed on another rank")
        if failure is None:
            try:  # the replay gradient summed over the ranks (like DDP's), unscaled, the trainer's added back, clipped
                if ranks.size > 1:
                    summed = torch.tensor(
                        [0.0 if math.isnan(loss) else loss * total], dtype=torch.float64, device=ranks.device
                    )
                    ranks.sum_tensors([p.grad for p in params] + [summed])
                    loss = float(summed) / total
                if scaled is not None:
                    for p in params:
                        p.grad.mul_(self.weight / multiplier)
                    if not bool(torch.stack([torch.isfinite(p.grad).all() for p in params]).all()):
                        for p, g in zip(params, aside):  # this step goes on with the trainer's gradient alone
                            p.grad = g
                        return self._overflow(multiplier)
                for p, g in zip(params, aside or ()):
                    if g is not None:
                        p.grad.add_(g)
                if max_grad_norm > 0:
                    torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], max_grad_norm)
                if math.isfinite(loss):
                    self._loss_sum += loss
                    self._steps += 1
                return
            except Exception as err:  # noqa: BLE001 - as above; the next step's agreement stops every rank
                failure = err
        if aside is not None:  # this step goes on with the trainer's gradient alone
            for p, g in zip(params, aside):
                p.grad = g
        elif max_grad_norm > 0:  # part of the replay gradient may be in
            torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], max_grad_norm)
        self._switch_off(failure, partial=aside is None)

    def _backward(self, model: torch.nn.Module, drawn: list[str], multiplier: float, run: Any) -> tuple[float, int]:
        """This rank's share of the rows backpropagated at ``multiplier``: its mean loss, every rank's tokens."""
        ids, starts = [self.encoded[i] for i in drawn], [self.starts.get(i, 1) for i in drawn]
        total = target_count(ids, starts)
        mine = slice(run.ranks.index, None, run.ranks.size)
        targets = [self.base.row(i) for i in drawn[mine]] if self.loss == "kl" else None
        pad, rows = pad_id(run.tokenizer), run.rows_per_batch(model)
        return replay_backward(model, ids[mine], pad, multiplier, rows, total, starts[mine], targets), total

    def _switch_off(self, failure: BaseException, partial: bool) -> None:
        """Replay stops for the rest of the run, said once (not retried: it would most likely fail again)."""
        self.off = f"{type(failure).__name__}: {first_line(failure)}"
        step = (
            "its gradient may hold part of the replay's" if partial else "it went on with the trainer's gradient alone"
        )
        logger.warning(
            f"forgetwatch: replay failed ({self.off}) and is switched off for the rest of this run; training goes on "
            f"without it (this step: {step}), and replay/weight is no longer logged. Resuming from a checkpoint starts "
            "replay again (a smaller replay batch_size if memory ran out)",
            exc_info=failure,
        )

    def _overflow(self, scale: float) -> None:
        self._overflows += 1
        if self._overflows == 1 or self._overflows % 100 == 0:
            logger.warning(
                f"forgetwatch: the replay gradient overflowed at fp16's gradient scale {scale:g} and was left out of "
                f"this optimizer step ({self._overflows} step(s) so far); a smaller replay weight or a smaller initial "
                "scale avoids it"
            )

    def metrics(self) -> dict[str, float]:
        """Since the last call: the mean replay loss, the weight and the tokens so far (none once switched off and idle)."""
        out = {"replay/weight": self.weight, "replay/tokens": float(self.tokens)} if self._steps or not self.off else {}
        if self._steps:
            out["replay/loss"] = self._loss_sum / self._steps
        self._loss_sum, self._steps = 0.0, 0
        return out

    def state(self) -> dict[str, Any]:
        """What a resumed run needs (in the watch's state and each history record)."""
        state = {
            "select": self.select,
            "sampler": self.sampler.state_dict(),
            "weight": self.weight,
            "batch_size": self.batch_size,
            "tokens": self.tokens,
            "key": dict(self.key),
        }
        if self.warned:
            state["warned"] = sorted(self.warned)
        if self._steps:  # between evaluations: replay/loss is the mean over all the steps since the last
            state["loss"] = {"sum": self._loss_sum, "steps": self._steps}
        return state
