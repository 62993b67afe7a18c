"""MergeAtEnd: the merge sweep run on the final weights when a watched training ends, the base kept since its start."""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from forgetwatch.common.files import check_replaceable_folder
from forgetwatch.common.text import first_line
from forgetwatch.merge.sweep import (
    ALPHAS,
    MergeSweep,
    Sweeper,
    check_fraction,
    checked_alphas,
    checked_max_length,
    checked_span,
    checked_target,
)
from forgetwatch.merge.weights import is_lora, lora_layers
from forgetwatch.probes import ProbesLike
from forgetwatch.results.answers import Answers
from forgetwatch.results.events import Ending
from forgetwatch.run.plugins import RunView
from forgetwatch.scoring.borrow import unwrap
from forgetwatch.store import MERGED, SWEEP_TABLE

logger = logging.getLogger("forgetwatch")

PREFIX = "forgetwatch/merge/"


def _checked_save(save: Any) -> bool:
    if not isinstance(save, bool):
        raise TypeError(f"MergeAtEnd: save is True or False, got {save!r}")
    return save


#: each option's check, on its own: a framework's settings name the one that is wrong
OPTIONS: dict[str, Callable[[Any], Any]] = {
    "keep": lambda keep: check_fraction("keep", keep),
    "alphas": checked_alphas,
    "by_layer": checked_span,
    "save": _checked_save,
    "max_length": checked_max_length,
}


class MergeAtEnd:
    """When training ends, sweep θ(α) = θ_base + α·(θ_final − θ_base) on the run's probes and ``target``, log
    ``forgetwatch/merge/alpha``, ``.../forgetting`` and ``.../gain`` for the α :meth:`MergeSweep.best` chooses, and
    say it in one line. The trainer's model and checkpoints are left as trained. A plug-in beside the watch: give it
    to :class:`~forgetwatch.ForgetWatchCallback` (``merge_at_end=``), or, in any loop, call :meth:`begin` with
    ``watch.view`` once the watch has started and :meth:`end` after :meth:`~forgetwatch.Watch.finish`.

    From the start of training a CPU copy of every floating-point weight is kept (the model's size in its dtype: a
    weight unfrozen later moves back too; a PEFT model keeps nothing: its adapters off are the base); at the end a
    second CPU copy of the weights that moved is made while the sweep runs. α = 0 is checked against the run's base
    snapshot: judged otherwise (beyond the base's measured noise), the sweep is a warning and nothing is written.
    Every rank sweeps (the probes shared among them); rank 0 writes ``sweep.csv`` and ``sweep.json`` into the run
    directory (the report page shows them) and, with ``save=True``, the model at the chosen α into ``merged/``
    (a ``merged`` there that is not a folder is refused before training).

    Args:
        target: what the training was for: held-out texts (mean loss per token) or a probe set (accuracy).
        keep: the share of the final model's target gain the chosen α must keep (default 0.9).
        alphas: the α to try (default 0, 0.1, ..., 1).
        by_layer: also revert one group of layers at a time (see :func:`~forgetwatch.merge_sweep`).
        save: write the model at the chosen α (safetensors and tokenizer; for a PEFT model its rescaled adapter).
        max_length: target texts are cut to this many tokens.

    Attributes:
        sweep: the :class:`~forgetwatch.MergeSweep` once training ended (``None`` before, or when it did not run).
        ending: what it logged and said then (an :class:`~forgetwatch.results.events.Ending`; ``None`` likewise).

    Example:
        >>> callback = ForgetWatchCallback(probes, merge_at_end=MergeAtEnd(target=held_out_code))  # doctest: +SKIP
    """

    name = "merge"

    def __init__(
        self,
        target: ProbesLike | Sequence[str],
        *,
        keep: float = 0.9,
        alphas: Sequence[float] = ALPHAS,
        by_layer: bool | int = False,
        save: bool = False,
        max_length: int = 1024,
    ):
        # every bad option fails here, before any training
        self.target = checked_target(target)
        given = {"keep": keep, "alphas": alphas, "by_layer": by_layer, "save": save, "max_length": max_length}
        self.keep, self.alphas, self.by_layer, self.save, self.max_length = (OPTIONS[k](v) for k, v in given.items())
        self.sweep: MergeSweep | None = None
        self.ending: Ending | None = None
        self._base: dict[str, torch.Tensor] | None = None
        self._base_answers: Answers | None = None
        self._run: RunView | None = None
        self._sweeper: Sweeper | None = None

    def begin(self, model: torch.nn.Module, run: RunView) -> None:
        """Keep the base (a CPU copy of every floating-point weight; a PEFT model's adapters off need nothing) and
        the run's base answers, what α = 0 must be judged as."""
        self._run, self._base, self._base_answers, self.sweep, self.ending = None, None, None, None, None
        if run.sharded:
            raise ValueError(
                "merge_at_end cannot sweep a sharded model (FSDP, DeepSpeed ZeRO-3); after training, run "
                "`forgetwatch merge --base BASE --model FINAL ...` on the saved model"
            )
        if self.save:  # refused now, not after training (every rank raises, or none)
            try:
                run.ranks.share_from_rank_zero(lambda: check_replaceable_folder(run.store.dir / MERGED))
            except FileExistsError as err:
                raise ValueError(f"MergeAtEnd(save=True): {err}") from None
        if is_lora(model):
            lora_layers(model)  # an adapter it cannot move back to the base is refused now
        elif run.step > 0:  # the weights now are not the base's, and the base's were not kept
            if run.writes:
                logger.warning(
                    "forgetwatch: merge_at_end is off for this resumed run: its starting weights are not the base's; "
                    "after training, run `forgetwatch merge --base BASE --model FINAL ...`"
                )
            return
        else:  # every floating weight, trainable now or not: one unfrozen later moves back to the base too
            self._base = {
                name: p.detach().to("cpu", copy=True)
                for name, p in unwrap(model).named_parameters()
                if p.is_floating_point()
            }
        self._base_answers = run.base_answers
        # the run's own scorer: the probes tokenized once, scored as every evaluation scores them
        self._sweeper = Sweeper(model, run.scorer, self.target, run.scoring, self.max_length)
        self._run = run

    def end(self, model: torch.nn.Module, step: int) -> Ending | None:
        """Training ended at ``step``: sweep the final weights once, log the chosen α's figures through the run and
        write the files on rank 0; ``None`` when off. A failure is a warning: the model is as training left it."""
        run, self._run = self._run, None  # once
        if run is None or self._sweeper is None:
            return None
        try:
            ending = self._end(run, model, step)
        except Exception as err:  # noqa: BLE001 - a failure of ours never ends the trainer's run in an exception
            if run.writes:
                logger.warning(
                    "forgetwatch: merge_at_end failed (%s: %s); the trained model is as training left it",
                    type(err).__name__,
                    err,
                )
            return None
        self.ending = ending
        run.tell(ending)
        return ending

    def _end(self, run: RunView, model: torch.nn.Module, step: int) -> Ending:
        sweeper = self._sweeper
        sweep = sweeper.run(
            self._base, model, self.alphas, self.by_layer, base_answers=self._base_answers, distributed=True
        )
        self.sweep = sweep
        best = sweep.best(self.keep)
        i = sweep.alphas.index(best)
        figures = {"alpha": best, "forgetting": sweep.forgetting(i), "gain": sweep.gain[i]}
        metrics = {PREFIX + k: float(v) for k, v in figures.items() if v is not None and math.isfinite(v)}
        saved = ""
        if run.writes:
            sweep.write(run.store.dir, self.keep)
            if self.save:
                folder = os.path.join(run.store.dir, MERGED)
                try:
                    sweep.save(best, folder, run.tokenizer)
                    saved = f"; written to {folder}"
                except OSError as err:  # the sweep's figures stand; the model is as training left it
                    logger.warning("forgetwatch: merge_at_end: %s", first_line(err))
                    saved = "; the merged model was not written (see the warning)"
        r, one = sweep.reports[i], sweep.reports[-1]
        kept = (
            "alpha 1 gained nothing on the target"
            if sweep.gain[i] is None
            else f"keeps {sweep.gain[i]:.0%} of the gain"
        )
        line = (
            f"merging with the base at alpha {best:g} {kept} with {r.forgotten} of the probes forgotten "
            f"(the final model: {one.forgotten}){saved}; table {os.path.join(run.store.dir, SWEEP_TABLE)}"
        )
        return Ending(step, metrics, line)
