"""What a repair method (replay today) plugs into: the run tells it when training begins, after
each evaluation and before each optimizer step; it keeps and restores its own state.

A repair method is any object with the methods of :class:`Repair`. The run knows nothing of
pools, samplers or caches: :class:`~forgetwatch.Replay` is one such object, and a
second method is a sibling of ``replay/``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from forgetwatch.common.distributed import Ranks
from forgetwatch.config import ADAPTER_DISABLED
from forgetwatch.results.report import TransitionReport
from forgetwatch.results.run_files import RunStore
from forgetwatch.run.adapters import adapters_disabled
from forgetwatch.run.base import model_key, weights_key


@dataclass
class RunContext:
    """What a repair method is told when training begins.

    Attributes:
        ranks, writes: every rank of the run, and whether this one writes the run's files.
        store: the run's files.
        tokenizer, rows_per_batch: the probes' tokenizer, and rows per forward pass for a model.
        step: the step training begins (or resumes) at.
        resume_dirs: where a resumed run's kept files are, first first (empty on a fresh run).
        records: the history so far (a resumed run's, up to ``step``).
        last_report: the last evaluation's report, if any.
        base: ``"adapter_disabled"``, a ``base=`` file, or ``None`` (the base was scored from the model).
        base_meta: the base answers' ``meta`` (the model and weights they were scored from).
        state: the method's own state from :meth:`~forgetwatch.Watch.load_state_dict`, if given.
        sharded: whether the model is sharded (DeepSpeed ZeRO, FSDP).
        precision: what the monitor's own forwards compute in (``Scoring.precision``).
    """

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
    base_meta: Mapping[str, Any] = field(default_factory=dict)
    state: Mapping[str, Any] | None = None
    sharded: bool = False
    precision: str = "weights"
    _made_by: dict[str, str | None] | None = field(default=None, init=False, repr=False)

    @property
    def reads_back(self) -> bool:
        """Whether what was measured on the base once is read back from the kept files (a
        resume), not measured again: on a fresh run, and with ``base="adapter_disabled"`` (the
        base is at hand), it is measured."""
        return self.step > 0 and self.base != ADAPTER_DISABLED

    def made_by(self, model: torch.nn.Module) -> dict[str, str | None]:
        """The base model's keys, which a file measured on the base must carry: on resume from
        the base snapshot's meta (scored from the same weights; the weights' key is not checked
        for a ``base=`` file)."""
        if self._made_by is None:  # once: the weights' key reads the parameters
            if self.reads_back:
                meta = self.base_meta if self.base is None else {}
                made = {"model": meta.get("model_key") or model_key(model), "weights": meta.get("weights_key")}
            else:
                made = {"model": model_key(model), "weights": weights_key(model, self.ranks)}
            self._made_by = made
        return dict(self._made_by)

    def as_base(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        """The model as the base: with its adapters disabled for ``base="adapter_disabled"``."""
        return adapters_disabled(model) if self.base == ADAPTER_DISABLED else contextlib.nullcontext()


class Repairable(Protocol):
    """What offers a repair method with its defaults (a :class:`~forgetwatch.ReplayPool`)."""

    def as_repair(self) -> Repair: ...


@runtime_checkable
class Repair(Protocol):
    """A repair method: ``name`` keys its entry in each history record and its state file;
    ``files``: the names of the files it keeps with the run (set aside and copied with the monitor's)."""

    name: str
    files: tuple[str, ...]

    def hold_out(self, probes: Any) -> None:
        """Refuse (a ``ValueError`` naming both) training data that holds a probe: called when
        the run is built, before any work."""

    def begin(self, model: torch.nn.Module, run: RunContext) -> None:
        """Training begins (or resumes): refuse what it cannot run under, restore its state."""

    def metrics(self) -> dict[str, float]:
        """Its figures since the last call, to log beside the evaluation's (``replay/loss``, ...)."""

    def state(self) -> dict[str, Any]:
        """Its state now, JSON-ready: kept in each history record and each checkpoint."""

    def on_evaluation(self, report: TransitionReport, model: torch.nn.Module) -> None:
        """An evaluation was made: adjust to what it found (``model``: the live model, to measure
        more on; borrow it and hand it back as found). Called before :meth:`metrics` and
        :meth:`state`, which say where the method stands after it."""

    def before_optimizer_step(
        self, model: torch.nn.Module, *, max_grad_norm: float | None = None, grad_scaler: tuple[Any, Any] | None = None
    ) -> None:
        """After the backward pass, before the optimizer steps: add the repair's gradient."""
