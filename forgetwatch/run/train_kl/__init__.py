"""``forgetwatch/drift/train_kl``: the mean KL(base ‖ current) per target token on a seeded sample of the
training rows, a forgetting signal that needs no probes (see docs/measures.md, "Train KL")."""

from __future__ import annotations

import hashlib
import logging
import math
import numbers
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from forgetwatch.common.distributed import Ranks
from forgetwatch.common.text import first_line
from forgetwatch.run.plugins import RunView
from forgetwatch.scoring.borrow import is_sharded, unwrap
from forgetwatch.scoring.encoding import model_max_length
from forgetwatch.scoring.generation import answered_row, fit_prompts, generate_sharded, pad_id
from forgetwatch.scoring.next_tokens import (
    BaseDistribution,
    KeptFileError,
    MeasureFailed,
    aligned_targets,
    base_distribution,
    first_usable,
    kl_to_base,
    logits_width,
    row_sums,
)
from forgetwatch.store import TRAIN_KL

logger = logging.getLogger("forgetwatch")

#: rows are cut to their first this many tokens (prompt and completion together)
MAX_TOKENS = 512
#: the base's most likely tokens kept per target position (with the mass outside them)
TOP_K = 32
#: the base may take SHARE of what scoring the probes took, at least MIN_SECONDS, on at least MIN_ROWS rows
SHARE, MIN_SECONDS, MIN_ROWS = 0.25, 5.0, 8
_FORMAT = "forgetwatch.train_kl"
_NAME = "train KL (forgetwatch/drift/train_kl)"


@dataclass(frozen=True)
class TrainRows:
    """Token rows of the training data, each ``(token_ids, start)``, measured from ``start`` on; ``source``:
    "trainer", "sft", "dpo", "kto", "grpo" or "given". GRPO's rows are prompts, completed by the base."""

    rows: list[tuple[list[int], int]]
    source: str
    completion_tokens: int = 0

    @property
    def complete(self) -> bool:
        return self.completion_tokens == 0


#: what ``Watch.start(train_rows=...)`` takes
RowsLike = TrainRows | Sequence[Sequence[int] | tuple[Sequence[int], int]]


def as_train_rows(rows: RowsLike, max_rows: int, seed: int = 0) -> TrainRows:
    """``rows`` as :class:`TrainRows`: at most ``max_rows`` (a seeded sample, in order), cut to :data:`MAX_TOKENS`."""
    given = rows if isinstance(rows, TrainRows) else TrainRows(_pairs(rows), "given")
    pairs = given.rows
    if len(pairs) > max_rows:  # as training_rows samples a dataset: seeded by the count, kept in order
        keep = np.sort(np.random.default_rng([seed, len(pairs)]).choice(len(pairs), max_rows, replace=False))
        pairs = [pairs[int(i)] for i in keep]
    if given.complete:
        pairs = [(ids[:MAX_TOKENS], start) for ids, start in pairs if start < min(len(ids), MAX_TOKENS)]
    return TrainRows(pairs, given.source, given.completion_tokens)


def _pairs(rows: Any) -> list[tuple[list[int], int]]:
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence):
        raise ValueError(f"train_rows must be a list of token-id lists or (token_ids, start) pairs, got {rows!r:.80}")
    out = []
    for n, row in enumerate(rows):
        paired = isinstance(row, tuple) and len(row) == 2 and hasattr(row[0], "__len__")
        ids, start = (row[0], row[1]) if paired else (row, 1)
        if hasattr(ids, "tolist"):  # a tensor or an array
            ids = ids.tolist()
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence) or not all(_whole(t) and t >= 0 for t in ids):
            raise ValueError(f"train_rows[{n}]: not a list of token ids (whole numbers from 0): {ids!r:.80}")
        if not _whole(start) or start < 1:
            raise ValueError(f"train_rows[{n}]: its start (the first target token) must be a whole number >= 1")
        out.append(([int(t) for t in ids], int(start)))
    return out


def _whole(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def rows_key(rows: Iterable[tuple[Sequence[int], int]]) -> str:
    """A hash of the ``(token_ids, start)`` rows, in order."""
    h = hashlib.sha256()
    for ids, start in rows:
        h.update(np.asarray(ids, dtype=np.int64).tobytes())
        h.update(f"@{start};".encode())
    return h.hexdigest()[:16]


class TrainKL:
    """The train-KL signal a :class:`~forgetwatch.Watch` drives: :meth:`begin` when training begins, :meth:`measure`
    at each evaluation. ``max_seconds``: about how long measuring the base may take (fewer rows when longer)."""

    def __init__(
        self,
        max_rows: int = 128,
        *,
        top_k: int = TOP_K,
        max_seconds: float | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.max_rows, self.top_k, self.max_seconds, self.clock = max_rows, top_k, max_seconds, clock
        self.base: BaseDistribution | None = None
        self.tokens: list[list[int]] = []
        self.starts: list[int] = []
        self.source = ""
        self._run: RunView | None = None

    @property
    def on(self) -> bool:
        return self.base is not None

    def begin(self, model: torch.nn.Module, run: RunView, rows: RowsLike | None) -> None:
        """Training begins: the base's distribution on ``rows`` measured and kept as ``train_kl.npz``, or on
        resume read back. What cannot be done leaves it off, said in one line; malformed rows raise here."""
        self.base, self._run = None, run
        if rows is None:
            return
        given = as_train_rows(rows, self.max_rows)
        say = logger.info if run.writes else logger.debug
        if run.sharded or is_sharded(model):
            say("forgetwatch: %s is off: it is not measured on sharded models (DeepSpeed ZeRO-3, FSDP) yet", _NAME)
            return
        if run.reads_back:
            self._read_back(model, run, given)
        else:
            self._measure_base(model, run, given)
        if self.base is not None and run.writes:
            run.store.keep(TRAIN_KL, self.save)  # kept with the run for the next resume

    def _measure_base(self, model: torch.nn.Module, run: RunView, given: TrainRows) -> None:
        # every rank goes on, or none: a rank that measures alone would wait for the others forever
        n, why = _everywhere(run, lambda: self._affordable(model, run, given))
        if why is None:
            n = run.ranks.from_rank_zero([n])[0]  # rank 0's clock decides for all
            if n < len(given.rows) and run.writes:
                logger.info(
                    f"forgetwatch: {_NAME} is measured on {n} of {len(given.rows)} training rows (a seeded sample): "
                    f"the base's distribution on all would take longer than its {self.max_seconds:.1f} s (a quarter "
                    "of what scoring the probes took)"
                )
            rows = as_train_rows(given, n)
            measured, why = _everywhere(run, lambda: self._measured(model, run, rows, self._key(model, run, given)))
        if why is not None:
            if run.writes:
                logger.warning("forgetwatch: %s is off for this run: the base could not be measured (%s)", _NAME, why)
            return
        pairs, base = measured
        if base is None:
            if run.writes:
                logger.info("forgetwatch: %s is off: none of the training rows has a token to measure", _NAME)
            return
        self.base, self.tokens, self.starts = base, [ids for ids, _ in pairs], [s for _, s in pairs]
        self.source = given.source

    def _affordable(self, model: torch.nn.Module, run: RunView, given: TrainRows) -> int:
        """How many rows fit in ``max_seconds``, timed on a seeded eighth (at most MIN_ROWS: long rows cost much)."""
        rows = len(given.rows)
        if self.max_seconds is None or rows <= MIN_ROWS:
            return rows
        pilot = min(MIN_ROWS, math.ceil(rows / 8))
        with run.as_base(model):  # the weights' key, read once: not part of the time per row
            run.made_by(model)
        began = self.clock()
        self._measured(model, run, as_train_rows(given, pilot), self._key(model, run, None))
        per_row = (self.clock() - began) / pilot
        left = self.max_seconds - per_row * pilot
        return rows if per_row <= 0 else int(min(rows, max(MIN_ROWS, left // per_row)))

    def _key(self, model: torch.nn.Module, run: RunView, given: TrainRows | None) -> dict[str, Any]:
        # another run's kept file, made on other rows of the same base, is refused on resume
        given_key = "pilot" if given is None else rows_key(given.rows)
        key = {"format": _FORMAT, "given": given_key, "rows_asked": self.max_rows, "top_k": self.top_k}
        return {**key, **run.made_by(model)}

    def _measured(
        self, model: torch.nn.Module, run: RunView, given: TrainRows, key: dict[str, Any]
    ) -> tuple[list[tuple[list[int], int]], BaseDistribution | None]:
        """The rows (GRPO's completed) and the base's distribution on them (``None``: no token to measure)."""
        with run.as_base(model):
            pairs = given.rows if given.complete else self._completed(model, run, given)
            # a row no longer than the model's context (a trainer's rows are, unless given otherwise)
            limit = model_max_length(getattr(unwrap(model), "config", None), run.tokenizer)
            pairs = [(ids[:limit], start) for ids, start in pairs if start < min(len(ids), limit)]
            if not pairs:
                return pairs, None
            tokens, starts = [ids for ids, _ in pairs], [s for _, s in pairs]
            key = {**key, "source": given.source, "rows": rows_key(pairs)}
            ids, pad, batch = [str(i) for i in range(len(tokens))], pad_id(run.tokenizer), run.rows_per_batch(model)
            # kept in float32 (the base against itself gives exactly 0), computed as the probes are scored
            compute = run.scoring.precision
            base = base_distribution(
                unwrap(model), run.tokenizer, ids, tokens, pad, self.top_k, batch, key, starts, np.float32, compute
            )
            return pairs, base

    def _completed(self, model: torch.nn.Module, run: RunView, given: TrainRows) -> list[tuple[list[int], int]]:
        prompts = [ids for ids, _ in given.rows]
        named = {f"prompt {i}": p for i, p in enumerate(prompts)}
        fitted = fit_prompts(model, run.tokenizer, named, given.completion_tokens)
        answers = generate_sharded(
            model, run.tokenizer, fitted, ranks=run.ranks, rows_per_batch=run.rows_per_batch(model), return_ids=True
        )
        rows = [answered_row(p, a, model, run.tokenizer, MAX_TOKENS) for p, a in zip(prompts, answers)]
        return [(ids, start) for ids, start in rows if len(ids) > start]

    # -- the kept file -------------------------------------------------------------------------

    def save(self, path: str | Path) -> None:
        arrays = {"tokens": np.concatenate(self.tokens), "token_offsets": np.cumsum([0, *map(len, self.tokens)])}
        self.base.save(path, {k: np.asarray(v, dtype=np.int64) for k, v in {**arrays, "starts": self.starts}.items()})

    @staticmethod
    def load(path: str | Path) -> tuple[BaseDistribution, list[list[int]], list[int]]:
        """A ``train_kl.npz`` back: ``(base distribution, rows' tokens, starts)``, or a ``KeptFileError``."""
        base, z = BaseDistribution.read(path)
        if missing := [name for name in ("tokens", "token_offsets", "starts") if name not in z]:
            raise KeptFileError(path, f"damaged or not a train-KL file (no {missing[0]} in it)")
        tokens, offsets, starts = z["tokens"], z["token_offsets"], z["starts"]
        n, lengths = len(starts), np.diff(offsets)
        # the rows' hash in the key vouches for their tokens and starts; these checks make them readable
        if any(a.dtype != np.int64 or a.ndim != 1 for a in (tokens, offsets, starts)):
            problem = "its rows are not 1-d int64 arrays"
        elif len(offsets) != n + 1 or offsets[0] != 0 or offsets[-1] != len(tokens) or (lengths < 1).any():
            problem = f"its token offsets do not add up to {n} rows of {len(tokens)} tokens"
        elif base.key.get("rows") != rows_key(zip(rows := np.split(tokens, offsets[1:-1]), starts.tolist())):
            problem = "its rows are not those its key was made from"
        elif base.ids != [str(i) for i in range(n)] or (np.diff(base.offsets) != lengths - starts).any():
            problem = "its distribution's positions are not its rows' targets"
        else:
            return base, [r.tolist() for r in rows], starts.tolist()
        raise KeptFileError(path, f"damaged: {problem}")

    def _read_back(self, model: torch.nn.Module, run: RunView, given: TrainRows) -> None:
        paths = [run.store.dir / TRAIN_KL] if run.store is not None else []
        expected, vocab = self._key(model, run, given), logits_width(model)

        def problem(loaded: tuple[BaseDistribution, list[list[int]], list[int]]) -> str | None:
            base, tokens, _ = loaded
            if wrong := [name for name, want in expected.items() if want is not None and base.key.get(name) != want]:
                return f"made for other {', '.join(_KEYS.get(n, n) for n in wrong)} than this run's"
            if vocab is not None and max([int(base.top_ids.max(initial=0)), *map(max, tokens)]) >= vocab:
                return f"damaged: a token id is outside the model's vocabulary of {vocab}"
            return None

        def find() -> dict[str, Any]:  # on rank 0, shared with every rank as JSON
            kept, rejected = first_usable(paths, TrainKL.load, problem)
            return {"kept": kept and [kept[0].to_dict(), *kept[1:]], "rejected": rejected}

        found = run.ranks.share_from_rank_zero(find)
        why = "; ".join(found["rejected"])
        if found["kept"] is None:
            if run.writes:
                why = why or f"none in {', '.join(str(p.parent) for p in paths)}"
                logger.warning(
                    f"forgetwatch: {_NAME} is off for this resumed run: it needs the base model's distribution on the "
                    f"training rows, kept when the run began, and no copy can serve ({why}); it is never measured "
                    "again from the moved weights"
                )
            return
        if why and run.writes:
            logger.warning("forgetwatch: passed over a kept %s file (%s); using another copy", _NAME, why)
        base, self.tokens, self.starts = found["kept"]
        self.base = BaseDistribution.from_dict(base)
        self.source = self.base.key.get("source")

    # -- at each evaluation ----------------------------------------------------------------------

    def measure(self, model: torch.nn.Module, ranks: Ranks) -> dict[str, float]:
        """The mean KL(base ‖ ``model``) per target token (``train_kl``), its rows, tokens and seconds, the same on
        every rank; ``{}`` when off. A failure or a non-finite value turns it off for the run, with one warning."""
        if self.base is None or self._run is None:
            return {}
        began, base, run = self.clock(), self.base, self._run
        targets = sum(len(ids) - start for ids, start in zip(self.tokens, self.starts))

        def kl(logits: torch.Tensor, _ids: torch.Tensor, idx: list[int]) -> torch.Tensor:
            parts, firsts = [base.row(str(i)) for i in idx], [self.starts[i] - 1 for i in idx]
            return kl_to_base(logits, *aligned_targets(parts, firsts, logits.shape[1], logits.device))

        try:
            pad, batch = pad_id(run.tokenizer), run.rows_per_batch(model)
            sums = row_sums(
                model, run.tokenizer, self.tokens, self.starts, pad, batch, ranks, kl, run.scoring.precision
            )
            value = float(sums.sum() / max(targets, 1))
            why = None if math.isfinite(value) else f"it came out as {value}"
        except MeasureFailed as err:  # a signal, not a training input: the run goes on
            why = str(err)
        if why is not None:
            self.base = None
            if run.writes:
                logger.warning(
                    "forgetwatch: %s is off for the rest of the run: it could not be measured (%s)", _NAME, why
                )
            return {}
        seconds = round(self.clock() - began, 4)
        return {"train_kl": value, "rows": len(self.tokens), "tokens": targets, "seconds": seconds}


#: what each entry of a kept file's key stands for, in the message that refuses it
_KEYS = {
    "format": "contents",
    "given": "training rows (their token ids)",
    "rows_asked": "train_kl_rows",
    "top_k": "top k",
    "model": "model configuration",
    "weights": "base weights",
}


def _everywhere(run: RunView, work: Callable[[], Any]) -> tuple[Any, str | None]:
    """``work()`` on every rank: its result, and why it failed on any rank (``None``: on none)."""
    try:
        result, why = work(), None
    except Exception as err:  # noqa: BLE001 - a signal, not a training input: the run goes on
        result, why = None, f"{type(err).__name__}: {first_line(err)}"
    if run.ranks.sum(np.array([float(why is not None)]))[0] == 0:
        return result, None
    return None, why or "it failed on another rank"
