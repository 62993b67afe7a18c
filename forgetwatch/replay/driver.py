"""Replay during a run: before each optimizer step, a batch of pool rows chosen by the forgetting
measured at the last evaluation adds its weighted loss gradient to the trainer's.

Where: transformers clips gradients before ``on_pre_optimizer_step``, so the replay gradient
is added there and, when ``max_grad_norm`` is set, the sum is clipped again: the clip sees the
replay gradient too. Every rank draws the same rows (the draws are seeded), replays its share
of them, and the replay gradient is summed over the ranks (an all-reduce, like DDP's for the
trainer's own): the same on every rank, so parameters stay identical. Under fp16's gradient
scaler the replay loss is backpropagated at the scaler's scale (half-precision gradients would
underflow otherwise), then unscaled and weighted; a replay gradient that overflowed is left out
of that step (the trainer's own is not touched). Sharded models (DeepSpeed ZeRO-3, FSDP) are
refused when training begins: their gradients are not plain tensors here.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from forgetwatch.common.distributed import Ranks
from forgetwatch.common.text import first_line, listing, shorten
from forgetwatch.config.settings import ReplaySettings
from forgetwatch.replay.base_cache import BaseDistribution, base_distribution
from forgetwatch.replay.controller import START, Controller, reach_message
from forgetwatch.replay.coverage import (
    Coverage,
    coverage,
    covered_forgetting,
    spill_over,
    steering_note,
    uncovered_losses,
    uncovered_message,
)
from forgetwatch.replay.penalty import encode_rows, kl_backward, replay_backward, target_count
from forgetwatch.replay.pool import ReplayPool, ReplayPoolError
from forgetwatch.replay.resume import state_problem, tokens_key
from forgetwatch.replay.sampler import ReplaySampler, RowSampler, category_weights
from forgetwatch.replay.scan import (
    ScanBase,
    decode_increase,
    encode_increase,
    row_losses,
    row_probabilities,
    sample_key,
    scan_sample,
)
from forgetwatch.replay.synthetic import answer_prompts
from forgetwatch.results.report import TransitionReport
from forgetwatch.scoring.borrow import is_sharded
from forgetwatch.scoring.generation import Generated, answered_row
from forgetwatch.scoring.next_tokens import MeasureFailed
from forgetwatch.scoring.scorer import pad_id

__all__ = ["Replay"]

logger = logging.getLogger("forgetwatch")


class Replay:
    """The replay of one run: which rows, how much, and what it cost so far. A repair method
    (:class:`~forgetwatch.run.repair.Repair`): the run calls :meth:`begin`, :meth:`on_evaluation`
    and :meth:`before_optimizer_step`.

    Args:
        pool: the rows (checked disjoint from the probes when the run is built).
        settings: how much, how many rows, which loss and how rows are drawn (a
            :class:`~forgetwatch.ReplaySettings`; ``weight="auto"`` steers toward ``target`` by
            :class:`~forgetwatch.replay.controller.Controller`, on the run's stop metric over the
            probe categories the pool covers (:mod:`~forgetwatch.replay.coverage`);
            ``select="rows"`` draws by each row's loss rise, see :mod:`~forgetwatch.replay.scan`).
        max_length: tokens kept of a row.

    Example:
        >>> replay = Replay(pool, ReplaySettings(weight=0.5))       # doctest: +SKIP
        >>> replay.start(model, tokenizer)                            # doctest: +SKIP
        >>> replay.step(model, tokenizer, pad_id, 1.0, 8, Ranks.alone())  # doctest: +SKIP
    """

    name = "replay"

    def __init__(self, pool: ReplayPool, settings: ReplaySettings | None = None, *, max_length: int = 512):
        s = self.settings = settings or ReplaySettings()
        self.auto = s.weight == "auto"
        self.weight = START if self.auto else float(s.weight)
        self.pool, self.batch_size, self.max_length, self.seed = pool, s.batch_size, max_length, s.seed
        self.target, self.loss, self.top_k, self.select = s.target, s.loss, s.top_k, s.select
        self.controller = Controller(s.target, START) if self.auto else None
        # the pool's rows are scanned at each evaluation to draw by them, or to know the controller's reach
        self.scans = self.select == "rows" or self.auto
        self.scan_ids: list[str] = []  # the rows scanned (and, with select "rows", replayed)
        self.probe_categories: list[str] | None = None  # once the run is built
        self.coverage: Coverage | None = None  # which probe categories the pool covers
        self.warned: set[str] = set()  # uncovered categories warned of (once per run)
        self.noise: dict[str, float] = {}  # the base's noise floors by scope, once the run begins
        self._spills: list[Any] = []
        self.metric = "forgetting"  # the run's stop metric, once it begins
        self.encoded: dict[str, list[int]] = {}  # token ids by row id, once (rows too short dropped)
        self.starts: dict[str, int] = {}  # each row's first target token, where not 1
        self.tokens = 0  # replay tokens forwarded so far (every rank's rows)
        self.scan_base: ScanBase | None = None  # when it scans: the base's loss on the scanned rows
        self.increase: np.ndarray | None = None  # when it scans: each scanned row's loss rise (float32)
        self._used = self.weight  # the weight used since the last evaluation (logged with it)
        self._scan_seconds: float | None = None
        self.scan_off: str | None = None  # why the scans stopped for the rest of the run, once they did
        self.dropped: list[str] = []  # ids of the rows too short to replay
        self.key: dict[str, str] = {}  # the pool and its tokens, which kept states must match
        self.base: BaseDistribution | None = None  # with "kl": the base model's distribution on the rows
        self.sampler = ReplaySampler(pool, self.seed)
        self.weights = category_weights(None, pool.categories)
        self.off: str | None = None  # why replay stopped for the rest of the run, once it did
        self._loss_sum, self._steps, self._overflows = 0.0, 0, 0
        self._run: Any = None  # the RunContext of the run begun

    def begin(self, model: torch.nn.Module, run: Any) -> None:
        """Training begins or resumes (see :func:`~forgetwatch.replay.begin.begin`)."""
        from forgetwatch.replay.begin import begin

        self._run = run
        begin(self, model, run)

    def hold_out(self, probes: Any) -> None:
        """A pool row holding a probe's question is refused (see :meth:`ReplayPool.check_disjoint`)."""
        self.pool.check_disjoint(probes)
        self.probe_categories = list(probes.categories)

    def on_evaluation(self, report: TransitionReport, model: torch.nn.Module | None = None) -> None:
        """An evaluation was made: with ``select="rows"`` or ``"auto"``, the scanned rows' losses
        measured on ``model`` (monitoring time, on every rank); then the draws and the weight
        adjusted, uncovered forgetting warned of, spill-over noted."""
        self._used = self.weight
        if self.scans and model is not None and self.scan_off is None:  # every rank alike: replay's own state aside
            self.scan(model)
        self.reweigh(report)
        if self.coverage is not None:
            self._warn_uncovered(report)
            self._spills = spill_over(report, self.coverage)

    def _warn_uncovered(self, report: TransitionReport) -> None:
        """Once per category per run: forgetting replay cannot repair, for want of its rows."""
        floor = {c: max(self.target or 0.0, 2 * self.noise.get(c, 0.0)) for c in self.coverage.uncovered}
        for category, loss in uncovered_losses(report, self.coverage, floor=floor).items():
            if category not in self.warned:
                self.warned.add(category)
                if self._run is None or self._run.writes:
                    logger.warning("forgetwatch: %s", uncovered_message(category, loss, self.coverage, self.auto))

    def notes(self) -> list[str]:
        """What the console line says of replay at this evaluation: the ``"auto"`` weight and
        whether it is at its reach, and behaviour that spills from replayed categories."""
        out = [self.controller.note()] if self.controller is not None else []
        return out + [s.note() for s in self._spills]

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
        usable = (
            self.pool
            if not self.dropped
            else ReplayPool([r for r in rows if r.id in self.encoded], self.pool.source, self.pool.answering)
        )
        self.sampler = self.new_sampler(usable)
        self.scan_ids = [r.id for r in self.sampler.rows] if isinstance(self.sampler, RowSampler) else []
        if self.scans and not self.scan_ids:  # "auto" over categories: the same seeded sample, scanned only
            self.scan_ids = [usable[int(i)].id for i in scan_sample(len(usable), self.settings.scan_rows, self.seed)]
        self.increase = np.zeros(len(self.scan_ids), np.float32) if self.scans else None
        if self.probe_categories is not None:  # what is replayed: with "rows", the scanned rows alone
            replayed = self.sampler.rows if isinstance(self.sampler, RowSampler) else usable
            self.coverage = coverage({r.category for r in replayed}, self.probe_categories)
            if self.auto and warn and (note := steering_note(self.coverage)):
                logger.warning("forgetwatch: %s", note)
        self.reweigh(None)
        self.key = {"pool": self.pool.fingerprint(), "tokens": tokens_key(self.encoded, self.starts)}

    def new_sampler(self, usable: ReplayPool) -> ReplaySampler | RowSampler:
        """A sampler of ``usable`` rows, at its first draw, for this replay's ``select``."""
        if self.select == "rows":
            return RowSampler(usable, scan_sample(len(usable), self.settings.scan_rows, self.seed), self.seed)
        return ReplaySampler(usable, self.seed, uniform=self.select == "uniform")

    @property
    def scanned(self) -> list[str]:
        """The ids of the rows scanned at each evaluation (none unless :attr:`scans`)."""
        return self.scan_ids if self.scans else []

    def scan_losses(self, model: torch.nn.Module) -> np.ndarray:
        """The scanned rows' mean loss per target token on ``model`` (every rank, sharded)."""
        run, ids = self._run, self.scanned
        return row_losses(
            model,
            [self.encoded[i] for i in ids],
            [self.starts.get(i, 1) for i in ids],
            pad_id(run.tokenizer),
            run.rows_per_batch(model),
            run.ranks,
            run.tokenizer,
        )

    def scan(self, model: torch.nn.Module) -> None:
        """Measure the scanned rows now against the base: their loss rises, for the draws. A
        row whose loss is not a finite number counts as risen by 0; a failure (on any rank)
        stops the scans for the rest of the run with one warning, the last rises kept."""
        began = time.perf_counter()  # what the scan costs, logged (monitoring time either way)
        try:
            now = self.scan_losses(model)
        except MeasureFailed as err:
            self.scan_off = str(err)
            if self._run is None or self._run.writes:
                logger.warning(
                    "forgetwatch: the replay pool's scan failed (%s) and stops for the rest of this run: the "
                    "draws keep the last rises measured%s; training goes on",
                    err,
                    ', and replay_weight="auto" no longer judges its reach' if self.auto else "",
                )
            return
        rise = now - np.asarray(self.scan_base.base_loss)
        self.increase = np.where(np.isfinite(rise), rise, 0.0).astype(np.float32)
        self._scan_seconds = time.perf_counter() - began

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
        """Go on from a kept state (see :meth:`state`) at ``step``; a ``ValueError`` says why
        it cannot be this run's (see :func:`~forgetwatch.replay.resume.state_problem`)."""
        if problem := state_problem(self, state, step):
            raise ValueError(f"this replay state cannot be used: {problem}")
        self.sampler.load_state_dict(state["sampler"], max_drawn=step)
        if self.auto:  # a fixed weight is a setting, and the one given now applies
            self.weight = self._used = float(state["weight"])
            self.controller.load_state_dict(state.get("controller", {"weight": self.weight}))
        self.tokens = state.get("tokens", 0)
        loss = state.get("loss", {"sum": 0.0, "steps": 0})  # since the last evaluation: its mean goes on
        self._loss_sum, self._steps = float(loss["sum"]), loss["steps"]
        self.warned = set(state.get("warned", []))
        if self.scans:  # an earlier release's "auto" state has no scan: its rises start at 0
            scan = state.get("scan")
            self.increase = (
                decode_increase(scan["increase"], len(self.scanned))
                if scan is not None
                else np.zeros(len(self.scanned), np.float32)
            )
        self.reweigh(None, steer=False)

    def reweigh(self, report: TransitionReport | None, steer: bool = True) -> None:
        """The draws until the next evaluation: categories weighted by this evaluation's
        forgetting, or rows by their loss rise (``select="rows"``); with ``"auto"`` and
        ``steer``, the weight steered by it too (a resume restores the weight instead)."""
        if self.select == "rows":
            self.weights = row_probabilities(self.increase.astype(np.float64))
        else:
            self.weights = category_weights(report, self.sampler.categories)
        if self.auto and steer and report is not None:
            covered = (
                covered_forgetting(report, self.coverage, self.metric)
                if self.coverage is not None
                else getattr(report, self.metric)
            )
            drift = self.drift if self._scan_seconds is not None else None  # measured at this evaluation
            self.weight = self.controller.update(covered, drift)
            if self.controller.first_hold and (self._run is None or self._run.writes):
                logger.warning("forgetwatch: %s", reach_message(covered, drift))

    @property
    def drift(self) -> float:
        """The scanned rows' mean loss rise over the base (nats per token; a fall counts as none)."""
        return float(np.maximum(self.increase, 0).mean())

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
            "starts replay again (a smaller replay_batch_size if memory ran out)",
            self.off,
            step,
            exc_info=failure,
        )

    def _overflow(self, scale: float) -> None:
        self._overflows += 1
        if self._overflows == 1 or self._overflows % 100 == 0:
            logger.warning(
                "forgetwatch: the replay gradient overflowed at fp16's gradient scale %g and was "
                "left out of this optimizer step (%d step(s) so far); a smaller replay_weight or a "
                "smaller initial scale avoids it",
                scale,
                self._overflows,
            )

    def metrics(self) -> dict[str, float]:
        """Since the last call: the mean replay loss and the weight used, the replay tokens so
        far and, when it scans (``select="rows"``, ``"auto"``), the scanned rows' mean loss rise (``replay/drift``,
        nats per token) and the scan's seconds. Nothing that does not apply (no weight once
        replay is switched off and nothing was replayed since)."""
        out = (
            {"replay/weight": float(self._used), "replay/tokens": float(self.tokens)}
            if self._steps or not self.off
            else {}
        )
        if self._steps:
            out["replay/loss"] = self._loss_sum / self._steps
        if self._scan_seconds is not None:
            out["replay/drift"] = self.drift
            out["replay/scan_seconds"] = self._scan_seconds
        for spill in self._spills:
            out[f"replay/spill/{spill.category}/{spill.share}"] = spill.rise
        self._loss_sum, self._steps, self._scan_seconds = 0.0, 0, None
        return out

    def state(self) -> dict[str, Any]:
        """What a resumed run needs (kept in the checkpoint's ``replay.json`` and in each history
        record, as it is after the evaluation): the draws, the weight and batch size they are made
        with, the replay tokens so far, when it scans the rows' loss rises, the key of the pool
        and its tokens, and between evaluations the replay loss summed since the last one."""
        state = {
            "version": 2,
            "select": self.select,
            "sampler": self.sampler.state_dict(),
            "weight": self.weight,
            "batch_size": self.batch_size,
            "tokens": self.tokens,
            "key": dict(self.key),
        }
        if self.scans:
            state["scan"] = {"sample": sample_key(self.scanned), "increase": encode_increase(self.increase)}
        if self.controller is not None:
            state["controller"] = self.controller.state_dict()
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
