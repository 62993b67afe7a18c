"""Synthetic replay: the base answers a pool's prompts once when training begins; the answers are kept with the run
and read back on resume."""

from __future__ import annotations

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
        """What is wrong with them, or ``None`` (given ``prompts``: one answer to each)."""
        if prompts is not None and (missing := [p for p in prompts if p not in self.answers]):
            more = f" (nor to {len(missing) - 1} more)" if len(missing) > 1 else ""
            return f"damaged: it has no answer to prompt {shorten(missing[0])}{more}"
        if prompts is not None and len(self.answers) != len(prompts):
            return "damaged: it has answers to prompts that are not the pool's"
        for pid, a in self.answers.items():
            if not all(type(t) is int and 0 <= t and (vocab is None or t < vocab) for t in a.ids):
                below = "" if vocab is None else f" below the model's vocabulary of {vocab}"
                return f"the answer to {shorten(pid)} has token ids that are not whole numbers from 0{below}"
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
        if problem := kept.problem():
            raise ReplayFileError(path, f"damaged: {problem}")
        return kept
