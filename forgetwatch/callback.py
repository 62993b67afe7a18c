"""ForgetWatchCallback: watch forgetting inside a transformers / TRL training run.

It decides when to evaluate and where results go; scoring, comparison, scheduling, stopping
and storage each live in their own module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm
from transformers import TrainerCallback

from . import sinks
from .answers import Answers, AnswersMismatchError
from .distributed import Ranks, from_rank_zero
from .introspect import calling_handler, resumed_checkpoint
from .adapters import adapters_disabled
from .config import ADAPTER_DISABLED, ForgetWatchConfig
from .metrics import compare
from .probes import ProbeSet
from .report import TransitionReport
from .schedule import Budget, EverySteps
from .scoring import Scorer
from .stopping import StopRule
from .store import SUBDIR, RunStore, model_key, weights_key

logger = logging.getLogger("forgetwatch")

OnForgetting = Callable[[TransitionReport, int], Any]


class ForgetWatchCallback(TrainerCallback):
    """Measure per-sample forgetting on a probe set while a model trains.

    The base model's answers are scored once when training begins (or loaded: ``base=``, a
    cached snapshot, or the checkpoint's copy on resume); then the live model is re-scored
    every ``eval_steps`` optimizer steps, or as often as ``max_overhead`` of wall time allows,
    and at trainer evaluations and the end of training. Each evaluation is logged as
    ``forgetwatch/*`` metrics to every reporting integration (W&B, TensorBoard, ...), written
    to ``history.jsonl``, printed as one line, passed to ``on_forgetting``, and checked
    against ``max_forgetting``.

    Args:
        probes: a :class:`~forgetwatch.ProbeSet` or the path of a probe JSONL file.
        eval_steps: evaluate every N optimizer steps (default: the ``max_overhead`` budget).
        max_forgetting: stop training once the forgetting rate exceeds this.
        output_dir: where snapshot and history live (default ``<output_dir>/forgetwatch``).
        base: base answers to compare against (an :class:`~forgetwatch.Answers` or its file)
            instead of scoring the model at the start; or ``"adapter_disabled"`` to score a PEFT
            (LoRA) model with its adapters disabled, when training begins and on every resume.
        tokenizer: defaults to the trainer's ``processing_class``.
        on_forgetting: ``callable(report, step)`` run after each evaluation, on every rank.
        config: a :class:`~forgetwatch.config.ForgetWatchConfig`, instead of keywords.
        **settings: any other :class:`~forgetwatch.config.ForgetWatchConfig` field
            (``max_overhead``, ``stop_metric``, ``patience``, ``significance``, ...).

    Attributes:
        history: ``(global_step, TransitionReport)`` per evaluation.
        base_answers: the base model's :class:`~forgetwatch.Answers`.
        stop_reason: why it stopped training, or ``None``.
        monitoring_seconds: wall time spent in forgetwatch (base snapshot and evaluations).
        output_dir, history_path: where the snapshot and ``history.jsonl`` are written.

    Example:
        >>> from trl import SFTTrainer
        >>> probes = ProbeSet.from_jsonl("probes.jsonl")                          # doctest: +SKIP
        >>> trainer = SFTTrainer(model=model, train_dataset=ds,
        ...                      callbacks=[ForgetWatchCallback(probes, eval_steps=50)])  # doctest: +SKIP
        >>> trainer.train()                                                      # doctest: +SKIP
    """

    def __init__(
        self,
        probes: ProbeSet | str | os.PathLike[str] | None = None,
        *,
        eval_steps: int | None = None,
        max_forgetting: float | None = None,
        output_dir: str | None = None,
        base: Answers | str | os.PathLike[str] | None = None,
        tokenizer: Any = None,
        on_forgetting: OnForgetting | None = None,
        config: ForgetWatchConfig | None = None,
        **settings: Any,
    ):
        if config is None:
            config = ForgetWatchConfig.from_dict(
                {"eval_steps": eval_steps, "max_forgetting": max_forgetting, "output_dir": output_dir,
                 **settings}, source="ForgetWatchCallback")
        elif settings or eval_steps is not None or max_forgetting is not None or output_dir is not None:
            raise TypeError("give either config= or setting keywords, not both")
        probes = probes if probes is not None else config.probes
        if probes is None:
            raise ValueError("ForgetWatchCallback needs probes: a ProbeSet or a probe file path")
        # a bad probe file fails here, before the trainer does any work
        self.probes = probes if isinstance(probes, ProbeSet) else ProbeSet.from_jsonl(probes)
        self.config = config
        self.tokenizer = tokenizer
        self.on_forgetting = on_forgetting
        self._base_given = base if base is not None else config.base
        self.base_answers: Answers | None = None
        self.history: list[tuple[int, TransitionReport]] = []
        self.stop_reason: str | None = None
        self.monitoring_seconds = 0.0
        self._records: list[dict[str, Any]] = []
        self._schedule = (EverySteps(config.eval_steps) if config.eval_steps else
                          Budget(config.max_overhead, reserve=int(config.eval_on_train_end), agree=from_rank_zero))
        self._stop_rule: StopRule | None = None  # made when training begins
        self._scorer: Scorer | None = None
        self._store: RunStore | None = None
        self._handler: Any = None
        self._training = False
        self._eval_logged_at: int | None = None
        self._writes = True  # whether this rank writes the run's files

    @classmethod
    def from_config(cls, config: ForgetWatchConfig, **kwargs: Any) -> ForgetWatchCallback:
        """Build from a :class:`~forgetwatch.config.ForgetWatchConfig` (its ``probes`` path
        is loaded unless ``probes=`` is passed).

        Example:
            >>> cb = ForgetWatchCallback.from_config(ForgetWatchConfig(probes="p.jsonl", eval_steps=20))  # doctest: +SKIP
        """
        return cls(kwargs.pop("probes", None), config=config, **kwargs)

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str], **kwargs: Any) -> ForgetWatchCallback:
        """Build from a YAML file (see ``configs/``); ``kwargs`` as for :meth:`from_config`.

        Example:
            >>> cb = ForgetWatchCallback.from_yaml("configs/early_stop_adjusted_5pct.yaml")  # doctest: +SKIP
        """
        return cls.from_config(ForgetWatchConfig.from_yaml(path), **kwargs)

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
        if self.stop_reason:
            lines.append(f"forgetwatch stopped training at {self.stop_reason}")
        if self.history_path:
            lines.append(f"history: {self.history_path}")
        return "\n".join(lines)

    def _new_stop_rule(self) -> StopRule:
        c = self.config
        return StopRule(c.max_forgetting, c.stop_metric, c.patience, c.significance, c.category_max_forgetting)

    # -- trainer events ------------------------------------------------------------------------

    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        start = time.perf_counter()
        self._handler = calling_handler(self)
        self._run_before_early_stopping()
        tokenizer = self.tokenizer or getattr(processing_class, "tokenizer", processing_class)
        if tokenizer is None:
            raise ValueError("ForgetWatchCallback needs a tokenizer: pass processing_class to the "
                             "trainer or tokenizer= to the callback")
        c = self.config
        unknown = sorted(set(c.category_max_forgetting) - set(self.probes.categories))
        if unknown:
            logger.warning("forgetwatch: category_max_forgetting names categories the probes do not "
                           "have: %s (they have %s)", unknown, self.probes.categories)
        self._scorer = Scorer(tokenizer, self.probes, normalize=c.normalize, chat_template=c.chat_template,
                              max_new_tokens=c.max_new_tokens, stop=c.stop)
        self._store = RunStore(c.output_dir or Path(args.output_dir) / "forgetwatch")
        # a callback may serve several train() calls: each starts from its own state
        self.history, self._records, self.stop_reason = [], [], None
        self._stop_rule = self._new_stop_rule()
        self._training, self._eval_logged_at = True, None
        # rank 0 writes, and reads what a resume needs for all ranks (so nodes need not share storage)
        self._writes = state.is_world_process_zero
        resumed = state.global_step > 0
        self.base_answers, computed = self._base_snapshot(model, args, state, resumed)
        if resumed:
            self._restore_history(args, state)
        elif self._writes:
            self._store.set_aside_history()
        self.monitoring_seconds = time.perf_counter() - start
        # a loaded snapshot says nothing about what an evaluation costs
        self._schedule.start(state.global_step, self.monitoring_seconds if computed else 0.0)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self._schedule.due(state.global_step):
            self._evaluate(model, args, state, control, "schedule")

    def on_epoch_end(self, args, state, control, model=None, **kwargs):
        # however training stops (max_steps, a callback, data running out), this runs before
        # the trainer finalizes, while every integration is still open; and the trainer
        # saves after it if asked to
        if not control.should_training_stop:
            return
        step = state.global_step
        if self.config.eval_on_train_end and not self._evaluated(step):
            self._evaluate(model, args, state, control, "train_end")
        if self._stop_step == step and self.config.save_on_stop and not self._checkpoint(args, step).is_dir():
            control.should_save = True  # e.g. save_strategy="best" overrode the request

    def on_evaluate(self, args, state, control, metrics=None, model=None, **kwargs):
        if not self.config.eval_on_evaluate or self.base_answers is None:
            return
        if not self._training:
            # after train(): the weights may have changed (best model loaded); score them
            # afresh, outside the run's history
            report = compare(self.base_answers, self._score(model))
        elif self._evaluated(state.global_step):
            report = self.history[-1][1]
        else:
            report = self._evaluate(model, args, state, control, "evaluate")
        extra = sinks.eval_metric_values(report)
        if metrics is not None:  # the dict best-model selection and EarlyStoppingCallback read
            metrics.update(extra)
        if self._eval_logged_at != state.global_step or not self._training:  # once per step
            self._eval_logged_at = state.global_step
            sinks.emit(self._handler, extra, args, state, control, source=self)

    def on_train_end(self, args, state, control, model=None, **kwargs):
        # a fallback: integrations may be closed now, so the result goes to the history only
        if self.config.eval_on_train_end and self.base_answers is not None and not self._evaluated(state.global_step):
            self._evaluate(model, args, state, control, "train_end", log=False)
        self._training = False

    def on_save(self, args, state, control, **kwargs):
        checkpoint = self._checkpoint(args, state.global_step)
        if self._writes and checkpoint.is_dir():
            self._store.copy_to(checkpoint / SUBDIR)

    # -- evaluation ----------------------------------------------------------------------------

    @property
    def _stop_step(self) -> int | None:
        return self.history[-1][0] if self.stop_reason and self.history else None

    @staticmethod
    def _checkpoint(args, step: int) -> Path:
        return Path(args.output_dir) / f"checkpoint-{step}"

    def _evaluated(self, step: int) -> bool:
        return bool(self.history) and self.history[-1][0] == step

    def _evaluate(self, model, args, state, control, trigger: str, log: bool = True) -> TransitionReport:
        start = time.perf_counter()
        report = compare(self.base_answers, self._score(model))
        step = state.global_step
        self.history.append((step, report))

        record = {"step": step, "time": round(time.time(), 3), "seconds": round(time.perf_counter() - start, 4),
                  "trigger": trigger, "report": _history_report(report)}
        reason = None
        if self._stop_rule.active:
            reason = self._stop_rule.update(record["report"])
            # every rank must stop together: rank 0 decides
            if from_rank_zero([int(reason is not None)])[0]:
                reason = reason or "rank 0's forgetting rule fired"
            else:
                reason = None
        if reason:
            record["stop"] = reason
        self._records.append(record)
        if self._writes:
            self._store.append_history(record)
            if self.config.verbose:
                tqdm.write(sinks.console_line(step, report))
        if log:
            sinks.emit(self._handler, sinks.metric_values(report, self.config.log_categories),
                       args, state, control, source=self)
        # all of it is monitoring cost: scoring, files and logs (the user's hook is not)
        spent = time.perf_counter() - start
        self._schedule.evaluated(step, spent)
        self.monitoring_seconds += spent
        if self.on_forgetting is not None:
            self.on_forgetting(report, step)
        if reason:
            self._stop(reason, step, state, control)
        return report

    def _stop(self, reason: str, step: int, state, control) -> None:
        self.stop_reason = f"step {step}: {reason}"
        control.should_training_stop = True
        if self.config.save_on_stop:
            control.should_save = True
        if state.is_world_process_zero:
            logger.warning("forgetwatch: stopping training at step %d: %s", step, reason)

    # -- base snapshot and resume --------------------------------------------------------------

    def _score(self, model, show_progress: bool = False) -> Answers:
        """Every rank scores its share of the probes; each gets all the answers."""
        return self._scorer(model, batch_size=self.config.batch_size, show_progress=show_progress,
                            distributed=True)

    def _base_snapshot(self, model, args, state, resumed: bool) -> tuple[Answers, bool]:
        """The base answers, and whether they were computed now (rather than loaded).

        Rank 0 decides from its files whether one is found, and shares it, so every rank
        either loads the same answers or joins in computing them."""
        scope: Any = contextlib.nullcontext()
        if self._base_given == ADAPTER_DISABLED:  # scored afresh every time, never read back
            scope, expected = adapters_disabled(model), {"model_key": model_key(model), "base": ADAPTER_DISABLED}
        elif isinstance(self._base_given, Answers):
            return self._given_base(self._base_given), False
        else:
            expected = {"model_key": model_key(model), "weights_key": weights_key(model)}
            found = Ranks.all().share_from_rank_zero(
                lambda: _as_dict(self._stored_base(args, state, resumed, expected)))
            if found is not None:
                return Answers.from_dict(found), False
        with scope:
            answers = self._score(model, show_progress=self.config.verbose and state.is_world_process_zero)
        answers.meta.update(expected)
        if self._writes:
            self._store.save_snapshot(answers)
        return answers, True

    def _given_base(self, given: Answers | str | os.PathLike[str]) -> Answers:
        answers = given if isinstance(given, Answers) else Answers.load(given, probes=self.probes)
        # any model's answers may serve as the base, if they cover these probes, scored alike
        problem = self._mismatch(answers, {})
        if problem:
            raise AnswersMismatchError(f"base={given!s:.80} was computed for {problem}; "
                                       "it cannot be this run's base")
        if self._writes:  # kept with the run, so a resume finds it
            self._store.save_snapshot(answers)
        return answers

    def _stored_base(self, args, state, resumed: bool, expected: dict[str, str]) -> Answers | None:
        """The base answers from files (run on rank 0): the ``base=`` file, the checkpoint's
        snapshot on resume, or a cached snapshot of the same model and weights."""
        if self._base_given is not None:
            return self._given_base(self._base_given)
        if resumed:
            return self._resumed_snapshot(args, state, {"model_key": expected["model_key"]})
        cached = self._load_snapshot(self._store.dir)
        if cached is None:
            return None
        problem = self._mismatch(cached, expected)
        if problem is None:
            logger.info("forgetwatch: reusing the base snapshot in %s", self._store.snapshot_path)
            return cached
        logger.warning("forgetwatch: the cached base snapshot %s is for %s; computing a new one",
                       self._store.snapshot_path, problem)
        return None

    def _resumed_snapshot(self, args, state, expected: dict[str, str]) -> Answers:
        """The original run's snapshot: the weights resumed with have moved and must never
        stand in for the base. One for these probes and options is required; the model's
        configuration is only compared, since loading it again may change it harmlessly."""
        found: list[tuple[Path, Answers]] = []
        rejected = []
        for directory in self._resume_dirs(args, state):
            answers = self._load_snapshot(directory)
            if answers is None:
                continue
            problem = self._mismatch(answers, {})
            if problem:
                rejected.append(f"{directory}: for {problem}")
            else:
                found.append((directory, answers))
        if not found:
            looked = ", ".join(map(str, self._resume_dirs(args, state)))
            why = f" ({'; '.join(rejected)})" if rejected else ""
            raise FileNotFoundError(
                f"resuming at step {state.global_step}, but no base snapshot for these probes and scoring "
                f"options was found in {looked}{why}; the resumed weights have moved, so they cannot stand "
                "in for the base: pass base=PATH with the original run's base_answers.npz")
        for directory, answers in found:
            if self._mismatch(answers, expected) is None:
                return answers
        directory, answers = found[0]
        logger.warning("forgetwatch: resuming with the base snapshot in %s, made for a model of another "
                       "configuration than this one", directory)
        return answers

    def _load_snapshot(self, directory: Path) -> Answers | None:
        try:
            return RunStore(directory).load_snapshot()
        except ValueError as err:  # a damaged file: say so and look further
            logger.warning("forgetwatch: ignoring %s", err)
            return None

    def _mismatch(self, answers: Answers, expected: dict[str, str]) -> str | None:
        """What makes ``answers`` unusable as this run's base, or ``None``."""
        if answers.probe_fingerprint != self._scorer.fingerprint:
            return "another probe set"
        if not answers.scored_like(self._scorer.scoring):
            return f"other scoring options ({answers.scoring} vs {self._scorer.scoring})"
        for key, value in expected.items():
            if answers.meta.get(key) != value:
                return "another model" if key == "model_key" else "other weights"
        return None

    def _resume_dirs(self, args, state) -> list[Path]:
        """Where a resumed run looks for its base snapshot and history, in order: the
        checkpoint it resumes from, then the run's own forgetwatch directory."""
        dirs = []
        resuming = resumed_checkpoint()
        if resuming:
            dirs.append(Path(resuming) / SUBDIR)
        dirs.append(self._checkpoint(args, state.global_step) / SUBDIR)
        dirs.append(self._store.dir)
        return list(dict.fromkeys(dirs))

    def _restore_history(self, args, state) -> None:
        """Keep the history up to the checkpoint's step; replay it through the stop rule."""
        def load() -> list[dict[str, Any]]:
            for directory in self._resume_dirs(args, state):
                records = RunStore(directory).load_history()
                if records:
                    return records
            return []

        records = Ranks.all().share_from_rank_zero(load)  # rank 0's files, on every rank
        self._records = [r for r in records if r["step"] <= state.global_step]
        category = {p.id: p.category for p in self.probes}
        self.history = [(r["step"], _with_category_ids(TransitionReport.from_dict(r["report"]), category))
                        for r in self._records]
        for r in self._records:
            self._stop_rule.update(r["report"])
        if self._writes:
            self._store.save_history(self._records)

    def _run_before_early_stopping(self) -> None:
        """Move this callback ahead of transformers' EarlyStoppingCallback, so the
        ``eval_forgetwatch_*`` metrics exist when it reads them."""
        from transformers import EarlyStoppingCallback

        if self._handler is None:
            return
        callbacks = self._handler.callbacks
        mine = next(i for i, cb in enumerate(callbacks) if cb is self)
        first = next((i for i, cb in enumerate(callbacks) if isinstance(cb, EarlyStoppingCallback)), None)
        if first is not None and first < mine:
            callbacks.insert(first, callbacks.pop(mine))


def _with_category_ids(report: TransitionReport, category: dict[str, str]) -> TransitionReport:
    """history.jsonl keeps the ids once; give each category report its own again."""
    children = {
        cat: dataclasses.replace(child, forgotten_ids=[i for i in report.forgotten_ids if category.get(i) == cat],
                                 gained_ids=[i for i in report.gained_ids if category.get(i) == cat])
        for cat, child in report.by_category.items()
    }
    return dataclasses.replace(report, by_category=children)


def _as_dict(answers: Answers | None) -> dict[str, Any] | None:
    return None if answers is None else answers.to_dict()


def _history_report(report: TransitionReport) -> dict[str, Any]:
    """The report for history.jsonl: ids once, at the top level, not again per category."""
    data = report.to_dict()
    for child in data["by_category"].values():
        child.pop("forgotten_ids", None)
        child.pop("gained_ids", None)
        child.pop("by_category", None)
    return data
