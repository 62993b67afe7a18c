"""Replay as a run begins: refuse what it cannot run under, go on with the draws where a resumed
run left them, and what is measured on the base once and kept: with ``replay_loss="kl"`` the
base's distribution on the rows, with ``replay_select="rows"`` its loss on the scanned rows.

Rank 0 reads the kept files (nodes need not share storage) and shares what it found, so every
rank resumes from the same state or every rank raises the same error.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import torch

from forgetwatch.replay.resume import (
    answers_to_resume,
    base_to_resume,
    kept_answers,
    kept_base,
    kept_scan,
    kept_state,
    scan_to_resume,
    state_problem,
    state_to_resume,
)
from forgetwatch.replay.scan import ScanBase, sample_key
from forgetwatch.replay.synthetic import KeptAnswers, answer_prompts, prompts_key
from forgetwatch.results.noise import noise_by_scope
from forgetwatch.results.store import REPLAY_ANSWERS, REPLAY_BASE, REPLAY_SCAN, REPLAY_STATE
from forgetwatch.scoring.generation import Generated
from forgetwatch.scoring.next_tokens import logits_width
from forgetwatch.scoring.scorer import pad_id

if TYPE_CHECKING:
    from forgetwatch.replay.driver import Replay
    from forgetwatch.run.repair import RunContext

logger = logging.getLogger("forgetwatch")


def begin(replay: Replay, model: torch.nn.Module, run: RunContext) -> None:
    """Start ``replay`` for a run: the base's answers to prompt rows, then tokenize the pool; on
    resume its state from the run's own (``run.state``), else the first kept ``replay.json``,
    else rebuilt from the history (exact, and said), else one clear error naming each copy; then
    the base distribution for ``"kl"`` and the base's loss on the scanned rows."""
    replay.metric = run.stop_metric
    replay.noise = noise_by_scope(dict(run.base_meta))
    replay.refuse_sharded(model, run.sharded)
    answers = _answers(replay, model, run) if replay.pool.answering is not None else None
    replay.start(model, run.tokenizer, sharded=run.sharded, warn=run.writes, answers=answers)
    if run.step > 0:
        if run.state is not None:
            if problem := state_problem(replay, run.state, run.step):
                raise ValueError(f"the replay state given to load_state_dict() cannot be used: {problem}")
            kept = dict(run.state)
        else:
            paths = [d / REPLAY_STATE for d in run.resume_dirs]
            found = run.ranks.share_from_rank_zero(lambda: kept_state(replay, paths, run.step))
            kept, warning = state_to_resume(replay, found, paths, run.records, run.last_report, run.step)
            if warning and run.writes:
                logger.warning("forgetwatch: %s", warning)
        replay.resume(kept, run.step)
    if run.last_report is not None:
        replay.reweigh(run.last_report, steer=False)
    if replay.loss == "kl":
        _base_distribution(replay, model, run)
    if replay.scans:
        _scan_base(replay, model, run)


def _answers(replay: Replay, model: torch.nn.Module, run: RunContext) -> dict[str, Generated]:
    """The base's answers to the pool's prompts: generated on a fresh run (sharded over the
    ranks), read back on resume (as :func:`_base_distribution`)."""
    prompt_ids = replay.pool.prompt_ids(run.tokenizer)
    key = {"pool": replay.pool.fingerprint(), "prompts": prompts_key(prompt_ids), **run.made_by(model)}
    if run.reads_back:
        paths = [d / REPLAY_ANSWERS for d in run.resume_dirs]
        vocab = logits_width(model)
        found = run.ranks.share_from_rank_zero(lambda: kept_answers(paths, key, vocab, list(prompt_ids)))
        kept, warning = answers_to_resume(found, paths)
        if warning and run.writes:
            logger.warning("forgetwatch: %s", warning)
    else:
        began = time.perf_counter()
        with run.as_base(model):
            answers = answer_prompts(
                model, run.tokenizer, replay.pool, prompt_ids, run.ranks, run.rows_per_batch(model)
            )
        kept = KeptAnswers(answers, key)
        if run.writes:
            logger.info(
                "forgetwatch: replay: the base answered %d prompts in %.1f s (kept in %s)",
                len(answers),
                time.perf_counter() - began,
                REPLAY_ANSWERS,
            )
    if run.writes:
        run.store.keep(REPLAY_ANSWERS, kept.save)
    return kept.answers


def _base_distribution(replay: Replay, model: torch.nn.Module, run: RunContext) -> None:
    """On a fresh run (and with ``base="adapter_disabled"``, which is never read back) from the
    model; on resume the first kept copy whose arrays check out and whose key is this run's."""
    made_by = run.made_by(model)
    if run.reads_back:
        paths = [d / REPLAY_BASE for d in run.resume_dirs]
        vocab = logits_width(model)
        found = run.ranks.share_from_rank_zero(lambda: kept_base(replay, paths, made_by, vocab))
        replay.base, warning = base_to_resume(found, paths)
        if warning and run.writes:
            logger.warning("forgetwatch: %s", warning)
    else:
        with run.as_base(model):
            replay.cache_base(model, run.tokenizer, pad_id(run.tokenizer), run.rows_per_batch(model), made_by)
    if run.writes:
        run.store.save_replay_base(replay.base)  # kept with the run (and its checkpoints) for the next resume


def _scan_base(replay: Replay, model: torch.nn.Module, run: RunContext) -> None:
    """The base's loss on the scanned rows: measured on a fresh run, read back on resume (as
    :func:`_base_distribution`)."""
    made_by = run.made_by(model)
    if run.reads_back:
        paths = [d / REPLAY_SCAN for d in run.resume_dirs]
        found = run.ranks.share_from_rank_zero(lambda: kept_scan(replay, paths, made_by))
        if found["kept"] is None and replay.select != "rows":  # "auto" scans only to judge its reach
            replay.scans, replay.increase = False, None
            if run.writes:
                logger.warning(
                    'forgetwatch: replay_weight="auto" resumes without judging its reach: no kept replay scan '
                    "can serve (%s)",
                    "; ".join(found["rejected"]) or "none kept (a run of an earlier release)",
                )
            return
        replay.scan_base, warning = scan_to_resume(found, paths)
        if warning and run.writes:
            logger.warning("forgetwatch: %s", warning)
    else:
        with run.as_base(model):
            losses = replay.scan_losses(model)
        key = {**replay.key, "sample": sample_key(replay.scanned), **made_by}
        replay.scan_base = ScanBase(replay.scanned, losses.tolist(), key)
        if problem := replay.scan_base.problem():  # a base that cannot score its own rows: said before training
            raise ValueError(f"the base model's loss on the replay rows cannot be kept: {problem}")
    if run.writes:
        run.store.keep(REPLAY_SCAN, replay.scan_base.save)
