"""ForgetWatchCallback: a transformers / TRL trainer's events, adapted to a Watch and its plug-ins (replay, merge)."""

from __future__ import annotations

import logging
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from torch.nn import Module
from transformers import TrainerCallback
from transformers import TrainerControl as Control
from transformers import TrainerState as State
from transformers import TrainingArguments as Args

from forgetwatch.common.distributed import Ranks
from forgetwatch.config import ForgetWatchConfig
from forgetwatch.integrations.trainer_link import TrainerLink, grad_scaler, sharded_run, trainer_sinks
from forgetwatch.merge.at_end import MergeAtEnd
from forgetwatch.probes import ProbesLike
from forgetwatch.replay import Replay, ReplayPool
from forgetwatch.results.events import Evaluation
from forgetwatch.run.train_kl.rows import TrainRows, training_rows
from forgetwatch.run.watch import Watch, failure
from forgetwatch.sinks.logged import eval_metric_values
from forgetwatch.store import SUBDIR

logger = logging.getLogger("forgetwatch")

#: the key of the watch's state in a checkpoint's trainer_state.json ``stateful_callbacks``
STATE_KEY = "ForgetWatch"


def _plug_ins(watch: Watch, replay: Any, merge_at_end: Any) -> tuple[Replay | None, MergeAtEnd | None]:
    """The plug-ins checked before any work; replay's figures and state kept with the watch's."""
    if replay is not None and not isinstance(replay, (Replay, ReplayPool)):
        raise TypeError(
            f"replay={replay!r}: give a ReplayPool (ReplayPool.from_jsonl(path)), or Replay(pool, ...) for its options"
        )
    if merge_at_end is not None and not isinstance(merge_at_end, MergeAtEnd):
        raise TypeError(
            f"merge_at_end={merge_at_end!r}: give forgetwatch.MergeAtEnd(target=...), naming what the "
            "training was for (held-out texts or a probe set), so the sweep can weigh gain against forgetting"
        )
    if isinstance(replay, ReplayPool):  # replayed with the defaults
        replay = Replay(replay)
    if replay is not None:
        replay.hold_out(watch.probes)  # nothing trains on the probes: refused now, before any work
        watch.keep(replay)
    return replay, merge_at_end


def _of_watch(name: str, doc: str) -> property:
    return property(lambda self: getattr(self.watch, name), doc=doc)


class ForgetWatchCallback(TrainerCallback):
    """Measure per-sample forgetting on a probe set while a transformers / TRL trainer trains.

    A :class:`~forgetwatch.Watch` (``callback.watch``, whose ``history``, ``trajectory``, ... it shows) does the
    work (docs/trainer.md); a failure of forgetwatch during training is a loud warning, never an exception. List it
    before transformers' ``EarlyStoppingCallback``, which reads the ``eval_forgetwatch_*`` metrics.

    Args:
        probes: a :class:`~forgetwatch.ProbeSet`, a probe file's path or probe rows; or a
            :class:`~forgetwatch.Watch` made beforehand (then no ``settings``).
        settings: the :class:`~forgetwatch.Watch`'s keywords (``output_dir`` defaults to
            ``<trainer output_dir>/forgetwatch``).
        replay: a :class:`~forgetwatch.Replay` (or a :class:`~forgetwatch.ReplayPool`, with the defaults).
        merge_at_end: a :class:`~forgetwatch.MergeAtEnd`: when training ends, sweep the interpolation between the
            base and the final weights and log ``forgetwatch/merge/*`` (the trained model stays as it is).
        trainer: the trainer (then ``trainer.add_callback(callback)``): the metrics reach every reporting
            integration, and a ``GRPOTrainer``'s chat template renders train-KL prompts.

    Example:
        >>> trainer = SFTTrainer(model=model, train_dataset=ds,
        ...                      callbacks=[ForgetWatchCallback(probes, eval_steps=50)])  # doctest: +SKIP
    """

    def __init__(
        self,
        probes: ProbesLike | Watch | None = None,
        *,
        replay: Replay | ReplayPool | None = None,
        merge_at_end: MergeAtEnd | None = None,
        trainer: Any = None,
        **settings: Any,
    ):
        if isinstance(probes, Watch):
            if settings:
                raise TypeError(
                    f"ForgetWatchCallback(watch, {', '.join(f'{k}=...' for k in settings)}): a Watch has its "
                    "settings already; give them to Watch(...), or give the probes here instead of a Watch"
                )
            self.watch = probes
        else:
            try:
                self.watch = Watch(probes, **settings)
            except TypeError as err:  # an unknown keyword: named as the caller wrote it
                raise TypeError(str(err).replace("Watch()", "ForgetWatchCallback()", 1)) from None
        self.replay, self.merge_at_end = _plug_ins(self.watch, replay, merge_at_end)
        self._link = TrainerLink(self, trainer)
        self._eval_logged_at: int | None = None

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str], **keywords: Any) -> ForgetWatchCallback:
        """A callback with a YAML file's settings (flat keys, see ``configs/``); ``keywords`` win.

        Example:
            >>> cb = ForgetWatchCallback.from_yaml("configs/early_stop_adjusted_5pct.yaml", eval_steps=10)
            >>> cb.config.eval_steps, cb.config.max_forgetting
            (10, 0.05)
        """
        return cls(**{**dict(ForgetWatchConfig.from_yaml(path)), **keywords})

    history = _of_watch("history", "``(global_step, TransitionReport)`` per evaluation so far.")
    trajectory = _of_watch("trajectory", "Every probe's verdict at every evaluation (a Trajectory).")
    base_answers = _of_watch("base_answers", "The base model's answers, once training began.")
    stop_reason = _of_watch("stop_reason", "Why the run was stopped, if it was.")
    monitoring_seconds = _of_watch("monitoring_seconds", "Wall time spent monitoring so far.")
    config = _of_watch("config", "The settings in force (a ForgetWatchConfig).")

    @property
    def ending(self) -> Any:
        """What ``merge_at_end`` found when training ended (an Ending), if it ran."""
        return self.merge_at_end.ending if self.merge_at_end is not None else None

    summary = _of_watch("summary", "What the run measured, as text: ``callback.summary()``.")

    # -- trainer events ------------------------------------------------------------------------

    def on_train_begin(self, args: Args, state: State, control: Control, model: Module, **kw: Any) -> None:
        link = self._link
        link.attach(args, state, control, model=model, **kw)
        processing_class = kw.get("processing_class")
        tokenizer = getattr(processing_class, "tokenizer", processing_class)
        if tokenizer is None:
            raise ValueError("ForgetWatchCallback needs a tokenizer: give the trainer processing_class=")
        # the trainer loaded the checkpoint's trainer_state.json before this event, whatever
        # restore_callback_states_from_checkpoint says
        kept = (state.stateful_callbacks or {}).get(STATE_KEY) if state.global_step > 0 else None
        if kept is not None:
            self.watch.load_state_dict(kept)
        self.watch._start(
            model,
            tokenizer,
            step=state.global_step,
            output_dir=link.run_dir() / SUBDIR,
            max_steps=state.max_steps,
            train_rows=self._train_rows(args, kw.get("train_dataloader"), processing_class or tokenizer),
            sinks=trainer_sinks(link, self.watch.probes, self.watch.config.output.table_rows),
            sharded=sharded_run(args),
            stop_note=self._stop_note,
            origin=self._origin(args, state),
        )
        for plugin in (self.replay, self.merge_at_end):  # they take the base from the model as the watch found it
            if plugin is not None:
                plugin.begin(model, self.watch.view)
        self._keep_state(state)

    @staticmethod
    def _origin(args: Args, state: State) -> Path | None:
        """The run directory resumed from, when the arguments name it (ms-swift resumes into a new output folder)."""
        given = getattr(args, "resume_from_checkpoint", None)
        return Path(given).parent / SUBDIR if state.global_step > 0 and isinstance(given, str) and given else None

    def _train_rows(self, args: Args, loader: Any, tokenizer: Any) -> TrainRows | None:
        """A seeded sample of the training rows for train KL, read on rank 0 and shared; ``None``, said, if none."""
        n = self.watch.config.monitor.train_kl_rows
        if n <= 0:
            return None

        def read() -> dict[str, Any]:  # on rank 0; a GRPO prompt is tokenized as its trainer does
            dataset = getattr(loader, "dataset", None)
            rows, reason = training_rows(dataset, n, 0, args=args, tokenizer=tokenizer, trainer=self._link.trainer)
            return {"reason": reason} if rows is None else asdict(rows)

        ranks = Ranks.all()
        found = ranks.share_from_rank_zero(read)
        if "reason" in found:
            if ranks.index == 0:
                logger.info("forgetwatch: train KL (forgetwatch/drift/train_kl) is off: %s", found["reason"])
            return None
        return TrainRows(**{**found, "rows": [(list(ids), int(start)) for ids, start in found["rows"]]})

    def _stop_note(self, step: int) -> str:
        saving = self.watch.config.monitor.save_on_stop
        return f"; saving checkpoint {self._link.checkpoint_dir(step)}" if saving else ""

    def on_step_end(self, args: Args, state: State, control: Control, model: Module, **kw: Any) -> None:
        if self.watch.due(state.global_step):
            self._evaluated(self.watch.evaluate(model, state.global_step), control, model)
        self._keep_state(state)

    def _keep_state(self, state: State) -> None:
        """The watch's state where the next checkpoint writes it (``stateful_callbacks``), kept current. Not an
        ``ExportableState``: the trainer would build such a callback again from JSON alone, without its probes."""
        state.stateful_callbacks = {**(state.stateful_callbacks or {}), STATE_KEY: self.watch.state_dict()}

    def on_epoch_end(self, args: Args, state: State, control: Control, model: Module, **kw: Any) -> None:
        # however training stops, this runs while every integration is still open, and before a save
        if not control.should_training_stop:
            return
        step, watch = state.global_step, self.watch
        self._evaluated(watch.finish(model, step, close=False), control, model)  # the trainer may save after this
        if self.merge_at_end is not None:  # on the final weights, while every integration is open
            self.merge_at_end.end(model, step)
        saved = self._link.checkpoint_dir(step).is_dir()
        if watch.stop_step == step and watch.config.monitor.save_on_stop and not saved:
            control.should_save = True  # e.g. save_strategy="best" overrode the request

    def on_evaluate(self, args: Args, state: State, control: Control, model: Module, **kw: Any) -> None:
        watch, step, metrics = self.watch, state.global_step, kw.get("metrics")
        if not watch.config.monitor.eval_on_evaluate or watch.base_answers is None:
            return
        if not self._link.open:  # after train(): the weights may have changed (best model loaded)
            try:
                report = watch.measure(model)  # scored afresh, outside the run's history
            except Exception as err:  # noqa: BLE001 - a failure of ours never stops the trainer's evaluation
                if watch.view.writes:
                    what, trace = failure(err)
                    logger.warning("forgetwatch: %s; no forgetwatch metrics for this evaluation", what, exc_info=trace)
                return
        elif watch.evaluated(step):
            report = watch.history[-1][1]
        else:
            evaluation = watch.evaluate(model, step, "evaluate")
            if evaluation is None:  # skipped, said
                return
            self._evaluated(evaluation, control, model)
            report = evaluation.report
        extra = eval_metric_values(report)
        if metrics is not None:  # the dict best-model selection and EarlyStoppingCallback read
            metrics.update(extra)
        if self._eval_logged_at != step or not self._link.open:  # once per step
            self._eval_logged_at = step
            self._link.state, self._link.control = state, control
            self._link.emit(extra)

    def on_train_end(self, args: Args, state: State, control: Control, model: Module, **kw: Any) -> None:
        # a fallback: integrations may be closed now, so the result goes to the history only
        self._link.close()
        self._evaluated(self.watch.finish(model, state.global_step, close=False), control, model)
        if self.merge_at_end is not None:  # once: not when on_epoch_end ran it
            self.merge_at_end.end(model, state.global_step)
        self.watch.close()  # a last try for any write owed, the directory freed

    def on_log(self, args: Args, state: State, control: Control, logs: dict[str, float], **kw: Any) -> None:
        # the trainer's final summary line (printed after this) says forgetwatch stopped it
        if "train_runtime" in logs and self.watch.stop_step is not None:
            logs["forgetwatch_stopped_at_step"] = self.watch.stop_step

    def on_pre_optimizer_step(self, args: Args, state: State, control: Control, model: Module, **kw: Any) -> None:
        # after the trainer's backward (and its clipping): the replay gradient joins it
        if self.replay is not None:
            scaler = grad_scaler(kw.get("optimizer"))
            self.replay.before_optimizer_step(model, max_grad_norm=args.max_grad_norm, grad_scaler=scaler)

    def _evaluated(self, evaluation: Evaluation | None, control: Control, model: Module) -> None:
        """Replay follows the evaluation's forgetting; every rank stops together, saving first if asked."""
        if evaluation is not None and self.replay is not None:
            self.replay.on_evaluation(evaluation.report, model)
        if evaluation is not None and self._link.state is not None:
            self._keep_state(self._link.state)
        if evaluation is not None and evaluation.stop:
            control.should_training_stop = True
            control.should_save = control.should_save or self.watch.config.monitor.save_on_stop
