"""ForgetWatchCallback: a transformers / TRL trainer's events, adapted to a :class:`~forgetwatch.Watch`.

Everything that is not about transformers lives in the watch; the trainer's internals are
reached through :class:`~forgetwatch.trainer_bridge.TrainerLink` only.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from .answers import Answers
from .config import ForgetWatchConfig
from .probes import ProbesLike
from .repair import Repair
from .replay import ReplayPool
from .settings import Output, Schedule, Scoring, Signals, Stopping
from .sinks import eval_metric_values
from .sinks.hook import OnForgetting
from .sinks.tensorboard import TensorBoardText
from .sinks.trainer_log import TrainerLog, WhileTraining
from .sinks.wandb import WandbSection
from .store import SUBDIR
from .trainer_bridge import TrainerLink, sharded_run
from .watch import Watch

#: keywords of the callback itself; every other keyword is a ForgetWatchConfig setting
_OWN = ("probes", "base", "tokenizer", "on_forgetting", "trainer", "replay", "refusal_detector", "clock", "sinks")


class ForgetWatchCallback(TrainerCallback):
    """Measure per-sample forgetting on a probe set while a transformers / TRL trainer trains.

    The base model's answers are scored once when training begins (or loaded: ``base=``, a
    cached snapshot, or the checkpoint's copy on resume); then the live model is re-scored
    every ``eval_steps`` optimizer steps, or as often as ``max_overhead`` of wall time allows,
    and at trainer evaluations and the end of training. Each evaluation is logged as
    ``forgetwatch/*`` metrics to every reporting integration (W&B, TensorBoard, ...), written
    to ``history.jsonl``, printed as one line, passed to ``on_forgetting`` and the ``sinks``, and
    checked against ``max_forgetting``. A file that cannot be written or a logger that fails
    during training is a loud warning, never an exception out of the trainer. The work is done
    by a :class:`~forgetwatch.Watch` (``callback.watch``); this class adapts the trainer's events.

    Args:
        probes: a :class:`~forgetwatch.ProbeSet`, the path of a probe JSONL file, or a list of
            probe rows (dicts in the probe-file schema).
        eval_steps: evaluate every N optimizer steps (default ``None``: the ``max_overhead`` budget).
        max_forgetting: stop training once the forgetting rate exceeds this (default ``None``:
            never stop).
        output_dir: where snapshot and history live (default ``None``:
            ``<trainer output_dir>/forgetwatch``, or the trial's ``run-*`` folder in a
            hyperparameter search).
        base: base answers to compare against (an :class:`~forgetwatch.Answers` or its file)
            instead of scoring the model at the start; or ``"adapter_disabled"`` to score a PEFT
            (LoRA) model with its adapters disabled, when training begins and on every resume.
        tokenizer: defaults to the trainer's ``processing_class``.
        scoring, schedule, stopping, signals, output: the settings of each group (see
            :mod:`forgetwatch.settings`), e.g. ``scoring=Scoring(batch_size=16)``.
        replay: a :class:`~forgetwatch.ReplayPool` (or its file) to repair forgetting with, or a
            repair method (default ``None``: no repair). A pool holding a probe's question is refused.
        sinks: more places each evaluation goes (see :mod:`forgetwatch.sinks`).
        on_forgetting: ``callable(report, step)`` run after each evaluation, on every rank.
        trainer: the trainer running this callback, if known; otherwise it is found when
            training begins (see :mod:`forgetwatch.trainer_bridge`).
        **settings: passed to the :class:`~forgetwatch.Watch`: ``config`` (a
            :class:`~forgetwatch.config.ForgetWatchConfig`, which the keywords above override),
            ``refusal_detector``, ``clock``, and the flat settings of earlier releases
            (``replay_weight=``, ``batch_size=``, ...: a ``FutureWarning`` names the new form).

    Attributes:
        watch: the :class:`~forgetwatch.Watch` doing the work.
        history: ``(global_step, TransitionReport)`` per evaluation.
        trajectory: every probe's correctness at the base and each evaluation (``None`` before
            training begins).
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
    """

    def __init__(
        self,
        probes: ProbesLike | None = None,
        *,
        eval_steps: int | None = None,
        max_forgetting: float | None = None,
        output_dir: str | os.PathLike[str] | None = None,
        base: Answers | str | os.PathLike[str] | None = None,
        tokenizer: Any = None,
        scoring: Scoring | None = None,
        schedule: Schedule | None = None,
        stopping: Stopping | None = None,
        signals: Signals | None = None,
        output: Output | None = None,
        replay: Repair | ReplayPool | str | os.PathLike[str] | None = None,
        sinks: Iterable[Any] = (),
        on_forgetting: OnForgetting | None = None,
        trainer: Any = None,
        **settings: Any,
    ):
        self.watch = Watch(probes, eval_steps=eval_steps, max_forgetting=max_forgetting, output_dir=output_dir,
                           base=base, scoring=scoring, schedule=schedule, stopping=stopping, signals=signals,
                           output=output, replay=replay, sinks=sinks, on_forgetting=on_forgetting, **settings)
        self.tokenizer = tokenizer
        self._link = TrainerLink(self, trainer)
        self._eval_logged_at: int | None = None

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

    # -- what the watch knows --------------------------------------------------------------------

    config = property(lambda self: self.watch.config, doc="The settings (a ForgetWatchConfig).")
    probes = property(lambda self: self.watch.probes, doc="The probe set.")
    history = property(lambda self: self.watch.history, doc="(global_step, TransitionReport) per evaluation.")
    trajectory = property(lambda self: self.watch.trajectory, doc="Every probe's correctness so far.")
    base_answers = property(lambda self: self.watch.base_answers, doc="The base model's answers.")
    stop_reason = property(lambda self: self.watch.stop_reason, doc="Why forgetwatch stopped training, or None.")
    monitoring_seconds = property(lambda self: self.watch.monitoring_seconds, doc="Wall time spent in forgetwatch.")
    output_dir = property(lambda self: self.watch.output_dir, doc="Where snapshot and history go.")
    history_path = property(lambda self: self.watch.history_path, doc="The history file.")
    on_forgetting = property(lambda self: self.watch.on_forgetting, doc="The hook run after each evaluation.")

    def summary(self) -> str:
        """What to print when training ends (see :meth:`forgetwatch.Watch.summary`).

        Example:
            >>> trainer.train(); print(callback.summary())  # doctest: +SKIP
        """
        return self.watch.summary()

    # -- trainer events ------------------------------------------------------------------------

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       model: torch.nn.Module | None = None, processing_class: Any = None, **kwargs: Any) -> None:
        link = self._link
        link.attach(args, state, control)
        tokenizer = self.tokenizer or getattr(processing_class, "tokenizer", processing_class)
        if tokenizer is None:
            raise ValueError("ForgetWatchCallback needs a tokenizer: pass processing_class to the "
                             "trainer or tokenizer= to the callback")
        step = state.global_step
        resume_from = [p / SUBDIR for p in (link.resuming, link.checkpoint_dir(step)) if p is not None]
        checkpoints = sorted(link.run_dir().glob(f"checkpoint-*/{SUBDIR}"))
        if link.resuming is not None:
            checkpoints.append(link.resuming / SUBDIR)
        self.watch.start(model, tokenizer, step=step, output_dir=link.run_dir() / SUBDIR,
                         resume_from=resume_from if step > 0 and link.resuming else [], leftovers_in=checkpoints,
                         sinks=self._trainer_sinks(),
                         max_steps=state.max_steps, sharded=sharded_run(args), stop_note=self._stop_note)

    def _trainer_sinks(self) -> list[Any]:
        """The trainer's integrations as sinks: W&B's section and tables, TensorBoard's text,
        then the log every integration reads."""
        link, probes, rows = self._link, self.watch.probes, self.watch.config.output.table_rows
        wandb_cb, tensorboard_cb = link.integration("WandbCallback"), link.integration("TensorBoardCallback")
        wandb = WandbSection(probes, rows, run=lambda: getattr(getattr(wandb_cb, "_wandb", None), "run", None)) \
            if wandb_cb is not None else None
        tensorboard = TensorBoardText(probes, lambda: getattr(tensorboard_cb, "tb_writer", None), rows) \
            if tensorboard_cb is not None else None
        return [WhileTraining(link, s) for s in (wandb, tensorboard) if s is not None] + [TrainerLog(link, wandb)]

    def _stop_note(self, step: int) -> str:
        return f"; saving checkpoint {self._link.checkpoint_dir(step)}" if self.watch.config.stopping.save_on_stop else ""

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    model: torch.nn.Module | None = None, **kwargs: Any) -> None:
        if self.watch.due(state.global_step):
            self._evaluated(self.watch.evaluate(model, state.global_step), control)

    def on_epoch_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     model: torch.nn.Module | None = None, **kwargs: Any) -> None:
        # however training stops (max_steps, a callback, data running out), this runs before
        # the trainer finalizes, while every integration is still open; and the trainer
        # saves after it if asked to
        if not control.should_training_stop:
            return
        step = state.global_step
        self._evaluated(self.watch.finish(model, step), control)
        if (self.watch.stop_step == step and self.watch.config.stopping.save_on_stop
                and not self._link.checkpoint_dir(step).is_dir()):
            control.should_save = True  # e.g. save_strategy="best" overrode the request

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    metrics: dict[str, float] | None = None, model: torch.nn.Module | None = None,
                    **kwargs: Any) -> None:
        watch, step = self.watch, state.global_step
        if not watch.config.schedule.eval_on_evaluate or watch.base_answers is None:
            return
        if not self._link.open:
            # after train(): the weights may have changed (best model loaded); score them
            # afresh, outside the run's history
            report = watch.measure(model)
        elif watch.evaluated(step):
            report = watch.history[-1][1]
        else:
            evaluation = watch.evaluate(model, step, "evaluate")
            self._evaluated(evaluation, control)
            report = evaluation.report
        extra = eval_metric_values(report)
        if metrics is not None:  # the dict best-model selection and EarlyStoppingCallback read
            metrics.update(extra)
        if self._eval_logged_at != step or not self._link.open:  # once per step
            self._eval_logged_at = step
            self._link.state, self._link.control = state, control
            TrainerLog(self._link).send(extra)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     model: torch.nn.Module | None = None, **kwargs: Any) -> None:
        # a fallback: integrations may be closed now, so the result goes to the history only
        self._link.open = False
        self.watch.finish(model, state.global_step)
        self.watch.flush()  # a last try for anything a failed write left in memory

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        # the trainer's final summary line (printed after this) says forgetwatch stopped it
        if logs is not None and "train_runtime" in logs and self.watch.stop_step is not None:
            logs["forgetwatch_stopped_at_step"] = self.watch.stop_step

    def on_pre_optimizer_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                              model: torch.nn.Module | None = None, **kwargs: Any) -> None:
        # after the trainer's backward (and its clipping): the repair's gradient joins it
        if self.watch.repair is not None:
            self.watch.before_optimizer_step(model, max_grad_norm=args.max_grad_norm,
                                             grad_scaler=self._link.grad_scaler())

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self._copy_into_checkpoint(state.global_step)

    def on_push_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                      **kwargs: Any) -> None:
        # the trainer pushes a checkpoint before on_save: put the files in it first
        self._copy_into_checkpoint(state.global_step)

    # -- inside ---------------------------------------------------------------------------------

    def _copy_into_checkpoint(self, step: int) -> None:
        checkpoint = self._link.checkpoint_dir(step)
        if checkpoint.is_dir():
            self.watch.save_to(checkpoint / SUBDIR)

    def _evaluated(self, evaluation: Any, control: TrainerControl) -> None:
        """Every rank stops together (the watch's rule is rank 0's); the trainer saves first if asked."""
        if evaluation is not None and evaluation.stop:
            control.should_training_stop = True
            if self.watch.config.stopping.save_on_stop:
                control.should_save = True

