"""merge_sweep: how much forgetting an interpolation between the base and the tuned weights undoes, per α, against
how much of the training's gain on its target it keeps; the α to ship chosen from per-sample forgetting."""

from __future__ import annotations

import contextlib
import copy
import csv
import dataclasses
import io
import json
import math
import numbers
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from forgetwatch.common.files import atomic_folder, atomic_write, strict_dumps
from forgetwatch.common.strict_json import lone_surrogate
from forgetwatch.common.text import first_line
from forgetwatch.config.settings import Scoring
from forgetwatch.merge.weights import (
    AdapterScaling,
    Interpolation,
    at_alpha,
    check_same_shapes,
    is_lora,
    layer_groups,
    lora_layers,
    moved,
    scale_adapters,
)
from forgetwatch.probes import ProbeSet, ProbesLike, as_probe_set
from forgetwatch.results.answers import Answers
from forgetwatch.results.metrics import compare
from forgetwatch.results.report import TransitionReport
from forgetwatch.run.base import adapters_disabled, model_key
from forgetwatch.scoring import Scorer
from forgetwatch.scoring.batching import padded
from forgetwatch.scoring.borrow import borrowed, unwrap
from forgetwatch.scoring.encoding import model_max_length
from forgetwatch.scoring.generation import input_device
from forgetwatch.store import SWEEP, SWEEP_TABLE

#: the default α grid: 0, 0.1, ..., 1
ALPHAS = tuple(i / 10 for i in range(11))
#: the most α one sweep tries (each is a scoring of the probes and the target)
MAX_ALPHAS = 101


@dataclass(frozen=True)
class LayerRow:
    """One group of layers reverted to the base while the rest stays tuned."""

    group: str
    parameters: int
    restored: int  # probes forgotten at α = 1 that are right again
    forgotten: int  # probes forgotten against the base, this group reverted
    target: float
    gain: float | None


@dataclass
class MergeSweep:
    """The probes' forgetting and the target at each α of θ(α) = θ_base + α·(θ_tuned − θ_base).

    Attributes:
        alphas: the α of each row, ascending (0 is the base, 1 the tuned model).
        reports: each α's :class:`~forgetwatch.TransitionReport` against the base's answers.
        target: each α's target: accuracy on the target probes, or mean loss per token on the target texts.
        target_kind: ``"accuracy"`` (higher is better) or ``"loss"`` (lower is better).
        gain: each α's share of α = 1's gain on the target (``None`` where training gained nothing).
        layers: with ``by_layer=True``, one :class:`LayerRow` per group of layers.

    Example:
        >>> sweep = merge_sweep(base, tuned, tokenizer, probes, target=texts)  # doctest: +SKIP
        >>> sweep.best(keep=0.9)                                             # doctest: +SKIP
        0.4
    """

    alphas: list[float]
    reports: list[TransitionReport]
    target: list[float]
    target_kind: str
    gain: list[float | None]
    layers: list[LayerRow] = field(default_factory=list)
    answers: list[Answers] = field(default_factory=list, repr=False)
    _base: Any = field(default=None, repr=False)
    _tuned: Any = field(default=None, repr=False)

    def forgetting(self, i: int) -> float:
        """Row ``i``'s forgetting rate: chance-adjusted where it applies."""
        r = self.reports[i]
        return r.forgetting_adjusted if math.isfinite(r.forgetting_adjusted) else r.forgetting

    def best(self, keep: float = 0.9) -> float:
        """The α with the least forgetting among those keeping at least ``keep`` of the gain (ties: the larger α).
        Where training gained nothing on the target, among those whose target is at least as good as α = 1's."""
        check_fraction("keep", keep)
        if self.gain[-1] is None:
            sign = 1 if self.target_kind == "accuracy" else -1
            kept = [i for i, t in enumerate(self.target) if sign * t >= sign * self.target[-1]]
        else:
            kept = [i for i, g in enumerate(self.gain) if g is not None and g >= keep]
        return self.alphas[min(kept, key=lambda i: (self.forgetting(i), -self.alphas[i]))]

    def merged(self, alpha: float) -> torch.nn.Module:
        """A new model at ``alpha`` (the tuned model's class and config; a PEFT model with its adapters rescaled)."""
        check_fraction("alpha", alpha)
        model = fresh_copy(self._tuned)
        if self._base is None:
            scale_adapters(model, alpha)
        else:
            Interpolation(self._base, model, keep_on=_device(model)).set(alpha)
        return model

    def save(self, alpha: float, folder: str | os.PathLike[str], tokenizer: Any = None) -> None:
        """Write the model at ``alpha`` to ``folder`` with ``save_pretrained`` (safetensors; a PEFT model: its
        adapter rescaled), moving the tuned model in place and back: no copy of the model is made. It is written
        into a temporary folder beside ``folder`` that then takes its place: a failure (a full disk) raises an
        ``OSError`` saying so, and leaves no part of a model behind."""
        check_fraction("alpha", alpha)
        from safetensors import SafetensorError

        try:
            with atomic_folder(folder) as tmp, at_alpha(self._base, self._tuned, alpha):
                unwrap(self._tuned).save_pretrained(tmp, safe_serialization=True)
                if tokenizer is not None:
                    tokenizer.save_pretrained(tmp)
        except (OSError, SafetensorError) as err:
            raise OSError(
                f"{folder}: the merged model was not written ({first_line(err)}); nothing of it is left"
            ) from err

    def write(self, folder: str | os.PathLike[str], keep: float = 0.9) -> dict[str, Any]:
        """``sweep.csv`` and ``sweep.json`` (what the report page shows) into ``folder``; returns the JSON's table."""
        os.makedirs(folder, exist_ok=True)
        self.to_csv(os.path.join(folder, SWEEP_TABLE))
        table = self.to_dict(keep)
        with atomic_write(os.path.join(folder, SWEEP)) as f:
            f.write(strict_dumps(table))
        return table

    def rows(self) -> list[dict[str, Any]]:
        return [
            {
                "alpha": a,
                "forgotten": r.forgotten,
                "gained": r.gained,
                "forgetting": r.forgetting,
                "forgetting_adjusted": r.forgetting_adjusted if math.isfinite(r.forgetting_adjusted) else None,
                "accuracy": r.accuracy_after,
                f"target_{self.target_kind}": t,
                "gain": g,
            }
            for a, r, t, g in zip(self.alphas, self.reports, self.target, self.gain)
        ]

    def to_dict(self, keep: float = 0.9) -> dict[str, Any]:
        """The table, the by-layer rows and the α chosen for ``keep``, JSON-ready (no NaN)."""
        return {
            "target_kind": self.target_kind,
            "keep": keep,
            "best": self.best(keep),
            "rows": self.rows(),
            "layers": [dataclasses.asdict(row) for row in self.layers],
        }

    def to_csv(self, path: str | os.PathLike[str] | None = None) -> str:
        """The table as CSV text (empty cells where a figure does not apply); written atomically to ``path``."""
        out = io.StringIO()
        rows = self.rows()
        writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(
            {k: "" if v is None else round(v, 6) if isinstance(v, float) else v for k, v in r.items()} for r in rows
        )
        if path is not None:
            with atomic_write(path) as f:
                f.write(out.getvalue())
        return out.getvalue()

    def summary(self, keep: float = 0.9) -> str:
        lines = [f"{'alpha':>5}  {'forgotten':>9}  {'forgetting':>10}  {'target ' + self.target_kind:>14}  {'gain':>6}"]
        for i, (a, r, t, g) in enumerate(zip(self.alphas, self.reports, self.target, self.gain)):
            gain = "" if g is None else f"{g:6.0%}"
            lines.append(f"{a:5.2f}  {r.forgotten:9d}  {self.forgetting(i):10.1%}  {t:14.4f}  {gain:>6}")
        best = self.best(keep)
        i = self.alphas.index(best)
        lines.append(
            f"alpha {best:g}: target {self.target[i]:.4f} (alpha 1: {self.target[-1]:.4f}; {_kept(self.gain[i])}), "
            f"{self.reports[i].forgotten} probes forgotten (alpha 1: {self.reports[-1].forgotten})"
        )
        return "\n".join(lines)


def merge_sweep(
    base_model: torch.nn.Module | None,
    tuned_model: torch.nn.Module,
    tokenizer: Any,
    probes: ProbesLike,
    *,
    target: ProbesLike | Sequence[str],
    alphas: Sequence[float] = ALPHAS,
    by_layer: bool | int = False,
    scoring: Scoring | None = None,
    max_length: int = 1024,
    show_progress: bool = False,
) -> MergeSweep:
    """Score the probes and the target at each α between the base and the tuned weights (WiSE-FT).

    ``tuned_model`` is moved in place from α to α and handed back bit for bit; a copy of the parameters that
    differ from the base is kept on the CPU. A PEFT model is swept by scaling its LoRA adapters (its adapters off
    are the base, so ``base_model`` may be ``None``), with no copy of their weights; the copies of whole modules it
    trains (``modules_to_save``, e.g. the head) are interpolated from the modules' own weights. An adapter that
    trains what neither moves back (LoRA's ``bias``, trainable tokens, DoRA) is refused before any scoring.

    The base is scored once (``base_model``, or the PEFT model with its adapters off) and α = 0 must be judged as
    it is, probe by probe: else a ``ValueError`` says the sweep's α = 0 is not the base.

    Args:
        base_model: the model before training (unused for a PEFT ``tuned_model``: its adapters off are the base).
        probes: what must not be forgotten (a :class:`~forgetwatch.ProbeSet`, a probe file or rows).
        target: what the training was for: a probe set (accuracy) or held-out texts (mean loss per token).
        alphas: the α to try, each in [0, 1] (default 0, 0.1, ..., 1; 0 and 1 are always added).
        by_layer: also revert one group of layers at a time (embeddings, each block, the head); a number N > 1:
            N blocks a group.
        scoring: how probes are scored (a :class:`~forgetwatch.Scoring`).
        max_length: target texts are cut to this many tokens (and to the model's context).

    Example:
        >>> sweep = merge_sweep(base, tuned, tokenizer, probes, target=["def f(x):\\n    return x"])  # doctest: +SKIP
        >>> print(sweep.summary())                                                                # doctest: +SKIP
    """
    grid = checked_alphas(alphas)
    checked_span(by_layer)
    checked_max_length(max_length)
    probe_set = _probe_set(probes, "probes")
    target = checked_target(target)
    lora = is_lora(tuned_model)  # its adapters off are the base: base_model is not needed
    if base_model is None and not lora:
        raise ValueError("merge_sweep: base_model=None needs a PEFT tuned_model (its adapters off are the base)")
    base = None
    if not lora:
        if model_key(base_model) != model_key(tuned_model):
            raise ValueError(
                "merge_sweep: the base and the tuned model have different configurations (architecture or sizes); "
                "interpolating weights needs two checkpoints of one model"
            )
        base = dict(unwrap(base_model).named_parameters())
        check_same_shapes(base, dict(unwrap(tuned_model).named_parameters()))
    else:
        lora_layers(tuned_model)  # an adapter it cannot move back is refused now, before any scoring
    scoring = scoring or Scoring()
    scorer = Scorer(tokenizer, probe_set, scoring)
    sweeper = Sweeper(tuned_model, scorer, target, scoring, max_length)
    with adapters_disabled(tuned_model) if lora else contextlib.nullcontext():  # what α = 0 must be judged as
        base_answers = scorer(
            tuned_model if lora else base_model, batch_size=scoring.batch_size, show_progress=show_progress
        )
    return sweeper.run(base, tuned_model, grid, by_layer, base_answers=base_answers, show_progress=show_progress)


class Target:
    """What the training was for, measured on a model: accuracy on a probe set, or mean loss per token on texts
    (checked against ``model`` when made: a target probe it cannot score fails here)."""

    def __init__(
        self, model: torch.nn.Module, tokenizer: Any, target: list[str] | ProbeSet, scoring: Scoring, max_length: int
    ):
        self.tokenizer, self.batch_size = tokenizer, scoring.batch_size
        self.scorer, self.encoded = None, None
        if isinstance(target, ProbeSet):
            self.scorer = Scorer(tokenizer, target, scoring)
            self.scorer.prepare(model)
        else:  # no longer than the model's context: its position embeddings end there
            context = model_max_length(getattr(unwrap(model), "config", None), tokenizer)
            self.encoded = _encode(tokenizer, target, min(max_length, context))
        self.kind = "accuracy" if self.scorer is not None else "loss"

    def __call__(self, model: torch.nn.Module, distributed: bool = False) -> float:
        if self.scorer is not None:
            return self.scorer(model, batch_size=self.batch_size, show_progress=False, distributed=distributed).accuracy
        return mean_token_loss(model, self.tokenizer, self.encoded, _rows(self.batch_size))

    def gain(self, start: float, end: float, value: float) -> float | None:
        """``value``'s share of the gain from ``start`` to ``end`` (``None`` where there was none)."""
        return _gain(start, end, value, self.kind)


class Sweeper:
    """The probes' scorer and the target for one model, checked against it (a probe it cannot score fails here)."""

    def __init__(
        self,
        model: torch.nn.Module,
        scorer: Scorer,
        target: list[str] | ProbeSet,
        scoring: Scoring,
        max_length: int = 1024,
    ):
        self.batch_size = scoring.batch_size
        self.scorer = scorer
        self.scorer.prepare(model)
        self.target = Target(model, scorer.tokenizer, target, scoring, max_length)

    def measure(self, model: torch.nn.Module, distributed: bool, show_progress: bool) -> tuple[Answers, float]:
        """The probes' answers and the target's figure; with ``distributed`` every rank scores a share."""
        answers = self.scorer(model, batch_size=self.batch_size, show_progress=show_progress, distributed=distributed)
        return answers, self.target(model, distributed)

    def run(
        self,
        base: dict[str, torch.Tensor] | None,
        model: torch.nn.Module,
        grid: list[float],
        by_layer: bool | int = False,
        *,
        base_answers: Answers | None = None,
        distributed: bool = False,
        show_progress: bool = False,
    ) -> MergeSweep:
        """``model`` moved to each α of ``grid`` between ``base`` (its parameters; ``None``: a PEFT model's adapters
        off) and itself, measured, and handed back bit for bit; with ``base_answers`` (the base's, as this scorer
        scores), α = 0 is checked against them once the model is handed back (:func:`check_alpha_zero`)."""
        mover = AdapterScaling(model) if base is None else Interpolation(base, model, keep_on="cpu")
        answers, target, layers = [], [], []
        with moved(mover):
            for a in grid:
                mover.set(a)
                got, value = self.measure(model, distributed, show_progress)
                answers.append(got)
                target.append(value)
            reports = [compare(answers[0], a) for a in answers]
            gain = [self.target.gain(target[0], target[-1], t) for t in target]
            if by_layer:
                forgotten_at_one = set(reports[-1].forgotten_ids)
                for group, names in layer_groups(mover.names, int(by_layer)).items():
                    if not mover.moves(names):  # nothing of it trained: reverting it changes nothing
                        continue
                    mover.set(1.0, dict.fromkeys(names, 0.0))
                    got, value = self.measure(model, distributed, show_progress)
                    report = compare(answers[0], got)
                    restored = len(forgotten_at_one - set(report.forgotten_ids))
                    row_gain = self.target.gain(target[0], target[-1], value)
                    layers.append(LayerRow(group, len(names), restored, report.forgotten, value, row_gain))
        if base_answers is not None:  # after every rank's last scoring: a rank that raises here leaves none waiting
            check_alpha_zero(answers[0], base_answers)
        return MergeSweep(grid, reports, target, self.target.kind, gain, layers, answers, base, model)


def check_alpha_zero(at_zero: Answers, base: Answers) -> None:
    """A ``ValueError`` unless the sweep's α = 0 judges every probe as the base's answers do (or differs on no more
    probes than the base's measured noise, ``noise_flips``, allows): else no figure of the sweep is against the
    base."""
    report = compare(base, at_zero)
    flips, allowed = report.forgotten + report.gained, int(base.meta.get("noise_flips", 0))
    if flips > allowed:
        noise = f"its measured noise allows {allowed}" if "noise_flips" in base.meta else "no noise was measured"
        raise ValueError(
            f"merge_sweep: alpha 0 is not the base: it judges {flips} of the {report.n} probes otherwise than "
            f"the base's answers ({noise}); the tuned model holds trained weights the sweep does not move back "
            "(parameters trained outside the adapter, or unfrozen after the base was kept), or the two compute "
            "differently (on another device); every figure of this sweep would be against a wrong base"
        )


def mean_token_loss(model: torch.nn.Module, tokenizer: Any, rows: list[list[int]], batch_size: int = 8) -> float:
    """The mean next-token loss (nats) over every predicted token of ``rows``."""
    device = input_device(unwrap(model))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    total, count = 0.0, 0
    with borrowed(model, tokenizer):
        for start in range(0, len(rows), batch_size):
            ids, mask = padded(rows[start : start + batch_size], pad)
            ids, mask = ids.to(device), mask.to(device)
            logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
            labels = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
            loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100, reduction="sum")
            total += loss.item()
            count += int((labels != -100).sum())
    return total / count


def fresh_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A deep copy whose ``forward`` is its own class's: a trainer's model may carry accelerate's wrapped forward,
    which a plain deep copy keeps calling on the original model."""
    inner = unwrap(model)
    made = copy.deepcopy(inner)
    for m in made.modules():
        if "forward" in vars(m):  # an instance attribute: a wrapper over some model's forward
            original = vars(m).get("_original_forward")
            del m.forward
            if original is not None:
                del m._original_forward
    return made


def read_texts(path: str | os.PathLike[str]) -> list[str]:
    """Target texts from a file: JSONL rows with a ``text`` (a ``.jsonl`` file), else one text per non-empty line.
    An error names the file, and the line and field where one is wrong."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: cannot read it ({first_line(err)})") from None
    rows = str(path).lower().endswith(".jsonl")
    texts = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}: line {n}: field 'text'" if rows else f"{path}: line {n}"
        if rows:
            try:
                row = json.loads(line)
            except ValueError as err:
                raise ValueError(f"{path}: line {n}: not JSON ({first_line(err)})") from None
            if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                raise ValueError(f"{where}: expected a string")
            line = row["text"]
        if problem := text_problem(line):
            raise ValueError(f"{where}: {problem}")
        texts.append(line)
    return texts


def text_problem(text: str) -> str | None:
    """Why a tokenizer cannot take ``text`` (a lone surrogate, a NUL: a binary file), or ``None``."""
    if "\0" in text:
        return f"has a NUL character at character {text.index(chr(0))}; is it a binary file? remove it"
    return lone_surrogate(text)


def _encode(tokenizer: Any, texts: Sequence[str], max_length: int) -> list[list[int]]:
    rows = [tokenizer(t, add_special_tokens=True)["input_ids"][:max_length] for t in texts]
    if any(len(r) < 2 for r in rows):
        i = next(i for i, r in enumerate(rows) if len(r) < 2)
        raise ValueError(f"merge_sweep: target text {i} has fewer than 2 tokens: nothing to predict")
    return rows


def _gain(start: float, end: float, value: float, kind: str) -> float | None:
    gained = (start - end) if kind == "loss" else (end - start)
    if not gained > 0:
        return None
    return ((start - value) if kind == "loss" else (value - start)) / gained


def checked_alphas(alphas: Sequence[float]) -> list[float]:
    if isinstance(alphas, (str, bytes)) or not isinstance(alphas, Sequence):
        raise TypeError(f"merge_sweep: alphas must be a list of numbers in [0, 1], got {type(alphas).__name__}")
    for a in alphas:
        check_fraction("alpha", a)
    grid = sorted({0.0, 1.0, *(float(a) for a in alphas)})
    if len(grid) > MAX_ALPHAS:
        raise ValueError(f"merge_sweep: {len(grid)} alphas; a sweep tries at most {MAX_ALPHAS} (each is a scoring)")
    return grid


def checked_span(by_layer: Any) -> bool | int:
    if not isinstance(by_layer, (bool, int)) or by_layer < 0:
        raise ValueError(f"merge_sweep: by_layer is True, False or a number of blocks a group, got {by_layer!r}")
    return by_layer


def checked_max_length(max_length: Any) -> int:
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
        raise ValueError(f"merge_sweep: max_length is a whole number of tokens >= 2, got {max_length!r}")
    return max_length


def check_fraction(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value <= 1:
        raise ValueError(f"merge_sweep: {name} must be a number in [0, 1], got {value!r}")
    return value


def _probe_set(probes: ProbesLike, what: str) -> ProbeSet:
    made = as_probe_set(probes, source=f"{what}=[...]")
    if not len(made):
        raise ValueError(f"merge_sweep: {what} is an empty probe set; give at least one probe")
    return made


def checked_target(target: Any) -> list[str] | ProbeSet:
    """``target`` as held-out texts or a probe set; one clear error for anything else."""
    if (
        isinstance(target, Sequence)
        and not isinstance(target, (str, bytes))
        and all(isinstance(t, str) for t in target)
    ):
        if not target:
            raise ValueError("merge_sweep: target is an empty list; give held-out texts of what the training was for")
        for i, text in enumerate(target):
            if problem := text_problem(text):
                raise ValueError(f"merge_sweep: target text {i} {problem}")
        return list(target)
    if isinstance(target, (ProbeSet, str, os.PathLike)) or (
        isinstance(target, Sequence) and all(isinstance(t, dict) for t in target)
    ):
        return _probe_set(target, "target")
    raise TypeError(
        "merge_sweep: target must be a ProbeSet (or probe file, or probe rows) of what the training was for, "
        f"or a list of held-out texts; got {type(target).__name__}"
    )


def _rows(batch_size: int | str) -> int:
    return batch_size if isinstance(batch_size, int) else 8


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _kept(g: float | None) -> str:
    return "alpha 1 gained nothing over the base" if g is None else f"{g:.0%} of its gain kept"
