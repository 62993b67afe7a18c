"""What a resumed run reads back for replay, and whether it may: the draws (a checkpoint's
``replay.json``, or rebuilt from the history) and what was measured on the base once: with
``replay_loss="kl"`` its distribution on the rows (``replay_base.npz``), for scans its loss on
the scanned rows (``replay_scan.json``), for prompt rows its answers (``replay_answers.json``).

Every copy is checked before any of it is used: its values (whole counts, a finite weight in
range, arrays that make a distribution) and its key, which ties it to what made it (the pool's
rows, their tokens, the seed, top k, and the base model's configuration and weights). A copy
that fails says why and the next is tried; when none serves, training does not begin.

Rebuilding the draws from the history is exact: a history record holds the state after its
evaluation (version 2; an earlier release's record holds it before, and the weight is steered
again), and from there every optimizer step draws one batch with the weights that evaluation set (:meth:`~forgetwatch.replay.driver.Replay.step` draws whether or not it
replays), so replaying those draws gives the state at any later step.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from forgetwatch.common.text import shorten
from forgetwatch.replay.base_cache import BaseDistribution, ReplayFileError, read_kept_json
from forgetwatch.replay.controller import MAX_WEIGHT, MIN_WEIGHT, START, Controller, next_weight
from forgetwatch.replay.sampler import category_weights
from forgetwatch.replay.scan import ScanBase, decode_increase, encode_increase, row_probabilities, sample_key
from forgetwatch.replay.synthetic import KeptAnswers
from forgetwatch.scoring.next_tokens import first_usable

if TYPE_CHECKING:
    from forgetwatch.replay.driver import Replay
    from forgetwatch.results.report import TransitionReport

__all__ = [
    "base_problem",
    "base_to_resume",
    "answers_to_resume",
    "kept_answers",
    "kept_base",
    "kept_scan",
    "kept_state",
    "rebuilt_state",
    "scan_to_resume",
    "state_problem",
    "state_to_resume",
    "tokens_key",
]

#: A replay state file larger than this is not one (it holds counts per category).
MAX_STATE_BYTES = 16 << 20


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


def _key_problem(key: Any, expected: Mapping[str, Any]) -> str | None:
    """Why a kept ``key`` is not ``expected`` (``None`` if it is; a ``None`` expected value is not checked)."""
    if not isinstance(key, Mapping) or not key:
        return (
            "it has no key saying what it was made from (written by an earlier forgetwatch), so it cannot "
            "be told apart from another run's"
        )
    what = {
        "pool": "another replay pool (its rows' ids, texts or categories differ)",
        "tokens": "the rows tokenized otherwise (another tokenizer, chat template or max length)",
        "top_k": f"replay_top_k={shorten(key.get('top_k'))}, not {expected.get('top_k')}",
        "sample": "other scanned rows (another replay_scan_rows or replay_seed)",
        "prompts": "the prompts tokenized otherwise (another tokenizer or chat template)",
        "model": "a model of another configuration than this run's base",
        "weights": "other weights than this run's base model (the base snapshot's)",
    }
    for name, want in expected.items():
        if want is not None and key.get(name) != want:
            return f"made for {what[name]}"
    return None


def state_problem(replay: Replay, state: Any, step: int) -> str | None:
    """Why ``state`` (a checkpoint's ``replay.json``, or a history record's ``replay`` entry)
    cannot be ``replay``'s state at optimizer step ``step`` (``None`` if it can).

    Example:
        >>> state_problem(replay, {"weight": float("nan"), ...}, 10)   # doctest: +SKIP
        'its weight is nan, not a finite number from 0'
    """
    if not isinstance(state, Mapping):
        return f"not a replay state (a JSON {type(state).__name__}, not an object)"
    if problem := _key_problem(state.get("key"), replay.key):
        return problem
    weight, limit = state.get("weight"), MAX_WEIGHT if replay.auto else math.inf
    least = MIN_WEIGHT if replay.auto else 0
    if not _number(weight) or not least <= weight <= limit:
        return f"its weight is {shorten(weight)}, not a finite number " + (
            f"from {MIN_WEIGHT:g} to {MAX_WEIGHT:g}" if replay.auto else "from 0"
        )
    size = state.get("batch_size")
    if type(size) is not int or size < 1:
        return f"its batch size is {shorten(size)}, not a whole number from 1"
    tokens = state.get("tokens", 0)  # an earlier release's state has none
    if type(tokens) is not int or tokens < 0:
        return f"its count of replay tokens is {shorten(tokens)}, not a whole number from 0"
    loss = state.get("loss", {"sum": 0.0, "steps": 0})
    if not isinstance(loss, Mapping) or not _number(loss.get("sum")) or type(loss.get("steps")) is not int:
        return f"its replay loss since the last evaluation is {shorten(loss)}, not a finite sum and a count of steps"
    if not 0 <= loss["steps"] <= step:
        return f"its replay loss since the last evaluation is over {loss['steps']} steps, not 0 to {step}"
    select = state.get("select", "categories")
    if select != replay.select:
        return f"made with replay_select={shorten(select)}, not {replay.select!r}"
    if replay.scans and (select == "rows" or "scan" in state):  # an earlier release's "auto" state has none
        scan = state.get("scan")
        if not isinstance(scan, Mapping) or scan.get("sample") != sample_key(replay.scanned):
            return "made for other scanned rows (another replay_scan_rows, replay_seed or pool)"
        if decode_increase(scan.get("increase"), len(replay.scanned)) is None:
            return f"its rows' loss rises are not {len(replay.scanned)} finite float32 numbers in base64"
    if replay.auto and "controller" in state and (problem := Controller.state_problem(state["controller"])):
        return f"its controller: {problem}"
    warned = state.get("warned", [])
    if not isinstance(warned, list) or not all(isinstance(c, str) for c in warned):
        return f"its categories warned of are {shorten(warned)}, not a list of names"
    return replay.sampler.state_problem(state.get("sampler"), max_drawn=step)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def read_state(path: str | os.PathLike[str]) -> Any:
    """The JSON in a ``replay.json`` file (see :func:`~forgetwatch.replay.base_cache.read_kept_json`)."""
    return read_kept_json(path, MAX_STATE_BYTES)


def kept_state(replay: Replay, paths: Sequence[Path], step: int) -> dict[str, Any]:
    """The first of ``paths`` (``replay.json`` files) that is ``replay``'s state at ``step``,
    and why each one before it was passed over: JSON-ready, to share from rank 0."""
    state, rejected = first_usable(paths, read_state, lambda s: state_problem(replay, s, step))
    return {"state": state, "rejected": rejected}


def state_to_resume(
    replay: Replay,
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
    replay: Replay,
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
    sampler = replay.new_sampler(replay.sampler.pool)
    rows = replay.select == "rows"
    increase = np.zeros(len(replay.scanned), np.float32) if replay.scans else None
    tokens, extra = 0, {}
    if records and "replay" not in records[-1]:
        if not afresh:
            raise ValueError(f"the history holds no replay state at its last evaluation (step {records[-1]['step']})")
        return _state(replay, sampler, replay.weight if not replay.auto else START, replay.batch_size, 0, increase), (
            f"replay was not on at the last evaluation (step {records[-1]['step']}): its draws start afresh"
        )
    if records:
        since, kept = records[-1]["step"], records[-1]["replay"]
        if problem := state_problem(replay, kept, since):
            raise ValueError(f"the history's replay state at step {since} cannot be used either: {problem}")
        sampler.load_state_dict(kept["sampler"], max_drawn=since)
        weight, batch_size, tokens = kept["weight"], kept["batch_size"], kept.get("tokens", 0)
        extra = {k: kept[k] for k in ("controller", "warned") if k in kept}
        if replay.scans and "scan" in kept:
            increase = decode_increase(kept["scan"]["increase"], len(replay.scanned))
        if replay.auto and kept.get("version") is None:  # an earlier release wrote it before steering
            weight = next_weight(weight, getattr(report, replay.metric), replay.target)
            extra["controller"] = {"weight": weight}
        how = f"from the history's state at step {since}, then the draws of the {step - since} step(s) since"
    else:
        since, weight, batch_size = 0, START if replay.auto else replay.weight, replay.batch_size
        report = None
        how = (
            f"from the start of the run (no evaluation before step {step}), with this run's replay settings, "
            f"then the draws of its {step} step(s)"
        )
    weights = row_probabilities(increase.astype(np.float64)) if rows else category_weights(report, sampler.categories)
    if weight != 0:
        for _ in range(step - since):
            tokens += sum(len(replay.encoded[r.id]) for r in sampler.next_batch(batch_size, weights))
    return {**_state(replay, sampler, weight, batch_size, tokens, increase), **extra}, how


def _state(
    replay: Replay, sampler: Any, weight: float, batch_size: int, tokens: int, increase: np.ndarray | None
) -> dict[str, Any]:
    state = {
        "version": 2,
        "select": replay.select,
        "sampler": sampler.state_dict(),
        "weight": weight,
        "batch_size": batch_size,
        "tokens": tokens,
        "key": dict(replay.key),
    }
    if increase is not None:
        state["scan"] = {"sample": sample_key(replay.scanned), "increase": encode_increase(increase)}
    return state


def kept_base(
    replay: Replay, paths: Sequence[Path], made_by: Mapping[str, str | None], vocab: int | None
) -> dict[str, Any]:
    """The first of ``paths`` (``replay_base.npz`` files) that can serve ``replay`` (see
    :func:`base_problem`), and why each one before it was passed over: JSON-ready, to share
    from rank 0 (nodes need not share storage)."""
    base, rejected = first_usable(paths, BaseDistribution.load, lambda b: base_problem(replay, b, made_by, vocab))
    return {"kept": None if base is None else base.to_dict(), "rejected": rejected}


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


def base_to_resume(found: Mapping[str, Any], paths: Sequence[Path]) -> tuple[BaseDistribution, str | None]:
    """The base distribution :func:`kept_base` ``found`` (see :func:`kept_copy`)."""
    needs = 'replay_loss="kl" needs the base model\'s distribution on the replay rows (or use replay_loss="lm")'
    kept, warning = kept_copy(found, paths, "replay base distributions", needs)
    return BaseDistribution.from_dict(kept), warning


def base_problem(
    replay: Replay, base: BaseDistribution, made_by: Mapping[str, str | None], vocab: int | None
) -> str | None:
    """Why a kept base distribution cannot serve ``replay`` (``None`` if it can): its key
    against this run's rows, tokens and top k, and ``made_by`` (the base model's
    configuration and weights keys; ``None``: not checked); its rows and lengths against the
    tokenized pool; its token ids against the model's ``vocab`` size."""
    expected = {**replay.key, "top_k": replay.top_k, **made_by}
    if problem := _key_problem(base.key, expected):
        return problem
    ids = list(replay.encoded)
    lengths = [len(replay.encoded[i]) - replay.starts.get(i, 1) for i in ids]
    if base.ids != ids or np.diff(base.offsets).tolist() != lengths:
        return "damaged: its rows or their lengths are not those of the tokenized pool"
    if vocab is not None and len(base.top_ids) and int(base.top_ids.max()) >= vocab:
        return f"damaged: a token id ({int(base.top_ids.max())}) is outside the model's vocabulary of {vocab}"
    return None


def kept_scan(replay: Replay, paths: Sequence[Path], made_by: Mapping[str, str | None]) -> dict[str, Any]:
    """The first of ``paths`` (``replay_scan.json`` files) made for ``replay``'s scanned rows
    and ``made_by`` (the base model's keys), and why each one before it was passed over:
    JSON-ready, to share from rank 0."""
    expected = {**replay.key, "sample": sample_key(replay.scanned), **made_by}

    def problem(scan: ScanBase) -> str | None:
        if reason := _key_problem(scan.key, expected):
            return reason
        return None if scan.ids == replay.scanned else "damaged: its rows are not this run's scanned rows"

    scan, rejected = first_usable(paths, ScanBase.load, problem)
    return {"kept": None if scan is None else scan.to_dict(), "rejected": rejected}


def scan_to_resume(found: Mapping[str, Any], paths: Sequence[Path]) -> tuple[ScanBase, str | None]:
    """The base losses :func:`kept_scan` ``found`` (see :func:`kept_copy`)."""
    needs = 'replay_select="rows" and replay_weight="auto" need the base model\'s loss on the scanned replay rows'
    kept, warning = kept_copy(found, paths, "replay scans", needs)
    return ScanBase.from_dict(kept), warning


def kept_answers(
    paths: Sequence[Path], key: Mapping[str, Any], vocab: int | None, prompts: Collection[str]
) -> dict[str, Any]:
    """The first of ``paths`` (``replay_answers.json`` files) made with ``key`` (the pool, its
    prompts' tokens and the base model) that answers each of ``prompts`` (the pool's row ids) with
    token ids that fit the model's ``vocab``, and why each one before it was passed over:
    JSON-ready, to share from rank 0."""

    def problem(kept: KeptAnswers) -> str | None:
        return _key_problem(kept.key, key) or kept.problem(vocab, prompts)

    kept, rejected = first_usable(paths, KeptAnswers.load, problem)
    return {"kept": None if kept is None else kept.to_dict(), "rejected": rejected}


def answers_to_resume(found: Mapping[str, Any], paths: Sequence[Path]) -> tuple[KeptAnswers, str | None]:
    """The answers :func:`kept_answers` ``found`` (see :func:`kept_copy`)."""
    needs = "a pool of prompts replays the base model's answers to them"
    kept, warning = kept_copy(found, paths, "replay answers", needs)
    return KeptAnswers.from_dict(kept), warning
