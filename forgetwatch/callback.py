"""ForgetWatchCallback: watch forgetting inside a transformers / TRL training run.

It only orchestrates: when to evaluate (:mod:`.schedule`), where the base comes from
(:mod:`.base`), scoring (:mod:`.scoring`), comparison (:mod:`.metrics`), stopping
(:mod:`.stopping`), files (:mod:`.store`, :mod:`.history`), what is logged (:mod:`.sinks`) and
the trainer's internals (:mod:`.trainer_bridge`) each live in their own module. Collectives
are visible here: every cross-rank step goes through the one ``Ranks`` this callback holds.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from . import sinks
from .console import say
from .adapters import adapters_disabled
from .answers import Answers
from .base import Expected, model_key, stored_base, weights_key
from .behaviour.drift import token_counter
from .config import ADAPTER_DISABLED, ForgetWatchConfig, options_doc, with_settings
from .dashboards import Dashboards, flip_rows, probe_rows
from .distributed import Ranks
from .history import history_record, recover_history, report_from_record
from .metrics import compare
from .probes import ProbesLike, as_probe_set
from .replay import ReplayPool
from .replay.driver import Replay, logits_width
from .replay.resume import base_to_resume, kept_base, kept_state, state_to_resume
from .report import TransitionReport
from .schedule import Budget, EverySteps
from .scoring import Scorer
from .scoring.scorer import pad_id
from .noise import measure_noise, noise_by_scope, wants_noise_check
from .stopping import StopRule
from .store import HISTORY, REPLAY_BASE, REPLAY_STATE, SUBDIR, RunStore, copy_problem
from .text import pct
from .trainer_bridge import TrainerBridge, resumed_checkpoint
from .trajectory import Trajectory, with_trajectory_figures

logger = logging.getLogger(__name__)

OnForgetting = Callable[[TransitionReport, int], Any]

#: keywords of the callback itself; every other keyword is a ForgetWatchConfig setting
_OWN = ("probes", "base", "tokenizer", "on_forgetting", "trainer", "replay", "refusal_detector", "clock")


class ForgetWatchCallback(TrainerCallback):
    """Measure per-sample forgetting on a probe set while a model trains.

    The base model's answers are scored once when training begins (or loaded: ``base=``, a
    cached snapshot, or the checkpoint's copy on resume); then the live model is re-scored
    every ``eval_steps`` optimizer steps, or as often as ``max_overhead`` of wall time allows,
    and at trainer evaluations and the end of training. Each evaluation is logged as
    ``forgetwatch/*`` metrics to every reporting integration (W&B, TensorBoard, ...), written
    to ``history.jsonl``, printed as one line, passed to ``on_forgetting``, and checked
    against ``max_forgetting``. A file that cannot be written or a logger that fails during
    training is a loud warning, never an exception out of the trainer.

    Args:
        probes: a :class:`~forgetwatch.ProbeSet`, the path of a probe JSONL file, or a list of
            probe rows (dicts in the probe-file schema).
        eval_steps: evaluate every N optimizer steps (default ``None``: the ``max_overhead``
            budget).
        max_forgetting: stop training once the forgetting rate exceeds this (default ``None``:
            never stop).
        output_dir: where snapshot and history live (default ``None``:
            ``<trainer output_dir>/forgetwatch``, or the trial's ``run-*`` folder in a
            hyperparameter search).
        base: base answers to compare against (an :class:`~forgetwatch.Answers` or its file)
            instead of scoring the model at the start; or ``"adapter_disabled"`` to score a PEFT
            (LoRA) model with its adapters disabled, when training begins and on every resume.
        tokenizer: defaults to the trainer's ``processing_class``.
        on_forgetting: ``callable(report, step)`` run after each evaluation, on every rank.
        trainer: the trainer running this callback, if known (``trainer.add_callback(
            ForgetWatchCallback(probes, trainer=trainer))``); otherwise it is found when training
            begins.
        replay: a :class:`~forgetwatch.ReplayPool` (or its file) to repair forgetting with:
            before each optimizer step, ``replay_batch_size`` rows, drawn by the forgetting
            measured at the last evaluation, add ``replay_weight`` times their loss gradient
            (default ``None``: no replay). A pool holding a probe's question is refused.
        refusal_detector: ``callable(response) -> bool`` deciding behaviour probes' ``refuses``
            check and the logged refusal rate (default ``None``: the phrase detector
            :func:`~forgetwatch.behaviour.looks_like_refusal`).
        config: a :class:`~forgetwatch.config.ForgetWatchConfig`; keywords given beside it
            override its settings.
        clock: the clock the overhead budget and ``monitoring_seconds`` read (default
            ``time.perf_counter``).
        **settings: any other setting below.

    Attributes:
        history: ``(global_step, TransitionReport)`` per evaluation.
        trajectory: every probe's correctness and drift signal at the base and each evaluation
            (a :class:`~forgetwatch.trajectory.Trajectory`; ``None`` before training begins).
        base_answers: the base model's :class:`~forgetwatch.Answers`.
        stop_reason: why it stopped training, or ``None``.
        monitoring_seconds: wall time spent in forgetwatch (base snapshot and evaluations).
        output_dir, history_path: where the snapshot and ``history.jsonl`` are written.

    Example:
        >>> from trl import SFTTrainer                                          # doctest: +SKIP
        >>> probes = ProbeSet.from_jsonl("probes.jsonl")                          # doctest: +SKIP
        >>> trainer = SFTTrainer(model=model, train_dataset=ds,
        ...                      callbacks=[ForgetWatchCallback(probes, eval_steps=50)])  # doctest: +SKIP
        >>> trainer.train()                                                      # doctest: +SKIP

    Settings (``ForgetWatchConfig`` fields; keywords, ``config=`` or a YAML file):
    """

    def __init__(
        self,
        probes: ProbesLike | None = None,
        *,
        eval_steps: int | None = None,
        max_forgetting: float | None = None,
        output_dir: str | None = None,
        base: Answers | str | os.PathLike[str] | None = None,
        tokenizer: Any = None,
        on_forgetting: OnForgetting | None = None,
        trainer: Any = None,
        replay: ReplayPool | str | os.PathLike[str] | None = None,
        refusal_detector: Callable[[str], bool] | None = None,
        config: ForgetWatchConfig | None = None,
        clock: Callable[[], float] = time.perf_counter,
        **settings: Any,
    ):
        for name, value in (("eval_steps", eval_steps), ("max_forgetting", max_forgetting),
                            ("output_dir", output_dir)):
            if value is not None:
                settings[name] = value
        if base is not None and not isinstance(base, Answers):
            settings["base"] = os.fspath(base) if isinstance(base, os.PathLike) else base  # checked as a setting
        if config is None:
            config = ForgetWatchConfig(**settings)
        elif settings:
            config = config.replace(**settings)
        probes = probes if probes is not None else config.probes
        if probes is None:
            raise ValueError("ForgetWatchCallback needs probes: a ProbeSet, a probe file path or a list of probe rows")
        # a bad probe file fails here, before the trainer does any work
        self.probes = as_probe_set(probes, source="ForgetWatchCallback(probes=[...])")
        config.check_categories(self.probes.categories)
        if replay is not None and not isinstance(replay, ReplayPool):
            replay = ReplayPool.from_jsonl(replay)
        if replay is not None:
            replay.check_disjoint(self.probes)  # the probes must stay held out
        self.replay_pool = replay
        self.refusal_detector = refusal_detector
        self.config = config
        self.tokenizer = tokenizer
        self.on_forgetting = on_forgetting
        self._base_given: Answers | str | None = base if isinstance(base, Answers) else config.base
        self._clock = clock
        self._bridge = TrainerBridge(self, trainer)
        self.base_answers: Answers | None = None
        self.history: list[tuple[int, TransitionReport]] = []
        self.trajectory: Trajectory | None = None
        self.stop_reason: str | None = None
        self.monitoring_seconds = 0.0
        self._records: list[dict[str, Any]] = []
        self._ranks = Ranks.alone()  # all of them once training begins
        self._schedule: EverySteps | Budget = self._new_schedule()
        self._stop_rule: StopRule | None = None
        self._dashboards = Dashboards()
        self._replay: Replay | None = None
        self._scorer: Scorer | None = None
        self._store: RunStore | None = None
        self._dirs: list[Path] | None = None  # where this train() call resumes from (see _resume_dirs)
        self._training = False
        self._eval_logged_at: int | None = None
        self._length_checked = False
        self._writes = True  # whether this rank writes the run's files
        self._logged_categories: set[str] | bool = True  # per-category keys: all, none, or these

    @classmethod
    def from_config(cls, config: ForgetWatchConfig, **kwargs: Any) -> ForgetWatchCallback:
        """Build from a :class:`~forgetwatch.config.ForgetWatchConfig` (its ``probes`` path
        is loaded unless ``probes=`` is passed); other keywords override its settings.

        Example:
            >>> cb = ForgetWatchCallback.from_config(ForgetWatchConfig(probes="p.jsonl", eval_steps=20))  # doctest: +SKIP
        """
        return cls(kwargs.pop("probes", None), config=config, **kwargs)

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str], **kwargs: Any) -> ForgetWatchCallback:
        """Build from a YAML file (see ``configs/``); keywords override the file's settings.

        Example:
            >>> cb = ForgetWatchCallback.from_yaml("configs/early_stop_adjusted_5pct.yaml", eval_steps=10)
            >>> cb.config.eval_steps, cb.config.max_forgetting
            (10, 0.05)
        """
        own = {k: kwargs.pop(k) for k in _OWN if k in kwargs}
        if isinstance(own.get("base"), (str, os.PathLike)):
            kwargs["base"] = own.pop("base")
        return cls(config=ForgetWatchConfig.from_yaml(path, **kwargs), **own)

    @property
    def output_dir(self) -> Path | None:
        """Where snapshot and history go (known once training began, or when configured)."""
        if self._store is not None:
            return self._store.dir
        return Path(self.config.output_dir) if self.config.output_dir else None

    @property
    def history_path(self) -> Path | None:
        return self.output_dir / "history.jsonl" if self.output_dir else None

    def summary(self) -> str:
        """The last evaluation's table, why training stopped (if forgetwatch stopped it), and
        where the history is: what to print when training ends.

        Example:
            >>> trainer.train(); print(callback.summary())  # doctest: +SKIP
        """
        if self.history:
            step, report = self.history[-1]
            lines = [f"forgetting at step {step} (against the model before training):", report.summary()]
        else:
            lines = ["forgetwatch has not evaluated yet"]
        if self.base_answers is not None and "noise_floor" in self.base_answers.meta:
            lines.append(f"noise floor: {pct(self.base_answers.meta['noise_floor'])} of the probes went from right "
                         "to wrong when the base was scored again; forgetting below it is noise")
        if self.stop_reason:
            lines.append(f"forgetwatch stopped training at {self.stop_reason}")
        if self.history_path:
            lines.append(f"history: {self.history_path}")
        return "\n".join(lines)

    # -- trainer events ------------------------------------------------------------------------

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       model: torch.nn.Module | None = None, processing_class: Any = None, **kwargs: Any) -> None:
        start = self._clock()
        self._bridge.attach()
        self._ranks = Ranks.all()
        # rank 0 writes, and reads what a resume needs for all ranks (so nodes need not share storage)
        self._writes = state.is_world_process_zero
        tokenizer = self.tokenizer or getattr(processing_class, "tokenizer", processing_class)
        if tokenizer is None:
            raise ValueError("ForgetWatchCallback needs a tokenizer: pass processing_class to the "
                             "trainer or tokenizer= to the callback")
        # the config is frozen, but its lists and dicts can still be edited: check it again
        c = self.config = self.config.replace()
        c.check_categories(self.probes.categories)
        self._scorer = Scorer(tokenizer, self.probes, normalize=c.normalize, chat_template=c.chat_template,
                              max_new_tokens=c.max_new_tokens, stop=c.stop,
                              behaviour_max_new_tokens=c.behaviour_max_new_tokens,
                              refusal_detector=self.refusal_detector)
        self._scorer.prepare(model)  # a probe this model cannot score fails now, not at an evaluation
        self._logged_categories = False
        if c.log_categories:
            self._logged_categories, note = sinks.logged_categories([p.category for p in self.probes],
                                                                    c.max_logged_categories)
            if note and self._writes:
                logger.warning("forgetwatch: %s", note)
        self._store = RunStore(c.output_dir or self._bridge.run_dir(args) / SUBDIR)
        self._dirs = None
        if self._writes:  # what a kill -9 left half-written, in the run directory and its checkpoints
            self._store.remove_leftovers(self._checkpoint_folders(args))
        self._replay = None if self.replay_pool is None else Replay(
            self.replay_pool, weight=c.replay_weight, batch_size=c.replay_batch_size, seed=c.replay_seed,
            target=c.forgetting_target, metric=c.stop_metric, loss=c.replay_loss, top_k=c.replay_top_k)
        # a callback may serve several train() calls: each starts from its own state
        self.history, self._records, self.stop_reason = [], [], None
        self._schedule = self._new_schedule()
        self._training, self._eval_logged_at = True, None
        self._length_checked = not isinstance(self._schedule, Budget)  # a fixed interval is never too long
        self._dashboards = (Dashboards(self._bridge.integration("WandbCallback"),
                                       self._bridge.integration("TensorBoardCallback"), c.table_rows)
                            if self._writes else Dashboards())
        resumed = state.global_step > 0
        self.base_answers, cost = self._base(model, args, state, resumed)
        computed = cost is not None
        self.trajectory = Trajectory.start(self.base_answers)
        self._stop_rule = StopRule(c.max_forgetting, c.stop_metric, c.patience, c.significance,
                                   c.category_max_forgetting, noise_floor=noise_by_scope(self.base_answers.meta))
        self._announce_base(computed, args, state, control)
        if resumed:
            self._restore_history(args, state)
        if self._replay is not None:
            self._start_replay(model, args, state, resumed)
        if not resumed and self._writes:
            self._store.set_aside_history()
        if self._writes:
            self._store.save_probes(self.probes)
        self.monitoring_seconds = self._clock() - start
        # a loaded snapshot says nothing about what an evaluation costs
        self._schedule.start(state.global_step, cost or 0.0)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    model: torch.nn.Module | None = None, **kwargs: Any) -> None:
        if self._schedule.due(state.global_step):
            self._evaluate(model, args, state, control, "schedule")
        elif not self._length_checked:
            self._warn_if_too_short(state)

    def on_epoch_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     model: torch.nn.Module | None = None, **kwargs: Any) -> None:
        # however training stops (max_steps, a callback, data running out), this runs before
        # the trainer finalizes, while every integration is still open; and the trainer
        # saves after it if asked to
        if not control.should_training_stop:
            return
        step = state.global_step
        if self.config.eval_on_train_end and not self._evaluated(step):
            self._evaluate(model, args, state, control, "train_end")
        if self._writes and self.trajectory is not None:  # while the integrations are still open
            self._dashboards.probes(probe_rows(self.probes, self.trajectory, self.config.table_rows), step)
        if (self._stop_step == step and self.config.save_on_stop
                and not self._bridge.checkpoint_dir(args, step).is_dir()):
            control.should_save = True  # e.g. save_strategy="best" overrode the request

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    metrics: dict[str, float] | None = None, model: torch.nn.Module | None = None,
                    **kwargs: Any) -> None:
        if not self.config.eval_on_evaluate or self.base_answers is None:
            return
        if not self._training:
            # after train(): the weights may have changed (best model loaded); score them
            # afresh, outside the run's history
            report = self._compare(self._score(model))
        elif self._evaluated(state.global_step):
            report = self.history[-1][1]
        else:
            report = self._evaluate(model, args, state, control, "evaluate")
        extra = sinks.eval_metric_values(report)
        if metrics is not None:  # the dict best-model selection and EarlyStoppingCallback read
            metrics.update(extra)
        if self._eval_logged_at != state.global_step or not self._training:  # once per step
            self._eval_logged_at = state.global_step
            self._emit(extra, args, state, control)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     model: torch.nn.Module | None = None, **kwargs: Any) -> None:
        # a fallback: integrations may be closed now, so the result goes to the history only
        if self.config.eval_on_train_end and self.base_answers is not None and not self._evaluated(state.global_step):
            self._evaluate(model, args, state, control, "train_end", log=False)
        self._training = False
        if self._writes and self._store is not None:
            self._store.flush()  # a last try for anything a failed write left in memory

    def on_pre_optimizer_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                              model: torch.nn.Module | None = None, **kwargs: Any) -> None:
        # after the trainer's backward (and its clipping): the replay gradient joins it
        if self._replay is not None:
            self._replay.step(model, self._scorer.tokenizer, pad_id(self._scorer.tokenizer), args.max_grad_norm,
                              self._scorer.rows_per_batch(model), self._ranks, self._bridge.grad_scaler())

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self._copy_into_checkpoint(args, state)

    def on_push_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                      **kwargs: Any) -> None:
        # the trainer pushes a checkpoint before on_save: put the files in it first
        self._copy_into_checkpoint(args, state)

    # -- evaluation ----------------------------------------------------------------------------

    def _new_schedule(self) -> EverySteps | Budget:
        c = self.config
        if c.eval_steps:
            return EverySteps(c.eval_steps)
        # every rank must evaluate at the same steps, but their clocks differ: rank 0 decides
        return Budget(c.max_overhead, clock=self._clock, reserve=int(c.eval_on_train_end),
                      agree=self._ranks.from_rank_zero)

    @property
    def _stop_step(self) -> int | None:
        return self.history[-1][0] if self.stop_reason and self.history else None

    def _evaluated(self, step: int) -> bool:
        return bool(self.history) and self.history[-1][0] == step

    def _score(self, model: torch.nn.Module, show_progress: bool = False) -> Answers:
        """Every rank scores its share of the probes; each gets all the answers."""
        return self._scorer(model, batch_size=self.config.batch_size, show_progress=show_progress,
                            distributed=True)

    def _evaluate(self, model, args, state, control, trigger: str, log: bool = True) -> TransitionReport:
        start = self._clock()
        answers = self._score(model)
        step = state.global_step
        self.trajectory.append(step, answers)
        report = with_trajectory_figures(self._compare(answers), self.trajectory)
        self.history.append((step, report))
        record = history_record(step, report, time=round(time.time(), 3), trigger=trigger,
                                seconds=round(self._clock() - start, 4), columns=self.trajectory.column())
        replayed = {}
        if self._replay is not None:
            replayed = self._replay.figures()
            record["replay"] = {**replayed, **self._replay.state()}
            self._replay.reweigh(report)
        reason = None
        if self._stop_rule.active:
            reason = self._stop_rule.update(record["report"])
            # every rank must stop together: rank 0 decides
            if self._ranks.from_rank_zero([int(reason is not None)])[0]:
                reason = reason or "rank 0's forgetting rule fired"
            else:
                reason = None
        if reason:
            record["stop"] = reason
        self._records.append(record)
        if self._writes:
            self._store.append_history(record)  # a failed write warns and is retried, never raised
            answers.meta["step"] = step
            self._store.save_latest(answers)  # what the report shows as the answer now
            if self.config.verbose:
                say(sinks.console_line(step, report))
        if log:
            values = sinks.metric_values(report, self._logged_categories)
            values.update({f"{sinks.PREFIX}{name}": value for name, value in replayed.items()})
            self._emit(values, args, state, control, own_section=True)
            if self._writes:
                self._dashboards.flips(flip_rows(step, self.probes, self.base_answers, answers, report,
                                                 self.trajectory, self.config.table_rows), step)
        # all of it is monitoring cost: scoring, files and logs (the user's hook is not)
        spent = self._clock() - start
        self._schedule.evaluated(step, spent)
        self.monitoring_seconds += spent
        if self.on_forgetting is not None:
            self.on_forgetting(report, step)
        if reason:
            self._stop(reason, step, args, state, control)
        return report

    def _compare(self, answers: Answers) -> TransitionReport:
        return compare(self.base_answers, answers, at_risk_share=self.config.at_risk_share,
                       at_risk_floor=self.config.at_risk_floor, refusal_detector=self._scorer.refusal_detector,
                       count_tokens=token_counter(self._scorer.tokenizer))

    def _emit(self, metrics: dict[str, float], args, state, control, own_section: bool = False) -> None:
        """To every integration of the trainer; ``forgetwatch/*`` figures (``own_section``) go
        to W&B through the dashboards, in a section of their own rather than under ``train/``."""
        to_wandb = own_section and self._dashboards.metrics(metrics, state.global_step)
        try:
            self._bridge.emit(metrics, args, state, control, skip=("WandbCallback",) if to_wandb else ())
        except Exception as err:  # noqa: BLE001 - a logger that is gone must not end training
            logger.warning("forgetwatch: sending the metrics of step %d to the trainer's integrations failed "
                           "(%s: %s); training goes on, and the figures are in %s", state.global_step,
                           type(err).__name__, err, self.history_path)

    def _stop(self, reason: str, step: int, args, state, control) -> None:
        self.stop_reason = f"step {step}: {reason}"
        control.should_training_stop = True
        saved = ""
        if self.config.save_on_stop:
            control.should_save = True
            saved = f"; saving checkpoint {self._bridge.checkpoint_dir(args, step)}"
        if state.is_world_process_zero:
            # on its own line above any progress bar, where a person sees it; and to the logs
            message = f"stopping training at step {step}: {reason}{saved}; history {self.history_path}"
            say(f"[forgetwatch] {message}")
            logger.info("forgetwatch: %s", message)

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        # the trainer's final summary line (printed after this) says forgetwatch stopped it
        if logs is not None and "train_runtime" in logs and self._stop_step is not None:
            logs["forgetwatch_stopped_at_step"] = self._stop_step

    def _warn_if_too_short(self, state) -> None:
        """At the budget's first look at the clock (the first step it can measure), say if it
        would evaluate only at the end of this run."""
        projected = self._schedule.projected
        if projected is None and not self.history:
            return
        self._length_checked = True
        if self._writes and not self.history and state.max_steps and projected > state.max_steps:
            logger.warning("forgetwatch: this run (%d steps) is too short for max_overhead=%s to allow an "
                           "evaluation before the end (the first would come at about step %d), so only the "
                           "final evaluation will run; pass eval_steps=N to evaluate every N steps regardless",
                           state.max_steps, self.config.max_overhead, projected)

    def _copy_into_checkpoint(self, args, state) -> None:
        checkpoint = self._bridge.checkpoint_dir(args, state.global_step)
        if self._writes and self._store is not None and checkpoint.is_dir():
            # the replay state (where the draws stood at this very step) in the same whole-or-not copy
            extra = {REPLAY_STATE: self._replay.state()} if self._replay is not None else None
            self._store.copy_to(checkpoint / SUBDIR, extra)  # a failed copy warns, never raises

    def _start_replay(self, model, args, state, resumed: bool) -> None:
        """Refuse what replay cannot run under; a resumed run goes on with the draws where the
        checkpoint left them: its ``replay.json``, else rebuilt from the history (exact, and
        said), else one clear error naming each copy and what is wrong with it."""
        replay = self._replay
        replay.start(model, args, self._scorer.tokenizer, warn=self._writes)
        if resumed:
            step = state.global_step
            paths = [d / REPLAY_STATE for d in self._resume_dirs(args, state)]
            found = self._ranks.share_from_rank_zero(lambda: kept_state(replay, paths, step))  # rank 0's files
            kept, warning = state_to_resume(replay, found, paths, self._records,
                                            self.history[-1][1] if self.history else None, step)
            if warning and self._writes:
                logger.warning("forgetwatch: %s", warning)
            replay.resume(kept, step)
        if self.history:
            replay.reweigh(self.history[-1][1], steer=False)
        if replay.loss == "kl":
            self._replay_base(model, args, state, resumed)

    def _replay_base(self, model, args, state, resumed: bool) -> None:
        """The base's distribution on the replay rows: on a fresh run (and with
        ``base="adapter_disabled"``, which is never read back) from the model; on resume the
        first kept copy (checkpoint, then run directory) whose arrays check out and whose key
        is this run's, or one clear error naming each copy."""
        replay, tokenizer = self._replay, self._scorer.tokenizer
        if resumed and self._base_given != ADAPTER_DISABLED:
            paths = [d / REPLAY_BASE for d in self._resume_dirs(args, state)]
            meta = self.base_answers.meta if self._base_given is None else {}  # scored from the same weights
            made_by = {"model": meta.get("model_key") or model_key(model), "weights": meta.get("weights_key")}
            vocab = logits_width(model)
            found = self._ranks.share_from_rank_zero(lambda: kept_base(replay, paths, made_by, vocab))
            replay.base, warning = base_to_resume(found, paths)
            if warning and self._writes:
                logger.warning("forgetwatch: %s", warning)
            if self._writes:
                self._store.save_replay_base(replay.base)  # kept with the run for the next resume
            return
        made_by = {"model": model_key(model), "weights": weights_key(model, self._ranks)}
        with adapters_disabled(model) if self._base_given == ADAPTER_DISABLED else contextlib.nullcontext():
            base = replay.cache_base(model, tokenizer, pad_id(tokenizer), self._scorer.rows_per_batch(model), made_by)
        if self._writes:
            self._store.save_replay_base(base)

    # -- base snapshot and resume --------------------------------------------------------------

    def _base(self, model, args, state, resumed: bool) -> tuple[Answers, float | None]:
        """The base answers, and the seconds one scoring of them took (what an evaluation will
        cost; ``None`` when they were loaded).

        Rank 0 decides from its files whether one is found, and shares it, so every rank
        either loads the same answers or joins in computing them; an error there (a damaged
        ``base=`` file, no snapshot to resume from) is raised on every rank."""
        given = self._base_given
        keys = {"model_key": model_key(model)}
        if given is None and not resumed:  # a cached snapshot must be of these very weights
            keys["weights_key"] = weights_key(model, self._ranks)
        expected = Expected(self._scorer.fingerprint, self._scorer.scoring, self.probes.ids, keys)
        dirs = self._resume_dirs(args, state) if resumed else []

        def from_files() -> dict[str, Any] | None:  # on rank 0
            self._store.check_writable()  # the one time a file problem stops training: before it starts
            answers = stored_base(given, expected, run_dir=self._store.dir, resume_dirs=dirs, step=state.global_step)
            if answers is not None:  # kept with the run and its checkpoints (a cached one is there already)
                self._store.save_snapshot(answers, on_disk=given is None and not resumed)
            return None if answers is None else answers.to_dict()

        found = self._ranks.share_from_rank_zero(from_files)
        if found is not None:
            return Answers.from_dict(found), None
        check = self.config.noise_check
        if check is None:  # every rank must take part in the second scoring, or none: rank 0 decides
            check = bool(self._ranks.from_rank_zero([int(wants_noise_check(model))])[0])
        with adapters_disabled(model) if given == ADAPTER_DISABLED else contextlib.nullcontext():
            start = self._clock()
            answers = self._score(model, show_progress=self.config.verbose and state.is_world_process_zero)
            cost = self._clock() - start
            if check:
                answers.meta.update(measure_noise(self._scorer, model, answers, self.config.batch_size,
                                                  distributed=True))
        answers.meta.update(keys, **({"base": ADAPTER_DISABLED} if given == ADAPTER_DISABLED else {}))
        if self._writes:
            self._store.save_snapshot(answers)
        return answers, cost

    def _announce_base(self, computed: bool, args, state, control) -> None:
        """One console line on the base; its noise floor, once measured, logged once."""
        if self._writes and self.config.verbose:
            say(sinks.base_line(self.base_answers, self._store.snapshot_path, computed))
        if computed and "noise_floor" in self.base_answers.meta:
            self._emit({f"{sinks.PREFIX}noise_floor": self.base_answers.meta["noise_floor"]}, args, state, control,
                       own_section=True)

    def _checkpoint_folders(self, args) -> list[Path]:
        """The forgetwatch folders of this run's checkpoints, and of the one it resumes from."""
        resuming = resumed_checkpoint()
        folders = sorted(self._bridge.run_dir(args).glob(f"checkpoint-*/{SUBDIR}"))
        return folders + ([Path(resuming) / SUBDIR] if resuming else [])

    def _resume_dirs(self, args, state) -> list[Path]:
        """Where a resumed run looks for its base snapshot, history and replay files, in order:
        the checkpoint it resumes from, then the run's own forgetwatch directory. A checkpoint's
        folder that is not a whole copy (see :func:`~forgetwatch.store.copy_problem`) is left
        out, with a warning; rank 0 decides (it alone reads them), once per ``train()``."""
        if self._dirs is not None:
            return self._dirs
        resuming = resumed_checkpoint()
        folders = [Path(resuming) / SUBDIR] if resuming else []
        folders.append(self._bridge.checkpoint_dir(args, state.global_step) / SUBDIR)
        dirs = []
        for i, folder in enumerate(dict.fromkeys(folders)):
            if not self._writes or folder == self._store.dir:
                dirs.append(folder)
                continue
            if folder.is_dir():
                problem = copy_problem(folder)
            elif resuming and i == 0:
                problem = "no such folder (the checkpoint was saved without forgetwatch)"
            else:
                continue
            if problem:
                logger.warning("forgetwatch: not resuming from %s: %s; using the files of the run directory %s "
                               "instead", folder, problem, self._store.dir)
            else:
                dirs.append(folder)
        self._dirs = list(dict.fromkeys([*dirs, self._store.dir]))
        return self._dirs

    def _restore_history(self, args, state) -> None:
        """Keep the history up to the checkpoint's step, every record that can be read (see
        :func:`~forgetwatch.history.recover_history`); replay it through the stop rule. The
        run's own file, if it holds records that could not be read, is moved aside, never
        overwritten."""
        paths = [d / HISTORY for d in self._resume_dirs(args, state)]

        def recover() -> list[dict[str, Any]]:  # rank 0's files, for every rank (an error raised on all)
            found = recover_history(paths, state.global_step, probes=len(self.base_answers),
                                    fingerprint=self.base_answers.probe_fingerprint)
            if any(s.problem is not None and s.path == self._store.history_path for s in found.scans):
                self._store.set_aside_damaged(len(found.records))
            return found.records

        self._records = self._ranks.share_from_rank_zero(recover)
        category = {p.id: p.category for p in self.probes}
        self.history = [(r["step"], report_from_record(r, category)) for r in self._records]
        self.trajectory = Trajectory.from_history(self.base_answers, self._records)
        for r in self._records:
            self._stop_rule.update(r["report"])
        if self._writes:
            self._store.save_history(self._records)


# every setting visible with its type and default, to help() and to editors that inspect live objects
ForgetWatchCallback.__init__.__signature__ = with_settings(inspect.signature(ForgetWatchCallback.__init__))
ForgetWatchCallback.__doc__ += options_doc()

