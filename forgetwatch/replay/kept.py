"""What a resumed run reads back for replay, and whether it may: the draws (a checkpoint's
``replay.json``, or rebuilt from the history), and what was measured on the base once (with
``loss="kl"`` its distribution on the rows, for prompt rows its answers).

Every copy is checked before any of it is used: its values and its key, which ties it to what
made it (the pool's rows, their tokens, the seed, top k, the base model and its weights). A
copy that fails says why and the next is tried; when none serves, training does not begin.

Rebuilding the draws from the history is exact: a history record holds the state after its
evaluation, and from there every optimizer step draws one batch with the weights that
evaluation set (a step draws whether or not it replays).

The functions take the run's :class:`~forgetwatch.Replay` as ``replay`` (read, never changed).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from forgetwatch.common import strict_json
from forgetwatch.common.text import first_line, shorten
from forgetwatch.replay.sampler import ReplaySampler, category_weights
from forgetwatch.results.report import TransitionReport
from forgetwatch.scoring.next_tokens import BaseDistribution, KeptFileError, first_usable

__all__ = [
    "REPLAY_ANSWERS",
    "REPLAY_BASE",
    "REPLAY_STATE",
    "ReplayFileError",
    "base_problem",
    "base_to_resume",
    "kept_base",
    "kept_copy",
    "key_problem",
    "kept_state",
    "read_kept_json",
    "rebuilt_state",
    "state_problem",
    "state_to_resume",
    "tokens_key",
]

REPLAY_STATE = "replay.json"  # in a checkpoint: where the draws stood
REPLAY_BASE = "replay_base.npz"  # the base's next-token distribution on the rows (loss "kl")
REPLAY_ANSWERS = "replay_answers.json"  # the base's answers to a pool's prompts (synthetic replay)

#: A kept replay file that cannot serve this run: one class with every kept file's error.
ReplayFileError = KeptFileError
#: The heaviest replay weight: the replay loss at most this many times the trainer's.
MAX_WEIGHT = 100.0
#: A replay state file larger than this is not one (it holds counts per category).
MAX_STATE_BYTES = 16 << 20


def read_kept_json(path: str | os.PathLike[str], limit: int, form: str | None = None) -> Any:
    """The JSON in a kept replay file; a :class:`ReplayFileError` names the file and why it cannot
    be read (over ``limit`` bytes, not UTF-8, not JSON, numbers past what JSON keeps, or not an
    object of ``"format": form`` when ``form`` is given).

    Example:
        >>> read_kept_json("/nonexistent/replay.json", MAX_STATE_BYTES)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
            ...
        forgetwatch.scoring.next_tokens.KeptFileError: /nonexistent/replay.json: damaged: ...
    """
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
    """A hash of the rows' token ids, in order, and of each first target token that is not 1:
    the same pool tokenized otherwise (another tokenizer, chat template or ``max_length``) has
    another key.

    Example:
        >>> tokens_key({"r1": [1, 2, 3]}) == tokens_key({"r1": [1, 2, 4]})
        False
    """
    h = hashlib.sha256()
    for pid, ids in encoded.items():
        h.update(json.dumps(pid).encode("utf-8"))
        h.update(np.asarray(ids, dtype=np.int64).tobytes())
        if (starts or {}).get(pid, 1) != 1:
            h.update(f"@{starts[pid]}".encode())
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
    for name, want in expected.items():
        if want is not None and key.get(name) != want:
            return f"made for {_MADE_FOR[name]}"
    return None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def state_problem(replay: Any, state: Any, step: int) -> str | None:
    """Why ``state`` (a checkpoint's ``replay.json``, or a history record's ``replay`` entry)
    cannot be ``replay``'s state at optimizer step ``step`` (``None`` if it can).

    Example:
        >>> state_problem(replay, {"weight": float("nan"), ...}, 10)   # doctest: +SKIP
        'its weight is nan, not a number from 0 to 100'
    """
    if not isinstance(state, Mapping):
        return f"not a replay state (a JSON {type(state).__name__}, not an object)"
    if problem := key_problem(state.get("key"), replay.key):
        return problem
    if not _number(weight := state.get("weight")) or not 0 <= weight <= MAX_WEIGHT:
        return f"its weight is {shorten(weight)}, not a number from 0 to {MAX_WEIGHT:g}"
    size = state.get("batch_size")
    if type(size) is not int or size < 1:
        return f"its batch size is {shorten(size)}, not a whole number from 1"
    tokens = state.get("tokens")
    if type(tokens) is not int or tokens < 0:
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


def kept_state(replay: Any, paths: Sequence[Path], step: int) -> dict[str, Any]:
    """The first of ``paths`` (``replay.json`` files) that is ``replay``'s state at ``step``,
    and why each one before it was passed over: JSON-ready, to share from rank 0."""
    state, rejected = first_usable(
        paths, lambda p: read_kept_json(p, MAX_STATE_BYTES), lambda s: state_problem(replay, s, step)
    )
    return {"state": state, "rejected": rejected}


def state_to_resume(
    replay: Any,
    found: Mapping[str, Any],
    paths: Sequence[Path],
    records: Sequence[Mapping[str, Any]],
    report: TransitionReport | None,
    step: int,
) -> tuple[dict[str, Any], str | None]:
    """The state to resume at ``step`` with, from what :func:`kept_state` ``found``, else
    rebuilt from the history (:func:`rebuilt_state`), and a warning to give when it was
    rebuilt; a :class:`ReplayFileError` naming every copy when neither serves."""
    if found["state"] is not None:
        return found["state"], None
    why = "; ".join(found["rejected"]) or f"no replay state in {', '.join(str(p.parent) for p in paths)}"
    try:  # a copy passed over means replay was on at the checkpoint: its draws cannot start afresh
        state, how = rebuilt_state(replay, records, report, step, afresh=not found["rejected"])
    except ValueError as err:
        raise ReplayFileError(
            None,
            f"no replay state to resume step {step} with ({why}); {err}. Resume from a "
            "checkpoint whose forgetwatch folder is whole, or train without replay=",
        ) from None
    return state, (
        f"no usable replay state for step {step} ({why}); rebuilt it {how} (the replay loss of the steps "
        "before the resume is not kept in the history: the next replay/loss is over the steps from here)"
    )


def rebuilt_state(
    replay: Any,
    records: Sequence[Mapping[str, Any]],
    report: TransitionReport | None,
    step: int,
    afresh: bool = True,
) -> tuple[dict[str, Any], str]:
    """``replay``'s state at ``step`` rebuilt from the history (``records`` up to ``step``;
    ``report``: the last one's), and how: from the last record's state, or from the start of
    the run when no evaluation came before ``step``; or, if ``afresh``, a new one when the last
    record has none (replay was not on then). A ``ValueError`` says why the history cannot give it.

    Example:
        >>> state, how = rebuilt_state(replay, callback._records, callback.history[-1][1], 30)  # doctest: +SKIP
    """
    sampler = ReplaySampler(replay.sampler.pool, replay.seed, uniform=replay.select == "uniform")
    tokens, warned = 0, None
    if records and "replay" not in records[-1]:
        if not afresh:
            raise ValueError(f"the history holds no replay state at its last evaluation (step {records[-1]['step']})")
        return replay.state_of(sampler, replay.weight, replay.batch_size, 0), (
            f"replay was not on at the last evaluation (step {records[-1]['step']}): its draws start afresh"
        )
    if records:
        since, kept = records[-1]["step"], records[-1]["replay"]
        if problem := state_problem(replay, kept, since):
            raise ValueError(f"the history's replay state at step {since} cannot be used either: {problem}")
        sampler.load_state_dict(kept["sampler"], max_drawn=since)
        weight, batch_size, tokens, warned = kept["weight"], kept["batch_size"], kept["tokens"], kept.get("warned")
        how = f"from the history's state at step {since}, then the draws of the {step - since} step(s) since"
    else:
        since, weight, batch_size, report = 0, replay.weight, replay.batch_size, None
        how = (
            f"from the start of the run (no evaluation before step {step}), with this run's replay settings, "
            f"then the draws of its {step} step(s)"
        )
    weights = category_weights(report, sampler.categories)
    if weight != 0:
        for _ in range(step - since):
            tokens += sum(len(replay.encoded[r.id]) for r in sampler.next_batch(batch_size, weights))
    state = replay.state_of(sampler, weight, batch_size, tokens)
    return (state if warned is None else {**state, "warned": warned}), how


def kept_copy(found: Mapping[str, Any], paths: Sequence[Path], what: str, needs: str) -> tuple[Any, str | None]:
    """The kept copy (JSON-ready) a ``kept_*`` function ``found``, and a warning to give when a
    copy was passed over; a :class:`ReplayFileError` naming every copy when none serves.
    ``what``: the file's contents, for the warning; ``needs``: what the run needs it for."""
    why = "; ".join(found["rejected"]) or f"none in {', '.join(str(p.parent) for p in paths)}"
    if found["kept"] is None:
        raise ReplayFileError(
            None,
            f"{needs}, kept when the run began, and no copy can serve ({why}); resume from a checkpoint that has "
            "a good one",
        )
    warning = f"passed over kept {what} ({why}); using another copy" if found["rejected"] else None
    return found["kept"], warning


def base_problem(
    replay: Any, base: BaseDistribution, made_by: Mapping[str, str | None], vocab: int | None
) -> str | None:
    """Why a kept base distribution cannot serve ``replay`` (``None`` if it can): its key
    against this run's rows, tokens and top k, and ``made_by`` (the base model's
    configuration and weights keys; ``None``: not checked); its rows and lengths against the
    tokenized pool; its token ids against the model's ``vocab`` size."""
    if problem := key_problem(base.key, {**replay.key, "top_k": replay.top_k, **made_by}):
        return problem
    ids = list(replay.encoded)
    lengths = [len(replay.encoded[i]) - replay.starts.get(i, 1) for i in ids]
    if base.ids != ids or np.diff(base.offsets).tolist() != lengths:
        return "damaged: its rows or their lengths are not those of the tokenized pool"
    if vocab is not None and len(base.top_ids) and int(base.top_ids.max()) >= vocab:
        return f"damaged: a token id ({int(base.top_ids.max())}) is outside the model's vocabulary of {vocab}"
    return None


def kept_base(replay: Any, paths: Sequence[Path], made_by: Mapping[str, str | None], vocab: int | None) -> dict:
    """The first of ``paths`` (``replay_base.npz`` files) that can serve ``replay`` (see
    :func:`base_problem`), and why each one before it was passed over: JSON-ready, to share
    from rank 0 (nodes need not share storage)."""
    base, rejected = first_usable(paths, BaseDistribution.load, lambda b: base_problem(replay, b, made_by, vocab))
    return {"kept": None if base is None else base.to_dict(), "rejected": rejected}


def base_to_resume(found: Mapping[str, Any], paths: Sequence[Path]) -> tuple[BaseDistribution, str | None]:
    """The base distribution :func:`kept_base` ``found`` (see :func:`kept_copy`)."""
    needs = 'loss="kl" needs the base model\'s distribution on the replay rows (or use loss="lm")'
    kept, warning = kept_copy(found, paths, "replay base distributions", needs)
    return BaseDistribution.from_dict(kept), warning
