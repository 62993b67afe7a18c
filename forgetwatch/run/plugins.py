"""What plug-ins beside the monitor see of a run (:class:`RunView`), and what the monitor keeps of them (:class:`Kept`).

A plug-in (:class:`~forgetwatch.Replay`, :class:`~forgetwatch.MergeAtEnd`) is called by the training loop or the
trainer's callback, never by the :class:`~forgetwatch.Watch`, so what the watch reports cannot be moved by it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from forgetwatch.common.distributed import Ranks
from forgetwatch.config import ADAPTER_DISABLED
from forgetwatch.results.events import Ending
from forgetwatch.results.report import TransitionReport
from forgetwatch.run.base import adapters_disabled, model_key, weights_key
from forgetwatch.store.write import RunStore


@runtime_checkable
class Kept(Protocol):
    """A plug-in whose figures and state the watch keeps (:meth:`~forgetwatch.Watch.keep`)."""

    name: str  # keys them, in each history record and in Watch.state_dict()
    files: tuple[str, ...]  # what it keeps in the run's folder (set aside with the watch's own by a fresh run)

    def metrics(self) -> dict[str, float]:
        """Its figures since the last evaluation, logged beside the evaluation's (``replay/loss``, ...)."""

    def state(self) -> dict[str, Any]:
        """Its state now, JSON-ready: what a resumed run needs."""


@dataclass(frozen=True)
class RunView:
    """A started run as a plug-in sees it, read-only (:attr:`~forgetwatch.Watch.view`)."""

    ranks: Ranks  # the run's processes (rank 0 writes the files)
    scorer: Any  # the run's Scorer of its probes (its tokenizer, batches and settings)
    store: RunStore | None = None  # the run's files (None: nothing kept); a resumed run reads back its own there
    base_answers: Any = None
    step: int = 0  # the step training began (or resumed) at
    records: Sequence[Mapping[str, Any]] = ()  # the history up to step, as its records
    last_report: TransitionReport | None = None  # the last evaluation's report up to step
    base: Any = None  # "adapter_disabled", a base= file, or None: what the base is
    states: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # load_state_dict's, by plug-in name
    sharded: bool = False  # whether the model is sharded over the ranks (ZeRO-3, FSDP)
    tell: Callable[[Ending], None] = lambda ending: None  # a plug-in's Ending to the run's loggers and console
    _made_by: dict[str, str | None] = field(default_factory=dict, repr=False, compare=False)

    @property
    def writes(self) -> bool:
        """Whether this rank writes the run's files (and says what happens: rank 0)."""
        return self.ranks.index == 0

    @property
    def tokenizer(self) -> Any:
        return self.scorer.tokenizer

    @property
    def scoring(self) -> Any:
        """The run's :class:`~forgetwatch.Scoring`."""
        return self.scorer.settings

    def rows_per_batch(self, model: torch.nn.Module) -> int:
        """The most rows a batch of ``model`` holds, as the run's scoring planned them."""
        return self.scorer.rows_per_batch(model)

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
        if not self._made_by:  # once: the weights' key reads the parameters
            if self.reads_back:
                meta = self.base_meta if self.base is None else {}
                made = {"model": meta.get("model_key") or model_key(model), "weights": meta.get("weights_key")}
            else:
                made = {"model": model_key(model), "weights": weights_key(model, self.ranks)}
            self._made_by.update(made)
        return dict(self._made_by)

    def as_base(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        """The model as the base: with its adapters disabled for ``base="adapter_disabled"``."""
        return adapters_disabled(model) if self.base == ADAPTER_DISABLED else contextlib.nullcontext()
