"""Watch: the monitor without a trainer; any training loop drives it. It only watches: what changes training
(replay) or makes new weights (a merge) is a plug-in beside it, which the loop calls (forgetwatch.run.plugins)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import logging
import math
import numbers
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, NonNegativeInt, ValidationError

from forgetwatch.behaviour.drift import token_counter
from forgetwatch.common import strict_json
from forgetwatch.common.distributed import Ranks
from forgetwatch.common.text import pct
from forgetwatch.config import ADAPTER_DISABLED, ForgetWatchConfig, checked_keywords
from forgetwatch.config.settings import Monitor, Output, Scoring
from forgetwatch.probes import ProbeSet, ProbesLike, as_probe_set
from forgetwatch.probes.lm_eval_tasks import LmEvalProbes
from forgetwatch.results.answers import Answers
from forgetwatch.results.events import BaseSnapshot, Ending, Evaluation
from forgetwatch.results.metrics import compare
from forgetwatch.results.noise import measure_noise, noise_by_scope, wants_noise_check
from forgetwatch.results.report import TransitionReport
from forgetwatch.results.trajectory import Trajectory, with_trajectory_metrics
from forgetwatch.run.base import adapters_disabled, model_key, weights_key
from forgetwatch.run.plugins import Kept, RunView
from forgetwatch.run.schedule import Budget, EverySteps
from forgetwatch.run.stopping import StopRule
from forgetwatch.run.train_kl import MIN_SECONDS, SHARE, RowsLike, TrainKL
from forgetwatch.scoring import NonFiniteScoresError, Scorer
from forgetwatch.scoring.borrow import is_reduced
from forgetwatch.sinks import SINK_SECONDS, HistoryFile, Sinks, as_sink
from forgetwatch.sinks.logged import PREFIX, ConsoleLines, evaluation_metrics, logged_categories
from forgetwatch.store import HISTORY, SNAPSHOT
from forgetwatch.store.read import Run, stored_base
from forgetwatch.store.write import RunStore

__all__ = ["Watch"]

logger = logging.getLogger("forgetwatch")


class _State(BaseModel):
    """:meth:`Watch.state_dict`'s shape, checked on load."""

    model_config = ConfigDict(extra="forbid", strict=True)
    format: Literal["forgetwatch.watch"]
    version: Literal[3]
    step: NonNegativeInt
    evaluations: NonNegativeInt = 0  # how many the history holds up to ``step``
    schedule: dict[str, float | int | None] = {}
    streaks: dict[str, NonNegativeInt] = {}
    base: dict[str, str | None] = {}  # the base snapshot's keys: the one in the run directory must have them
    plugins: dict[str, dict[str, Any]] = {}


def _seconds(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    return float(value) if ok else None


def failure(err: Exception) -> tuple[str, Exception | None]:
    """A scoring failure's warning and traceback: none for NaN outputs (the model's fault), else the whole one."""
    if isinstance(err, NonFiniteScoresError):
        return str(err), None
    return f"scoring failed ({type(err).__name__}: {err})", err


class Watch:
    """Measure per-sample forgetting on a probe set while any training loop runs.

    The base's answers are scored (or loaded) once at :meth:`start`; :meth:`evaluate` re-scores the live model
    whenever :meth:`due` says so, hands the result to every sink and says whether to stop. In a distributed run
    every rank calls every method at the same steps.

    Args:
        probes: a :class:`~forgetwatch.ProbeSet`, a probe JSONL file, or a list of probe rows.
        eval_steps: evaluate every N steps (default ``None``: as often as ``Monitor.max_overhead`` of wall time allows).
        max_forgetting: stop once the forgetting rate exceeds this (default ``None``: never).
        output_dir: where the snapshot and ``history.jsonl`` live (required here or at :meth:`start`).
        base: base answers (an :class:`~forgetwatch.Answers` or its file) instead of scoring the model at the start,
            or ``"adapter_disabled"`` for a PEFT model's adapters off.
        scoring: how probes are scored (a :class:`~forgetwatch.Scoring`; default its defaults).
        monitor: when else to evaluate, what else to measure, when to stop (a :class:`~forgetwatch.Monitor`).
        output: where results go, how much is logged (an :class:`~forgetwatch.Output`).
        sinks: more places each evaluation goes (see :mod:`forgetwatch.sinks`), or functions ``f(report, step)``; on
            rank 0 unless a sink's ``all_ranks`` is true. They get copies, and a call busy past :attr:`sink_seconds`
            (default 300) drops the sink, with a warning.
        clock: what the schedule and ``monitoring_seconds`` read (default ``time.perf_counter``).

    Attributes:
        refusal_detector: ``callable(response) -> bool`` for behaviour probes' ``refuses``
            (default: a phrase detector); set it before :meth:`start`.

    Replay and merging are plug-ins beside it, which the loop calls (docs/watch.md); :meth:`keep` keeps a plug-in's
    figures and state with the run.

    Example:
        >>> watch = Watch(probes, output_dir="run/forgetwatch", eval_steps=50, max_forgetting=0.1)  # doctest: +SKIP
        >>> watch.start(model, tokenizer)                                     # doctest: +SKIP
        >>> for step, batch in enumerate(loader, 1):                          # doctest: +SKIP
        ...     train_step(batch)
        ...     if watch.due(step) and watch.evaluate(model, step).stop:
        ...         break
        >>> watch.finish(model, step)                                         # doctest: +SKIP
    """

    #: how long one call of a user's sink may take before the sink is dropped; read at every call (``None``: no bound)
    sink_seconds: float | None = SINK_SECONDS

    @checked_keywords
    def __init__(
        self,
        probes: ProbesLike | None = None,
        *,
        eval_steps: int | None = None,
        max_forgetting: float | None = None,
        output_dir: str | os.PathLike[str] | None = None,
        base: Answers | str | os.PathLike[str] | None = None,
        scoring: Scoring | None = None,
        monitor: Monitor | None = None,
        output: Output | None = None,
        sinks: Iterable[Any] = (),
        clock: Callable[[], float] = time.perf_counter,
    ):
        config = ForgetWatchConfig(
            probes=probes if isinstance(probes, (str, os.PathLike, LmEvalProbes)) else None,  # a file's: kept
            base=None if isinstance(base, Answers) else base,
            eval_steps=eval_steps,
            max_forgetting=max_forgetting,
            output_dir=output_dir,
            scoring=scoring or Scoring(),
            monitor=monitor or Monitor(),
            output=output or Output(),
        )
        if probes is None:
            raise ValueError("forgetwatch needs probes: a ProbeSet, a probe file path or a list of probe rows")
        # a bad probe file fails here, before any training
        self.probes: ProbeSet = as_probe_set(probes, source="probes=[...]")
        config.check_categories(self.probes.categories)
        self.config = config
        self.refusal_detector: Callable[[str], bool] | None = None
        self.base_answers: Answers | None = None
        self.history: list[tuple[int, TransitionReport]] = []
        self.trajectory: Trajectory | None = None
        self.stop_reason: str | None = None
        self.monitoring_seconds = 0.0
        self._their_sinks = [as_sink(s) for s in sinks]
        self._base_given: Answers | str | None = base if isinstance(base, Answers) else config.base
        self._clock = clock
        self._kept: list[Kept] = []  # plug-ins whose figures and state are kept with the run
        self._store: RunStore | None = None
        self._ranks = Ranks()
        self._schedule: EverySteps | Budget = self._new_schedule()
        self._view: RunView | None = None
        self._ending: Ending | None = None  # what a plug-in found when training ended (a merge), told to the watch
        self._stop_rule: StopRule | None = None
        self._step = 0  # the last step the loop told us of
        self._loaded: dict[str, Any] | None = None  # a state_dict to resume from at start()
        self._max_steps: int | None = None  # the run's length, until the budget's first projection is checked
        self._their_probes: ProbeSet | None = None  # the user's sinks' copy of the probes

    # -- what a loop calls ----------------------------------------------------------------------

    def start(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        step: int | None = None,
        output_dir: str | os.PathLike[str] | None = None,
        max_steps: int | None = None,
        train_rows: RowsLike | None = None,
    ) -> BaseSnapshot:
        """Training begins (or resumes, when ``step`` > 0 or a :meth:`load_state_dict` came first): the
        base snapshot, scored or loaded; on resume the history up to ``step``. Call it on every rank; what
        cannot work (a probe this model cannot score, an unwritable folder) raises here, before training.

        Args:
            step: the step training begins at (default: the loaded state's, else 0).
            output_dir: where the run's files go, when not given to the constructor.
            max_steps: the run's length, if known (to warn when the budget allows no evaluation).
            train_rows: training rows to measure ``forgetwatch/drift/train_kl`` on: token-id lists, or
                ``(token_ids, start)`` pairs measured from ``start`` on. Give the same rows on resume.
        """
        return self._start(model, tokenizer, step, output_dir, max_steps, train_rows)

    def _start(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        step: int | None = None,
        output_dir: str | os.PathLike[str] | None = None,
        max_steps: int | None = None,
        train_rows: RowsLike | None = None,
        *,  # what a trainer's adapter knows besides
        sinks: Sequence[Any] = (),
        sharded: bool = False,
        stop_note: Callable[[int], str] = lambda step: "",
        origin: Path | None = None,  # the run directory the resumed checkpoint was saved from
    ) -> BaseSnapshot:
        began = self._clock()
        self._prepare(model, tokenizer, output_dir)
        loaded, step = self._resumed(step)
        # rank 0 takes the directory (or every rank raises here, before any work), cleans it of what a kill -9
        # left half-written, and sets an earlier run's files aside
        aside = self._ranks.share_from_rank_zero(lambda: self._claim(fresh=step == 0, origin=origin))
        try:
            # a watch may serve several runs (train() calls), each from its own state; _last: this run's last
            # evaluation, _skipped: a step whose weights failed to score
            self.history, self.stop_reason, self._finished, self._ending = [], None, False, None
            self._schedule = self._new_schedule()
            self._step, self._max_steps, self._began_at, self._last, self._skipped = step, max_steps, step, None, None
            self.base_answers, cost = self._base(model, step, loaded.get("base", {}), Path(aside) if aside else None)
            self.trajectory = Trajectory.start(self.base_answers)
            snapshot = self._open_sinks(sinks, stop_note, step, computed=cost is not None)
            records = self._restore_history(step, loaded) if step > 0 else []
            self._view = RunView(
                ranks=self._ranks,
                scorer=self._scorer,
                store=self._store,
                base_answers=self.base_answers,
                step=step,
                records=records,
                last_report=self.history[-1][1] if self.history else None,
                base=self._base_given,
                states=loaded.get("plugins") or {},
                sharded=sharded,
                tell=self._told,
            )
            scoring = cost if cost is not None else _seconds(self.base_answers.meta.get("scoring_seconds"))
            train_kl_cost = self._begin_train_kl(model, train_rows, scoring)
            if self._writes:
                if step == 0:
                    self._store.save_history([])
                self._store.save_probes(self.probes)
            # all of the start-up counts against the budget; an evaluation will cost about a scoring of the probes
            # and a forward over train KL's rows (unknown for loaded answers that do not say what scoring took)
            self.monitoring_seconds = self._clock() - began
            self._schedule.start(step, self.monitoring_seconds, None if scoring is None else scoring + train_kl_cost)
            self._schedule.load_state_dict(loaded.get("schedule", {}))
            return snapshot
        except BaseException:
            self._store.release()  # a run that did not start holds no directory
            raise

    def _resumed(self, step: int | None) -> tuple[dict[str, Any], int]:
        """The state :meth:`load_state_dict` gave (rank 0's, for every rank; ``{}``: none), and the step to start at."""
        loaded = self._ranks.share_from_rank_zero(lambda: self._loaded) or {}
        self._loaded = None
        step = loaded.get("step", 0) if step is None else step
        if loaded and loaded["step"] != step:
            raise ValueError(
                f"Watch.start(step={step}): the state given to load_state_dict() is of step {loaded['step']}; load "
                "the state saved with the checkpoint training resumes from"
            )
        if step > 0 and not loaded and self._writes:
            logger.warning(
                f"forgetwatch: resuming at step {step} without a forgetwatch state (a checkpoint saved without it, or "
                f"no load_state_dict()): going on from the history in {self._store.dir}, cut at step {step}"
            )
        return loaded, step

    def _prepare(self, model: torch.nn.Module, tokenizer: Any, output_dir: str | os.PathLike[str] | None) -> None:
        """The settings checked again, the scorer for this model (a probe it cannot score fails here), the store."""
        self._ranks = Ranks.all()
        # rank 0 writes, and reads what a resume needs for all ranks (so nodes need not share storage)
        self._writes = self._ranks.index == 0
        c = self.config
        c.check_categories(self.probes.categories)
        self.probes = self.probes.with_groups(c.output.category_map)  # kept in probes.jsonl, for the report
        groups = [p.category_group for p in self.probes]  # each probe's category group, where they have groups
        self._groups = groups if groups != [p.category for p in self.probes] else None
        directory = c.output_dir or output_dir
        if directory is None:
            raise ValueError("forgetwatch needs a folder for its files: Watch(..., output_dir='run/forgetwatch')")
        self._scorer = Scorer(tokenizer, self.probes, c.scoring, refusal_detector=self.refusal_detector)
        self._scorer.prepare(model)  # a probe this model cannot score fails now, not at an evaluation
        if self._store is not None:
            self._store.release()  # this watch's earlier run (train() called again) is over
        self._store = RunStore(directory, [name for p in self._kept for name in p.files])

    def _open_sinks(
        self, sinks: Sequence[Any], stop_note: Callable[[int], str], step: int, computed: bool
    ) -> BaseSnapshot:
        """Which categories get keys of their own, the stop rule, and the run's sinks, told of the base."""
        c, o, t, base = self.config, self.config.output, self.config.monitor, self.base_answers
        self._logged, note = False, None  # per-category keys: all (True), none, or these
        if o.log_categories:  # decided on the base's answers: a resume decides the same
            n = len(self.probes.categories) if self._groups else None
            grouped = self._groups or base.categories
            self._logged, note = logged_categories(
                grouped, base.correct, o.min_logged_right, o.max_logged_categories, categories=n
            )
        scopes = noise_by_scope(base.meta)
        self._stop_rule = StopRule(
            c.max_forgetting, t.stop_metric, t.patience, t.significance, t.category_max_forgetting, scopes
        )
        console = ConsoleLines(self._store.history_path, o.verbose, stop_note)
        # the run's own writers on rank 0; a sink marked all_ranks, and the user's hook, everywhere
        self._sinks = Sinks(self._here([HistoryFile(self._store), console, *sinks]))
        self._user_sinks = Sinks(self._here(self._their_sinks), seconds=lambda: self.sink_seconds)
        snapshot = BaseSnapshot(base, self._store.snapshot_path, computed, step, notes=[note] if note else [])
        if computed and "noise_floor" in base.meta:  # once measured, logged once
            snapshot.metrics[f"{PREFIX}noise_floor"] = base.meta["noise_floor"]
        self._sinks.on_base(snapshot)
        self._user_sinks.on_base(self._theirs(snapshot))
        return snapshot

    def _begin_train_kl(self, model: torch.nn.Module, train_rows: RowsLike | None, scoring: float | None) -> float:
        """Train KL's base, measured once or read back (``train_rows`` given); what measuring it took."""
        self._train_kl: TrainKL | None = None
        if train_rows is None or self.config.monitor.train_kl_rows <= 0:
            return 0.0
        limit = max(SHARE * (scoring or 0.0), MIN_SECONDS)  # a share of what scoring the probes took
        self._train_kl = TrainKL(self.config.monitor.train_kl_rows, max_seconds=limit, clock=self._clock)
        began = self._clock()
        self._train_kl.begin(model, self._view, train_rows)
        return self._clock() - began if self._train_kl.on else 0.0

    def due(self, step: int) -> bool:
        """Whether to evaluate at ``step`` (call it once per optimizer step, on every rank)."""
        self._step = step
        if self._schedule.due(step):
            return True
        projected = getattr(self._schedule, "projected", None) if self._max_steps else None
        if self._max_steps and (projected is not None or self.history):  # once: would only the final one run?
            if self._writes and not self.history and projected > self._max_steps:
                logger.warning(
                    f"forgetwatch: this run ({self._max_steps} steps) is too short for max_overhead="
                    f"{self.config.monitor.max_overhead} to allow an evaluation before the end (the first would come "
                    f"at about step {projected}), so only the final evaluation will run; pass eval_steps=N to "
                    "evaluate every N steps regardless"
                )
            self._max_steps = None
        return False

    def evaluate(self, model: torch.nn.Module, step: int, trigger: str = "schedule") -> Evaluation | None:
        """Score the live model, compare it with the base and hand the :class:`~forgetwatch.Evaluation` to
        every sink; on every rank. NaN log-probabilities, or any other failure to score, are a warning and no
        evaluation (``None``): monitoring never stops training.

        ``step`` is the optimizer steps the weights have had, never before the run's start or the last
        evaluation; at the last evaluation's step that evaluation is returned again, nothing scored."""
        if self.base_answers is None or self.trajectory is None or self._stop_rule is None:
            raise RuntimeError("Watch.evaluate() before Watch.start(): start() takes the base snapshot")
        step = self._checked_step(step)
        if self.evaluated(step):
            if self._last is None or self._last.step != step:
                raise ValueError(
                    f"Watch.evaluate(step={step}): step {step} was evaluated before this run resumed "
                    f"({self._store.history_path} holds it); evaluate at a later step"
                )
            return self._last
        self._step = step
        if step == self._skipped:  # this step's weights failed to score already: said once
            return None
        began = self._clock()
        try:
            answers = self._score(model)
            trajectory = self.trajectory.plus(step, answers)  # the run's once the evaluation is whole
            report = with_trajectory_metrics(self.compare(answers), trajectory)
        except Exception as err:  # noqa: BLE001 - monitoring never stops training: said loudly, skipped
            self._skipped = step
            self._spent(step, began)
            if self._writes:
                what, trace = failure(err)
                logger.warning(
                    "forgetwatch: step %d: %s; this evaluation is skipped, training goes on", step, what, exc_info=trace
                )
            return None
        seconds = self._clock() - began
        kept = {p.name: {"metrics": p.metrics(), "state": p.state()} for p in self._kept}  # where each stands
        drift = self._train_kl.measure(model, self._ranks) if self._train_kl is not None else {}
        metrics = evaluation_metrics(self._logged_report(answers, report, trajectory), kept, drift)
        notes = []
        if isinstance(self._schedule, EverySteps):  # what the fixed interval costs, and a warning once
            note, warning = self._schedule.pace(step, began, self._clock() - began)
            notes += [note] if note else []
            if warning and self._writes:
                logger.warning("forgetwatch: %s", warning)
        stop = self._stop_rule.update(report) if self._stop_rule.active else None
        agreed = self._stop_rule.active and self._ranks.from_rank_zero([int(stop is not None)])[0]  # rank 0's
        stop = (stop or "rank 0's forgetting rule fired") if agreed else None
        self.trajectory = trajectory
        self.history.append((step, report))
        if stop:
            self.stop_reason = f"step {step}: {stop}"
        evaluation = Evaluation(
            step=step,
            report=report,
            answers=answers,
            seconds=seconds,
            stop=stop,
            trigger=trigger,
            probes=self.probes,
            base=self.base_answers,
            trajectory=trajectory,
            metrics=metrics,
            drift=drift,
            kept=kept,
            notes=notes,
        )
        self._sinks.on_evaluation(evaluation)
        self._last = evaluation
        self._spent(step, began)  # all of it is monitoring cost: scoring, files, logs (not the user's sinks)
        self._user_sinks.on_evaluation(self._theirs(evaluation))
        return evaluation

    def _spent(self, step: int, began: float) -> None:
        spent = self._clock() - began
        self._schedule.evaluated(step, spent)
        self.monitoring_seconds += spent

    def _logged_report(self, answers: Answers, report: TransitionReport, trajectory: Trajectory) -> TransitionReport:
        """``report`` as logged: by category group where the run has groups, the logged categories only."""
        if not self._logged:
            return dataclasses.replace(report, by_category={})
        if self._groups is not None:
            report = with_trajectory_metrics(self.compare(answers, self._groups), trajectory, self._groups)
        if self._logged is True:
            return report
        kept = {cat: child for cat, child in report.by_category.items() if cat in self._logged}
        return dataclasses.replace(report, by_category=kept)

    def _checked_step(self, step: Any) -> int:
        if isinstance(step, bool) or not isinstance(step, numbers.Integral):
            raise TypeError(
                f"Watch.evaluate(step={step!r}): a step is a whole number (int), the optimizer steps the "
                f"weights have had; got {type(step).__name__}"
            )
        step, last = int(step), self.history[-1][0] if self.history else -1
        if step < max(self._began_at, last):
            since = ("the last evaluation was", last) if last >= self._began_at else ("this run began", self._began_at)
            raise ValueError(
                f"Watch.evaluate(step={step}): steps do not go backwards, and {since[0]} at step {since[1]}; pass the "
                "optimizer steps the weights have had (a trainer's global step)"
            )
        return step

    def finish(self, model: torch.nn.Module, step: int, *, close: bool = True) -> Evaluation | None:
        """Training ended at ``step``: a last evaluation (``eval_on_train_end``), every sink's ``on_end``,
        then :meth:`close` unless ``close=False``."""
        evaluation = None
        if self.base_answers is not None and not self._finished:
            if self.config.monitor.eval_on_train_end and not self.evaluated(step):
                evaluation = self.evaluate(model, step, "train_end")
            self._finished = True
            self._sinks.on_end(self.trajectory)
            self._user_sinks.on_end(self._theirs(self.trajectory))
        if close:
            self.close()
        return evaluation

    def _told(self, ending: Ending) -> None:
        """A plug-in's figures after training (a merge's): logged at their step, said, and in :meth:`summary`."""
        self._ending = ending
        self._sinks.on_ending(ending)

    def close(self) -> None:
        """A last try for any write owed, then the run directory is free for another watch (:meth:`finish`
        calls it; call it yourself when the loop raised)."""
        if self._store is not None:
            if self._writes:
                self._store.flush()
            self._store.release()

    def keep(self, plugin: Kept) -> None:
        """Keep ``plugin``'s figures and state with the run (:class:`~forgetwatch.run.plugins.Kept`): logged and in
        the history at each evaluation, in :meth:`state_dict`; its files set aside with the watch's own. Call it
        before :meth:`start`.

        Example:
            >>> watch.keep(replay)  # doctest: +SKIP
        """
        if any(p.name == plugin.name for p in self._kept if p is not plugin):
            raise ValueError(f"Watch.keep: a plug-in named {plugin.name!r} is kept already; give each its own name")
        if plugin not in self._kept:
            self._kept.append(plugin)

    @property
    def view(self) -> RunView:
        """The started run as plug-ins beside the watch see it (:class:`~forgetwatch.run.plugins.RunView`)."""
        if self._view is None:
            raise RuntimeError("Watch.view before Watch.start(): a plug-in begins once the watch has started")
        return self._view

    def measure(self, model: torch.nn.Module) -> TransitionReport:
        """The model scored against the base, outside the run's history (e.g. after training)."""
        return self.compare(self._score(model))

    def compare(self, answers: Answers, categories: Sequence[str] | None = None) -> TransitionReport:
        """``answers`` against the base answers, with the run's settings (see :func:`~forgetwatch.compare`)."""
        c = self.config
        return compare(
            self.base_answers,
            answers,
            at_risk_share=c.monitor.at_risk_share,
            at_risk_floor=c.monitor.at_risk_floor,
            refusal_detector=self._scorer.refusal_detector,
            count_tokens=token_counter(self._scorer.tokenizer),
            categories=categories,
        )

    def evaluated(self, step: int) -> bool:
        """Whether the last evaluation was at ``step``."""
        return bool(self.history) and self.history[-1][0] == step

    # -- resuming a loop ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """What a loop keeps in its checkpoint to resume exactly (JSON-ready): the step, the schedule, the stop rule's
        streaks, the base snapshot's keys and each kept plug-in's state; the run's files stay in ``output_dir``."""
        meta = self.base_answers.meta if self.base_answers is not None else {}
        return {
            "format": "forgetwatch.watch",
            "version": 3,
            "step": self._step,
            "evaluations": len(self.history),
            "schedule": self._schedule.state_dict(),
            "streaks": dict(self._stop_rule.streaks) if self._stop_rule is not None else {},
            "base": {k: meta.get(k) for k in ("model_key", "weights_key")} if meta.get("base") is None else {},
            "plugins": {p.name: p.state() for p in self._kept},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict`'s result at the next :meth:`start` (call it before).

        Example:
            >>> watch.load_state_dict(json.load(open("ckpt/forgetwatch.json")))   # doctest: +SKIP
            >>> watch.start(model, tokenizer)     # resumes at the kept step      # doctest: +SKIP
        """
        problem = strict_json.value_problem(state) if isinstance(state, Mapping) else (None, "not a mapping")
        if problem is None:
            try:
                _State.model_validate(state)
            except ValidationError as err:
                e = err.errors(include_url=False)[0]
                problem = (".".join(map(str, e["loc"][:2])), f"{e['msg']}, got {e['input']!r}"[:300])
        if problem is None and (extra := sorted(set(state.get("plugins", {})) - {p.name for p in self._kept})):
            problem = ("plugins", f"it holds the state of {extra[0]!r}, a plug-in this watch does not keep (keep())")
        if problem is not None:
            field, message = problem
            raise ValueError(
                f"Watch.load_state_dict: {'field ' + repr(field) + ': ' if field else ''}{message}; "
                "pass what Watch.state_dict() returned"
            )
        self._loaded = json.loads(json.dumps(state))  # a copy of its own

    # -- reading it -----------------------------------------------------------------------------

    @property
    def output_dir(self) -> Path | None:
        """Where snapshot and history go (known once training began, or when configured)."""
        if self._store is not None:
            return self._store.dir
        return Path(self.config.output_dir) if self.config.output_dir else None

    def summary(self) -> str:
        """What to print when training ends: the last evaluation's table, why it stopped, where the history is."""
        if self.history:
            step, report = self.history[-1]
            lines = [f"forgetting at step {step} (against the model before training):", report.summary()]
        else:
            lines = ["forgetwatch has not evaluated yet"]
        if self.base_answers is not None and "noise_floor" in self.base_answers.meta:
            lines.append(
                f"noise floor: {pct(self.base_answers.meta['noise_floor'])} of the probes went from right "
                "to wrong when the base was scored again; forgetting below it is noise"
            )
        if self.stop_reason:
            lines.append(f"forgetwatch stopped training at {self.stop_reason}")
        if self._ending is not None:
            lines.append(self._ending.line)
        if self.output_dir:
            lines.append(f"history: {self.output_dir / HISTORY}")
        return "\n".join(lines)

    @property
    def stop_step(self) -> int | None:
        """The step forgetwatch stopped training at, if it did."""
        return self.history[-1][0] if self.stop_reason and self.history else None

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str], **keywords: Any) -> Watch:
        """A watch with a YAML file's settings (flat keys, see ``configs/``); ``keywords``, the constructor's, win."""
        return cls(**{**dict(ForgetWatchConfig.from_yaml(path)), **keywords})

    # -- inside ---------------------------------------------------------------------------------

    def _new_schedule(self) -> EverySteps | Budget:
        c = self.config.monitor
        if self.config.eval_steps:
            return EverySteps(self.config.eval_steps, c.max_overhead, clock=self._clock)
        # every rank must evaluate at the same steps, but their clocks differ: rank 0 decides
        return Budget(
            c.max_overhead, clock=self._clock, reserve=int(c.eval_on_train_end), agree=self._ranks.from_rank_zero
        )

    def _here(self, sinks: Iterable[Any]) -> list[Any]:
        return [s for s in sinks if self._writes or getattr(s, "all_ranks", False)]

    def _theirs(self, payload: Any) -> Any:
        """A copy of ``payload`` for the user's sinks: nothing they change reaches the run (the probes copied once)."""
        if not self._user_sinks.sinks:
            return payload
        if self._their_probes is None:
            tasks = {id(p.judge): p.judge for p in self.probes if p.judge is not None}
            self._their_probes = ProbeSet(copy.deepcopy(list(self.probes), tasks), self.probes.source)
        return copy.deepcopy(payload, {id(self.probes): self._their_probes})

    def _claim(self, fresh: bool, origin: Path | None = None) -> str | None:
        self._store.check_writable()  # the one time a file problem stops training: before it starts
        self._store.claim()
        self._store.remove_leftovers()
        if not fresh and origin is not None and (copied := self._store.adopt(origin)):
            logger.info("forgetwatch: resuming in %s: %s taken from %s", self._store.dir, ", ".join(copied), origin)
        aside = self._store.set_aside() if fresh else None
        return str(aside) if aside else None

    def _score(self, model: torch.nn.Module, show_progress: bool = False) -> Answers:
        return self._scorer(
            model, batch_size=self.config.scoring.batch_size, show_progress=show_progress, distributed=True
        )

    def _base(
        self, model: torch.nn.Module, step: int, kept: Mapping[str, Any], aside: Path | None
    ) -> tuple[Answers, float | None]:
        """The base answers (on resume the snapshot with the ``kept`` keys), and the seconds scoring took (or None)."""
        given, resumed = self._base_given, step > 0
        keys = {"model_key": model_key(model)}
        if given is None and not resumed:  # a cached snapshot must be of these very weights
            keys["weights_key"] = weights_key(model, self._ranks)
        scoring = self._scorer.scoring_for(model)
        expected = {"fingerprint": self._scorer.fingerprint, "scoring": scoring, "ids": self.probes.ids}

        def from_files() -> dict[str, Any] | None:  # on rank 0; the base with adapters off is never read back
            if given == ADAPTER_DISABLED:
                return None
            run_dir = aside or self._store.dir
            answers = stored_base(given, expected, kept if resumed else keys, run_dir=run_dir, step=step)
            if answers is None:
                return None
            # kept with the run (a snapshot found there: that very file)
            self._store.save_snapshot(answers, copy_of=run_dir / SNAPSHOT if given is None else None)
            return answers.to_dict()

        found = self._ranks.share_from_rank_zero(from_files)
        if found is not None:
            return Answers.from_dict(found), None
        check = self.config.monitor.noise_check
        if check is None:  # every rank must take part in the second scoring, or none: rank 0 decides
            reduced = is_reduced(scoring["precision"])
            check = bool(self._ranks.from_rank_zero([int(wants_noise_check(model, reduced))])[0])
        with adapters_disabled(model) if given == ADAPTER_DISABLED else contextlib.nullcontext():
            began = self._clock()
            answers = self._score(model, show_progress=self.config.output.verbose and self._writes)
            cost = self._clock() - began
            if check:
                answers.meta.update(
                    measure_noise(self._scorer, model, answers, self.config.scoring.batch_size, distributed=True)
                )
        # what scoring took: what a run that reuses the snapshot expects an evaluation to cost
        disabled = {"base": ADAPTER_DISABLED} if given == ADAPTER_DISABLED else {}
        answers.meta.update(keys, scoring_seconds=round(cost, 4), **disabled)
        if self._writes:
            self._store.save_snapshot(answers)
        return answers, cost

    def _restore_history(self, step: int, loaded: Mapping[str, Any] | None) -> list[dict[str, Any]]:
        """The history cut at ``step`` (by rank 0, for all), and the stop rule's streaks, kept or counted again."""
        base = self.base_answers
        records = self._ranks.share_from_rank_zero(
            lambda: self._store.resume_history(step, probes=len(base), fingerprint=base.probe_fingerprint)
        )
        if loaded and len(records) < loaded.get("evaluations", 0) and self._writes:
            logger.warning(
                f"forgetwatch: resuming at step {step}, but {self._store.history_path} holds {len(records)} of the "
                f"run's {loaded['evaluations']} evaluations up to it (deleted or damaged?): the trajectory and the "
                "report lack the others; the base snapshot is intact, so the figures stay right"
            )
        run = Run(self._store.dir, base, records)  # each record's report, made once
        self.history, self.trajectory = run.history, run.trajectory
        if loaded:
            self._stop_rule.streaks = dict(loaded.get("streaks", {}))
        else:
            for _, report in self.history:
                self._stop_rule.update(report)
        return records
