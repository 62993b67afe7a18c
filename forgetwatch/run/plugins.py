"""What plug-ins beside the monitor plug into: a repair method (:class:`~forgetwatch.Replay`) is told when training
begins, after each evaluation and before each optimizer step; a step after training
(:class:`~forgetwatch.MergeAtEnd`) when training begins and when it ends. Each keeps its own state."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from forgetwatch.common.distributed import Ranks
from forgetwatch.config import ADAPTER_DISABLED
from forgetwatch.results.events import Ending
from forgetwatch.results.report import TransitionReport
from forgetwatch.results.run_files import RunStore
from forgetwatch.run.base import adapters_disabled, model_key, weights_key


@dataclass
class RunContext:
    """What a repair method is told when training begins (``base``: ``"adapter_disabled"``, a ``base=``
    file, or ``None``; ``state``: its own from :meth:`~forgetwatch.Watch.load_state_dict`)."""

    ranks: Ranks
    writes: bool
    store: RunStore
    tokenizer: Any
    rows_per_batch: Any
    step: int = 0
    resume_dirs: Sequence[Path] = ()
    records: Sequence[Mapping[str, Any]] = ()
    last_report: TransitionReport | None = None
    base: Any = None
    base_answers: Any = None  # the run's base Answers
    state: Mapping[str, Any] | None = None
    sharded: bool = False
    precision: str = "weights"
    scorer: Any = None  # the run's Scorer of its probes
    scoring: Any = None
    _made_by: dict[str, str | None] | None = field(default=None, init=False, repr=False)

    @property
    def base_meta(self) -> Mapping[str, Any]:
        """What the base answers record of how they were made (their model's keys, the noise floor)."""
        return self.base_answers.meta if self.base_answers is not None else {}

    @property
    def reads_back(self) -> bool:
        """Whether what was measured on the base is read back (a resume), not measured again."""
        return self.step > 0 and self.base != ADAPTER_DISABLED

    def made_by(self, model: torch.nn.Module) -> dict[str, str | None]:
        """The base model's keys, which a file measured on the base must carry (on resume: the snapshot's)."""
        if self._made_by is None:  # once: the weights' key reads the parameters
            if self.reads_back:
                meta = self.base_meta if self.base is None else {}
                self._made_by = {"model": meta.get("model_key") or model_key(model), "weights": meta.get("weights_key")}
            else:
                self._made_by = {"model": model_key(model), "weights": weights_key(model, self.ranks)}
        return dict(self._made_by)

    def as_base(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        """The model as the base: with its adapters disabled for ``base="adapter_disabled"``."""
        return adapters_disabled(model) if self.base == ADAPTER_DISABLED else contextlib.nullcontext()


class Repairable(Protocol):
    """What offers a repair method with its defaults (a :class:`~forgetwatch.ReplayPool`)."""

    def as_repair(self) -> Repair: ...


@runtime_checkable
class Repair(Protocol):
    """A repair method: ``name`` keys its history entry and state file; ``files``: those it keeps with the run."""

    name: str
    files: tuple[str, ...]

    def hold_out(self, probes: Any) -> None:
        """Refuse (a ``ValueError`` naming both) training data that holds a probe, before any work."""

    def begin(self, model: torch.nn.Module, run: RunContext) -> None:
        """Training begins (or resumes): refuse what it cannot run under, restore its state."""

    def metrics(self) -> dict[str, float]:
        """Its figures since the last call, to log beside the evaluation's (``replay/loss``, ...)."""

    def state(self) -> dict[str, Any]:
        """Its state now, JSON-ready: kept in each history record and each checkpoint."""

    def on_evaluation(self, report: TransitionReport, model: torch.nn.Module) -> None:
        """An evaluation was made: adjust to it (borrow ``model``, hand it back as found)."""

    def before_optimizer_step(
        self, model: torch.nn.Module, *, max_grad_norm: float | None = None, grad_scaler: tuple[Any, Any] | None = None
    ) -> None:
        """After the backward pass, before the optimizer steps: add the repair's gradient."""


@runtime_checkable
class AfterTraining(Protocol):
    """A step run once on the final weights when training ends; ``name`` keys its figures."""

    name: str

    def begin(self, model: torch.nn.Module, run: RunContext) -> None:
        """Training begins (or resumes): keep what the end needs; refuse (raise) what it cannot run under."""

    def end(self, model: torch.nn.Module, step: int) -> Ending | None:
        """Training ended at ``step``: run on ``model`` (borrowed, handed back as found); ``None`` when off."""
