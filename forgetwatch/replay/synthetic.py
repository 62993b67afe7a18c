"""Synthetic replay: a pool of prompts (:meth:`~forgetwatch.ReplayPool.from_prompts`) whose
targets the base model writes. When training begins the base answers every prompt once
(greedy, batched, sharded over the ranks like probe generation); each row trained on is then the
prompt and that answer, its loss on the answer's tokens only. The answers are kept with the run
(``replay_answers.json``) and read back on resume: they cannot be written again from moved
weights.

Example:
    >>> pool = ReplayPool.from_prompts(["Name a river.", "Say hello."], max_new_tokens=16)  # doctest: +SKIP
    >>> ForgetWatchCallback(probes, replay=pool)                                          # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from forgetwatch.common.distributed import Ranks
from forgetwatch.common.files import atomic_write, strict_dumps
from forgetwatch.common.text import first_line, shorten
from forgetwatch.replay.kept import ReplayFileError, kept_copy, key_problem, read_kept_json
from forgetwatch.scoring.generation import Generated, generate_sharded
from forgetwatch.scoring.next_tokens import first_usable

__all__ = ["KeptAnswers", "answer_prompts", "answers_to_resume", "kept_answers", "prompts_key"]

_FORMAT = "forgetwatch.replay_answers"
#: A kept answers file larger than this is not one.
MAX_ANSWERS_BYTES = 64 << 20


def prompts_key(prompt_ids: Mapping[str, list[int]]) -> str:
    """A hash of the prompts' token ids, in order."""
    h = hashlib.sha256()
    for pid, ids in prompt_ids.items():
        h.update(json.dumps([pid, list(ids)]).encode("utf-8"))
    return h.hexdigest()[:16]


def answer_prompts(
    model: torch.nn.Module,
    tokenizer: Any,
    pool: Any,
    prompt_ids: Mapping[str, list[int]],
    ranks: Ranks,
    rows_per_batch: int,
) -> dict[str, Generated]:
    """The model's greedy answers to the pool's prompts (as :attr:`ReplayPool.answering`
    says), by row id; every rank must call it together and gets every answer."""
    answering = pool.answering
    ids = list(prompt_ids)
    out = generate_sharded(
        model,
        tokenizer,
        [prompt_ids[i] for i in ids],
        max_new_tokens=answering.max_new_tokens,
        stop=answering.stop,
        ranks=ranks,
        rows_per_batch=rows_per_batch,
        return_ids=True,
        names=ids,
    )
    return dict(zip(ids, out))


@dataclass
class KeptAnswers:
    """The answers of a run, and ``key``: what they were made from (the pool and its answering
    settings, the prompts' tokens, the base model and its weights)."""

    answers: dict[str, Generated]
    key: dict[str, Any]

    def problem(self, vocab: int | None = None, prompts: Collection[str] | None = None) -> str | None:
        """What is wrong with them, or ``None``: ids whole numbers inside the vocabulary, text a
        string, and (given ``prompts``, the pool's row ids) one answer to each prompt.

        Example:
            >>> KeptAnswers({"p0": Generated("x", (-1,), True)}, {}).problem()
            "the answer to 'p0' has a token id below 0"
            >>> KeptAnswers({"p0": Generated("x", (1,), True)}, {}).problem(prompts=["p0", "p1"])
            "damaged: it has no answer to prompt 'p1'"
        """
        if prompts is not None and (missing := [p for p in prompts if p not in self.answers]):
            return f"damaged: it has no answer to prompt {shorten(missing[0])}" + (
                f" (nor to {len(missing) - 1} more)" if len(missing) > 1 else ""
            )
        if prompts is not None and len(self.answers) != len(prompts):
            return "damaged: it has answers to prompts that are not the pool's"
        for pid, a in self.answers.items():
            if not isinstance(a.ids, tuple) or not all(isinstance(t, int) and not isinstance(t, bool) for t in a.ids):
                return f"the answer to {shorten(pid)} has token ids that are not whole numbers"
            if any(t < 0 for t in a.ids):
                return f"the answer to {shorten(pid)} has a token id below 0"
            if vocab is not None and any(t >= vocab for t in a.ids):
                return f"the answer to {shorten(pid)} has a token id outside the model's vocabulary of {vocab}"
            if not isinstance(a.text, str) or not isinstance(a.ended, bool):
                return f"the answer to {shorten(pid)} has no text or no ended flag"
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": _FORMAT,
            "version": 1,
            "key": self.key,
            "answers": {i: {"ids": list(a.ids), "text": a.text, "ended": a.ended} for i, a in self.answers.items()},
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> KeptAnswers:
        answers = {i: Generated(a["text"], tuple(a["ids"]), a["ended"]) for i, a in d["answers"].items()}
        return cls(answers, dict(d["key"]))

    def save(self, path: str | os.PathLike[str]) -> None:
        with atomic_write(path, "w") as f:
            f.write(strict_dumps(self.to_dict()))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> KeptAnswers:
        """Read a file written by :meth:`save`; a :class:`ReplayFileError` names it and what is wrong."""
        d = read_kept_json(path, MAX_ANSWERS_BYTES, _FORMAT)
        try:
            kept = cls.from_dict(d)
        except (KeyError, TypeError, AttributeError, ValueError) as err:
            raise ReplayFileError(path, f"damaged: {first_line(err)}") from None
        if not isinstance(kept.key, dict):
            raise ReplayFileError(path, "damaged: its key is not a JSON object")
        if problem := kept.problem():
            raise ReplayFileError(path, f"damaged: {problem}")
        return kept


def kept_answers(
    paths: Sequence[Path], key: Mapping[str, Any], vocab: int | None, prompts: Collection[str]
) -> dict[str, Any]:
    """The first of ``paths`` (``replay_answers.json`` files) made with ``key`` (the pool, its
    prompts' tokens and the base model) that answers each of ``prompts`` (the pool's row ids) with
    token ids that fit the model's ``vocab``, and why each one before it was passed over:
    JSON-ready, to share from rank 0."""

    def problem(kept: KeptAnswers) -> str | None:
        return key_problem(kept.key, key) or kept.problem(vocab, prompts)

    kept, rejected = first_usable(paths, KeptAnswers.load, problem)
    return {"kept": None if kept is None else kept.to_dict(), "rejected": rejected}


def answers_to_resume(found: Mapping[str, Any], paths: Sequence[Path]) -> tuple[KeptAnswers, str | None]:
    """The answers :func:`kept_answers` ``found`` (see :func:`kept_copy`)."""
    needs = "a pool of prompts replays the base model's answers to them"
    kept, warning = kept_copy(found, paths, "replay answers", needs)
    return KeptAnswers.from_dict(kept), warning
