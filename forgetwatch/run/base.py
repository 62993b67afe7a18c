"""Where a run's base answers come from: given, cached, resumed, or scored with adapters off.

The base is what every evaluation is compared with, so a wrong one makes every number wrong.
The rules, as functions over the run's files and what the answers must match:

- ``base=`` answers (an object or a file) serve if they cover these probes, scored alike;
- on resume, the original run's snapshot is required (the weights resumed with have moved and
  must never stand in for the base), from the checkpoint or the run's own folder;
- otherwise a cached snapshot in the run's folder serves only for the same model configuration
  and weights; anything else is recomputed;
- ``base="adapter_disabled"`` is never read back: it is scored afresh with the adapters off.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from forgetwatch.common.distributed import Ranks
from forgetwatch.config import ADAPTER_DISABLED
from forgetwatch.results.answers import Answers, AnswersMismatchError
from forgetwatch.results.run_dir import SNAPSHOT, read_snapshot

logger = logging.getLogger(__name__)

# config fields that change without the model changing: where it was loaded from (a GGUF's
# general.name included), how its weights were stored (a GGUF file's quantization_config: its
# converted checkpoint is the same model), the dtype it was loaded in, what saving it records
# (library version, class name), flags trainers toggle
VOLATILE_CONFIG = (
    "_name_or_path",
    "_model_name_or_path",
    "_commit_hash",
    "quantization_config",
    "transformers_version",
    "architectures",
    "dtype",
    "torch_dtype",
    "use_cache",
)


def model_key(model: torch.nn.Module) -> str:
    """What the model is: its architecture and configuration (the same after training steps)."""
    from forgetwatch.scoring.borrow import unwrap

    config = getattr(unwrap(model), "config", None)
    described = config.to_dict() if hasattr(config, "to_dict") else {}
    for volatile in VOLATILE_CONFIG:
        described.pop(volatile, None)
    text = json.dumps(described, sort_keys=True, default=lambda o: type(o).__name__)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _held_here(p: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """The values of ``p`` this process holds, and whether they are only its shard: DeepSpeed
    ZeRO-3 keeps a partition in ``ds_tensor`` (the parameter itself is an empty placeholder),
    FSDP a ``DTensor`` shard."""
    if hasattr(p, "ds_tensor"):
        return p.ds_tensor, True
    if hasattr(p, "to_local"):
        return p.to_local(), True
    return p, False


def weights_key(model: torch.nn.Module, ranks: Ranks | None = None) -> str:
    """A cheap signature of the weights: a few strided values of every parameter.

    Catches a snapshot cached for other weights under the same name and configuration (a
    re-trained base saved to the same path) without reading every parameter. When parameters
    are sharded (ZeRO-3, FSDP), each rank hashes its own shards and the key joins every rank's
    part, so it stands for the whole model (and for the same number of ranks: a cache made on
    another world size is recomputed, never wrongly reused). All ranks of ``ranks`` must call
    it together. Meta tensors count by name only.

    Example:
        >>> weights_key(torch.nn.Linear(2, 2)) != weights_key(torch.nn.Linear(2, 2))
        True
    """
    h = hashlib.sha256()
    sharded = False
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            h.update(name.encode())
            local, is_shard = _held_here(p)
            sharded |= is_shard
            if local.is_meta or not local.numel():
                continue
            flat = local.detach().reshape(-1)
            sample = flat[:: max(1, flat.numel() // 16)][:16].float().cpu()
            h.update(sample.numpy().tobytes())
    digest = h.hexdigest()
    ranks = ranks or Ranks.alone()
    if sharded and ranks.size > 1:  # each rank saw only its shards
        digest = hashlib.sha256("".join(ranks.gather_json(digest)).encode()).hexdigest()
    return digest[:16]


@dataclass(frozen=True)
class Expected:
    """What answers must match to serve as this run's base.

    ``keys``: the model's ``model_key`` and ``weights_key``, compared with a cached snapshot's
    ``meta`` (a given or resumed base need only cover the probes, scored alike).
    """

    fingerprint: str
    scoring: Mapping[str, Any]
    ids: Sequence[str]
    keys: Mapping[str, str]

    def problem(self, answers: Answers, keys: Mapping[str, str] | None = None) -> str | None:
        """Why ``answers`` cannot be the base (``None`` if they can), checking ``keys`` too."""
        return answers.mismatch(fingerprint=self.fingerprint, scoring=self.scoring, ids=self.ids, meta=keys)


def given_base(given: Answers | str | os.PathLike[str], expected: Expected) -> Answers:
    """``base=`` answers, if they can serve: any model's answers may, if they cover these
    probes (ids included, so a file with rows deleted is refused before training), scored alike.

    Raises:
        AnswersMismatchError: they cannot; the message says why and names the file.
        FileNotFoundError, ValueError: the file is missing or damaged.
    """
    answers = given if isinstance(given, Answers) else Answers.load(given)
    problem = expected.problem(answers)
    if problem:
        raise AnswersMismatchError(
            f"base={'the answers given' if isinstance(given, Answers) else os.fspath(given)} was computed for "
            f"{problem}; it cannot be this run's "
            "base: score the base model on these probes (forgetwatch evaluate) "
            "or leave base unset"
        )
    return answers


def cached_base(run_dir: Path, expected: Expected) -> Answers | None:
    """A snapshot left in the run's folder by an earlier run of the same model and weights."""
    try:
        cached = read_snapshot(run_dir)
    except ValueError as err:  # damaged: say so, and compute a new one
        logger.warning("forgetwatch: ignoring %s", err)
        return None
    if cached is None:
        return None
    problem = expected.problem(cached, expected.keys)
    path = run_dir / SNAPSHOT
    if problem is None:
        logger.info("forgetwatch: reusing the base snapshot in %s", path)
        return cached
    logger.warning("forgetwatch: the cached base snapshot %s is for %s; computing a new one", path, problem)
    return None


def resumed_base(dirs: Sequence[Path], expected: Expected, step: int) -> Answers:
    """The original run's snapshot, for a run resumed at ``step``: the first of ``dirs`` (the
    checkpoint's folder first) holding one for these probes and options. The model's
    configuration is only preferred, since loading a model again may change it harmlessly.

    Raises:
        FileNotFoundError: none was found (the message says where it looked and what to pass).
    """
    found: list[tuple[Path, Answers]] = []
    rejected = []
    for directory in dirs:
        try:
            answers = read_snapshot(directory)
        except ValueError as err:  # damaged: say so, and look further
            rejected.append(str(err))
            continue
        if answers is None:
            continue
        problem = expected.problem(answers)
        if problem:
            rejected.append(f"{directory}: for {problem}")
        else:
            found.append((directory, answers))
    if not found:
        why = f" ({'; '.join(rejected)})" if rejected else ""
        raise FileNotFoundError(
            f"resuming at step {step}, but no base snapshot for these probes and scoring options was found in "
            f"{', '.join(map(str, dirs))}{why}; the resumed weights have moved, so they cannot stand in for the "
            "base: pass base=PATH with the original run's base_answers.npz"
        )
    model = {"model_key": expected.keys["model_key"]}
    for _, answers in found:
        if expected.problem(answers, model) is None:
            return answers
    directory, answers = found[0]
    logger.warning(
        "forgetwatch: resuming with the base snapshot in %s, made for a model of another configuration than this one",
        directory,
    )
    return answers


def stored_base(
    given: Answers | str | os.PathLike[str] | None,
    expected: Expected,
    *,
    run_dir: Path,
    resume_dirs: Sequence[Path] = (),
    step: int = 0,
) -> Answers | None:
    """The base answers a run finds on disk (or was given), or ``None`` when they must be
    scored now: ``base=`` answers if they can serve; on resume (``resume_dirs`` given) the
    original run's snapshot, which must exist; else a snapshot cached in ``run_dir`` for this
    very model. ``base="adapter_disabled"`` is never read back.

    Example:
        >>> stored_base(None, expected, run_dir=Path("out/forgetwatch"))   # doctest: +SKIP
    """
    if given == ADAPTER_DISABLED:
        return None
    if given is not None:
        return given_base(given, expected)
    if resume_dirs:
        return resumed_base(resume_dirs, expected, step)
    return cached_base(run_dir, expected)
