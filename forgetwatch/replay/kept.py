"""What a resumed run reads back for replay, each copy checked (its values, and its key) before any of it is used."""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from forgetwatch.common import strict_json
from forgetwatch.common.text import first_line, shorten
from forgetwatch.scoring.next_tokens import KeptFileError, first_usable, logits_width

REPLAY_BASE = "replay_base.npz"  # the base's next-token distribution on the rows (loss "kl")
REPLAY_ANSWERS = "replay_answers.json"  # the base's answers to a pool's prompts (synthetic replay)

#: A kept replay file that cannot serve this run: one class with every kept file's error.
ReplayFileError = KeptFileError
#: The heaviest replay weight: the replay loss at most this many times the trainer's.
MAX_WEIGHT = 100.0
#: A replay state file larger than this is not one (it holds counts per category).
MAX_STATE_BYTES = 16 << 20


def read_kept_json(path: str | os.PathLike[str], limit: int = MAX_STATE_BYTES, form: str | None = None) -> Any:
    """The JSON in a kept replay file (of ``"format": form`` if given); else a :class:`ReplayFileError` saying why."""
    try:
        with open(path, "rb") as f:
            raw = f.read(limit + 1)
        if len(raw) > limit:
            raise ValueError(f"over {limit >> 20} MiB")
        value = strict_json.loads(raw.decode("utf-8"))
    except (OSError, ValueError) as err:  # JSON, strict JSON and UTF-8 errors are ValueErrors
        raise ReplayFileError(path, f"damaged: {first_line(err)}") from None
    if form is not None and (not isinstance(value, dict) or value.get("format") != form):
        raise ReplayFileError(path, f"damaged: not a {form} file")
    return value


def tokens_key(encoded: Mapping[str, Sequence[int]], starts: Mapping[str, int] | None = None) -> str:
    """A hash of the rows' token ids (and first target tokens, where not 1): the rows tokenized otherwise have another."""
    h = hashlib.sha256()
    for pid, ids in encoded.items():
        h.update(json.dumps(pid).encode("utf-8"))
        h.update(np.asarray(ids, dtype=np.int64).tobytes())
        if (start := (starts or {}).get(pid, 1)) != 1:
            h.update(f"@{start}".encode())
    return h.hexdigest()[:16]


_MADE_FOR = {
    "pool": "another replay pool (its rows' ids, texts or categories differ)",
    "tokens": "the rows tokenized otherwise (another tokenizer, chat template or max length)",
    "top_k": "another top_k",
    "prompts": "the prompts tokenized otherwise (another tokenizer or chat template)",
    "model": "a model of another configuration than this run's base",
    "weights": "other weights than this run's base model (the base snapshot's)",
}


def key_problem(key: Any, expected: Mapping[str, Any]) -> str | None:
    """Why a kept ``key`` is not ``expected`` (``None`` if it is; a ``None`` expected value is not checked)."""
    if not isinstance(key, Mapping) or not key:
        return "it has no key saying what it was made from, so it cannot be told apart from another run's"
    return next((f"made for {_MADE_FOR[k]}" for k, v in expected.items() if v is not None and key.get(k) != v), None)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def state_problem(replay: Any, state: Any, step: int) -> str | None:
    """Why ``state`` (the watch's state's, or a history record's ``replay``) cannot be ``replay``'s at ``step``."""
    if not isinstance(state, Mapping):
        return f"not a replay state (a JSON {type(state).__name__}, not an object)"
    if problem := key_problem(state.get("key"), replay.key):
        return problem
    if not _number(weight := state.get("weight")) or not 0 <= weight <= MAX_WEIGHT:
        return f"its weight is {shorten(weight)}, not a number from 0 to {MAX_WEIGHT:g}"
    if type(size := state.get("batch_size")) is not int or size < 1:
        return f"its batch size is {shorten(size)}, not a whole number from 1"
    if type(tokens := state.get("tokens")) is not int or tokens < 0:
        return f"its count of replay tokens is {shorten(tokens)}, not a whole number from 0"
    loss = state.get("loss", {"sum": 0.0, "steps": 0})
    if not isinstance(loss, Mapping) or not _number(loss.get("sum")) or type(loss.get("steps")) is not int:
        return f"its replay loss since the last evaluation is {shorten(loss)}, not a finite sum and a count of steps"
    if not 0 <= loss["steps"] <= step:
        return f"its replay loss since the last evaluation is over {loss['steps']} steps, not 0 to {step}"
    if (select := state.get("select")) != replay.select:
        return f"made with select={shorten(select)}, not {replay.select!r}"
    warned = state.get("warned", [])
    if not isinstance(warned, list) or not all(isinstance(c, str) for c in warned):
        return f"its categories warned of are {shorten(warned)}, not a list of names"
    return replay.sampler.state_problem(state.get("sampler"), max_drawn=step)


def first_kept(
    run: Any,
    name: str,
    load: Callable[[Path], Any],
    problem: Callable[[Any], str | None],
    share: Callable = lambda x: x,
) -> tuple[Any, list[str], str]:
    """``name`` in the run's directory if it loads and has no ``problem`` (found on rank 0, shared as ``share`` makes
    it), why not, and that in one line."""
    paths = [run.store.dir / name] if run.store is not None else []

    def find() -> dict[str, Any]:
        kept, rejected = first_usable(paths, load, problem)
        return {"kept": None if kept is None else share(kept), "rejected": rejected}

    found = run.ranks.share_from_rank_zero(find)
    why = "; ".join(found["rejected"]) or f"no {name} in {', '.join(str(p.parent) for p in paths)}"
    return found["kept"], found["rejected"], why


def measured_once(
    run: Any,
    model: Any,
    name: str,
    kind: Any,
    key: Mapping[str, Any],
    problem: Callable[[Any, int], str | None],
    needs: str,
    measure: Callable[[], Any],
) -> Any:
    """What ``measure()`` makes on the base on a fresh run (a ``kind``), kept with the run; on resume the first kept
    copy made for ``key`` with no ``problem`` (given the vocabulary size), else one error naming each."""
    if run.reads_back:
        vocab = logits_width(model)
        check = (kind.load, lambda v: key_problem(v.key, key) or problem(v, vocab), kind.to_dict)
        kept, _, why = first_kept(run, name, *check)
        if kept is None:
            raise ReplayFileError(
                None, f"{needs}, kept in the run directory when the run began, and it cannot serve ({why})"
            )
        value = kind.from_dict(kept)
    else:
        with run.as_base(model):
            value = measure()
    if run.writes and run.store is not None:
        run.store.keep(name, value.save)  # kept with the run
    return value
