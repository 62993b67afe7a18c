"""Synthetic replay: the base answers a pool's prompts once when training begins (greedy, sharded
over the ranks); the answers are kept with the run and read back on resume."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from forgetwatch.common.distributed import Ranks
from forgetwatch.common.files import atomic_write, strict_dumps
from forgetwatch.common.text import first_line, shorten
from forgetwatch.replay.kept import ReplayFileError, read_kept_json
from forgetwatch.scoring.generation import Generated, fit_prompts, generate_sharded

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
    """The model's greedy answers to the pool's prompts, by row id; every rank calls it and gets every answer."""
    answering = pool.answering
    prompts = fit_prompts(model, tokenizer, prompt_ids, answering.max_new_tokens, answering.stop)
    out = generate_sharded(model, tokenizer, prompts, ranks=ranks, rows_per_batch=rows_per_batch, return_ids=True)
    return dict(zip(prompt_ids, out))


@dataclass
class KeptAnswers:
    """The answers of a run, and ``key``: what they were made from (pool, prompts' tokens, base model)."""

    answers: dict[str, Generated]
    key: dict[str, Any]

    def problem(self, vocab: int | None = None, prompts: Collection[str] | None = None) -> str | None:
        """What is wrong with them, or ``None`` (given ``prompts``: one answer to each).

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
        """Read a file :meth:`save` wrote; a :class:`ReplayFileError` names it and what is wrong."""
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
