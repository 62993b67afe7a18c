"""ReplayPool: text the model may be trained on to repair forgetting, kept apart from the probes.

A pool file is JSONL, one row per line::

    {"id": "r1", "text": "The capital of France is Paris.", "category": "geography"}
    {"id": "r2", "messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}]}
    {"id": "r3", "prompt": "Name three rivers of Europe.", "category": "geography"}

``text`` is trained on as it is; ``messages`` (a chat, whatever its last turn) is rendered with
the tokenizer's chat template and trained on as it is. ``prompt`` is a prompt row: the base
model (the model when training begins) answers it greedily, and the row trained on is the
prompt followed by that answer, the loss on the answer alone (synthetic replay: no curated
text needed). How it answers is the pool's :class:`Answering` (most new tokens, stop strings,
whether each prompt is a chat user turn). ``category`` (default ``"all"``) names the probe
category the row helps repair. Every row is validated before anything is returned, and
:meth:`ReplayPool.check_disjoint` refuses a pool that holds a probe's question (a prompt row's
prompt included): a probe trained on is no longer held out, and what it measures would mean
nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from forgetwatch.common.problems import InputError
from forgetwatch.common.rows import FieldProblem, Rows
from forgetwatch.common.text import shorten, type_name
from forgetwatch.config import checks as check
from forgetwatch.probes.schema import check_category, unkeepable
from forgetwatch.scoring.encoding import encode_many

__all__ = ["Answering", "ReplayPoolError", "ReplayRow", "check_category", "pool_rows"]

ROLES = ("system", "user", "assistant", "tool")
#: What a row trains on: exactly one of these fields.
KINDS = ("text", "messages", "prompt")
#: The longest answer the base model may write to a prompt row: a replayed answer is a reply,
#: and each token is one more step of the generation pass when training begins.
MAX_ANSWER_TOKENS = 4096


class ReplayPoolError(InputError):
    """A replay pool file or record set is malformed (one line per problem: file, line, field)."""

    noun = "field"


_ANSWERING_RULES = {
    "max_new_tokens": check.integer(
        1, MAX_ANSWER_TOKENS, f"use at most {MAX_ANSWER_TOKENS}: a replayed answer is a reply, not a document"
    ),
    "chat_template": check.boolean,
    "stop": check.stop_strings,
}


@dataclass(frozen=True)
class Answering:
    """How the base model answers a pool's prompt rows: greedily, in at most
    ``max_new_tokens`` tokens (1 to 4096), cut at the first of the ``stop`` strings (EOS
    always ends an answer); with ``chat_template``, each prompt is a user turn rendered by the
    tokenizer's chat template with the generation prompt. A bad value is a ``ValueError``
    naming it.

    Example:
        >>> Answering(max_new_tokens=32, stop=["\\n"]).as_dict()
        {'max_new_tokens': 32, 'chat_template': False, 'stop': ['\\n']}
        >>> Answering(max_new_tokens=0)
        Traceback (most recent call last):
            ...
        ValueError: max_new_tokens= expected an integer from 1 to 4096, got 0 (int); use 1 or more
    """

    max_new_tokens: int = 64
    chat_template: bool = False
    stop: Sequence[str] = ()  # kept as a tuple

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):  # one stop string, as Scorer takes it
            object.__setattr__(self, "stop", (self.stop,))
        for name, rule in _ANSWERING_RULES.items():
            try:
                rule(getattr(self, name))
            except check.Invalid as err:
                raise ValueError(f"{name}= {err}") from None
        object.__setattr__(self, "stop", tuple(self.stop))

    def as_dict(self) -> dict[str, Any]:
        """The settings as JSON values (what a file of kept answers is keyed by)."""
        return {"max_new_tokens": self.max_new_tokens, "chat_template": self.chat_template, "stop": list(self.stop)}


@dataclass(frozen=True)
class ReplayRow:
    """One row of a pool: ``text``, a chat as ``messages`` (role/content dicts), or a
    ``prompt`` the base model answers (the row trained on is the prompt and its answer)."""

    id: str
    text: str | None = None
    messages: tuple[Mapping[str, str], ...] | None = None
    category: str = "all"
    prompt: str | None = None

    @property
    def plain_text(self) -> str:
        """What the row says, chat turns joined; a prompt row's prompt: what the overlap check reads."""
        if self.prompt is not None:
            return self.prompt
        return self.text if self.text is not None else "\n".join(m["content"] for m in self.messages)

    def render(self, tokenizer: Any) -> str:
        """The text to train on: ``text``, or ``messages`` through the tokenizer's chat template.
        A prompt row has none until the base model answers it: a ``ValueError``."""
        if self.prompt is not None:
            raise ValueError(
                f"replay row {self.id!r} is a prompt: what it trains on is the base model's answer, "
                "generated when training begins (its prompt's tokens: prompt_ids)"
            )
        if self.text is not None:
            return self.text
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"replay row {self.id!r} is a chat (messages) but the tokenizer has no chat template; "
                "give the row as text, or use a tokenizer with a chat template"
            )
        return tokenizer.apply_chat_template(list(self.messages), tokenize=False)

    def prompt_text(self, tokenizer: Any, chat_template: bool) -> str:
        """A prompt row's model input as text: the prompt, or with ``chat_template`` the prompt
        as a user turn through the tokenizer's chat template, with the generation prompt (a
        ``ValueError`` naming the row if the tokenizer has no template, or the row is no prompt).

        Example:
            >>> row = ReplayRow(id="p0", prompt="Name a river.")
            >>> row.prompt_text(tokenizer=None, chat_template=False)  # as written: no tokenizer needed
            'Name a river.'
        """
        if self.prompt is None:
            raise ValueError(f"replay row {self.id!r} is no prompt row: it is trained on as written")
        if not chat_template:
            return self.prompt
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"replay row {self.id!r} is a prompt answered as a chat (chat_template=True) but the tokenizer "
                "has no chat template; answer the prompts as plain text (chat_template=False), or use a "
                "tokenizer with a chat template"
            )
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": self.prompt}], tokenize=False, add_generation_prompt=True
        )

    def prompt_ids(self, tokenizer: Any, chat_template: bool) -> list[int]:
        """A prompt row's model input as token ids (:meth:`prompt_text`, tokenized as probe
        prompts are: with the tokenizer's special tokens, unless the text already starts with
        its BOS, as many chat templates write it): what the base model answers, and what the
        row trained on starts with.

        Example:
            >>> ReplayRow(id="p0", prompt="Name a river.").prompt_ids(tokenizer, chat_template=False)  # doctest: +SKIP
            [1, 3723, 263, 8580, 29889]
        """
        return encode_many(tokenizer, [self.prompt_text(tokenizer, chat_template)])[0]


def pool_rows(source: str, unit: str, kinds: tuple[str, ...] = KINDS) -> Rows[ReplayRow]:
    """A collector of pool rows holding one of ``kinds`` (from_prompts: prompts alone)."""

    def parse(row: Mapping[str, Any]) -> ReplayRow | list[FieldProblem]:
        return _parse(row, kinds)

    return Rows(source, unit, parse, ReplayPoolError, "no rows found; add at least one row")


def _parse(row: Mapping[str, Any], kinds: tuple[str, ...] = KINDS) -> ReplayRow | list[FieldProblem]:
    """One pool row, or every problem found in it."""
    problems = list(_check(row, kinds))
    if problems:
        return problems
    messages = row.get("messages")
    return ReplayRow(
        id=row["id"],
        text=row.get("text"),
        category=row.get("category", "all"),
        messages=None if messages is None else tuple(dict(m) for m in messages),
        prompt=row.get("prompt"),
    )


_WHAT = {
    "text": "'text' (text to train on)",
    "messages": "'messages' (a chat to train on)",
    "prompt": "'prompt' (text the base model answers, its answer trained on)",
}


def _check(row: Mapping[str, Any], kinds: tuple[str, ...] = KINDS) -> Iterator[FieldProblem]:
    """Every problem of one pool row, as ``(field, message)``: it holds exactly one of ``kinds``."""
    pid = row.get("id")
    if not isinstance(pid, str) or not pid.strip():
        yield "id", f"must be a non-empty string, got {type_name(pid)}; give every row a unique id"
    elif message := unkeepable(pid, allow_layout=False):
        yield "id", message
    given = [k for k in kinds if row.get(k) is not None]
    if len(given) != 1:
        parts = [_WHAT[k] for k in kinds]
        wanted = parts[0] if len(parts) == 1 else f"exactly one of {', '.join(parts[:-1])} or {parts[-1]}"
        has = "none" if not given else " and ".join(repr(k) for k in given)
        yield None, f"give {wanted}; this row has {has}"
    elif given[0] in ("text", "prompt"):
        field = given[0]
        if not isinstance(row[field], str) or not row[field].strip():
            yield field, f"must be non-empty text, got {type_name(row[field])}"
        elif message := unkeepable(row[field], allow_layout=True):
            yield field, message
    else:
        yield from _check_messages(row["messages"])
    if "category" in row and (message := check_category(row["category"])):
        yield "category", message
    unknown = sorted(set(row) - {"id", "category", *kinds})
    if unknown:
        holds = "id, text, messages or prompt, category" if kinds == KINDS else f"id, {', '.join(kinds)}, category"
        yield None, f"unknown field(s) {', '.join(shorten(k) for k in unknown)}; a row holds {holds}"


def _check_messages(messages: Any) -> Iterator[tuple[str, str]]:
    if not isinstance(messages, list) or not messages:
        yield "messages", f"must be a non-empty list of {{role, content}} objects, got {type_name(messages)}"
        return
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            yield (
                "messages",
                (f'turn {i} must be {{"role": one of {", ".join(ROLES)}, "content": text}}, got {shorten(m)}'),
            )
        elif message := unkeepable(m["content"], allow_layout=True):
            yield "messages", f"turn {i}: content {message}"
