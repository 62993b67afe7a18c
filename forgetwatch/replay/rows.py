"""A replay pool's rows: ``id``; ``text``, ``messages`` (a chat) or ``prompt`` (the base's answer is trained on);
``category`` (default ``"all"``), the probe category it repairs."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field

from forgetwatch.common.problems import InputError
from forgetwatch.common.rows import FieldProblem, Rows
from forgetwatch.common.text import shorten, type_name
from forgetwatch.config.settings import MAX_STOP_STRINGS, Settings, StopString
from forgetwatch.probes.schema import check_category, unkeepable

ROLES = ("system", "user", "assistant", "tool")
#: What a row trains on: exactly one of these fields.
KINDS = ("text", "messages", "prompt")
#: The longest answer the base model may write to a prompt row.
MAX_ANSWER_TOKENS = 4096


class ReplayPoolError(InputError):
    """A replay pool file or record set is malformed (one line per problem: file, line, field)."""

    noun = "field"


class Answering(Settings):
    """How the base answers a pool's prompt rows: greedily, in at most ``max_new_tokens`` tokens, cut at the first
    ``stop`` string (EOS always ends one); with ``chat_template``, as a user turn."""

    max_new_tokens: Annotated[int, Field(ge=1, le=MAX_ANSWER_TOKENS)] = 64
    """Most tokens of an answer: a replayed answer is a reply, not a document."""
    chat_template: bool = False
    stop: Annotated[tuple[StopString, ...], Field(max_length=MAX_STOP_STRINGS, strict=False)] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"max_new_tokens": self.max_new_tokens, "chat_template": self.chat_template, "stop": list(self.stop)}


@dataclass(frozen=True)
class ReplayRow:
    """One row of a pool: ``text``, a chat as ``messages``, or a ``prompt`` the base model answers."""

    id: str
    text: str | None = None
    messages: tuple[Mapping[str, str], ...] | None = None
    category: str = "all"
    prompt: str | None = None

    @property
    def plain_text(self) -> str:
        """What the row says (chat turns joined; a prompt row's prompt): what the leak check reads."""
        if self.prompt is not None:
            return self.prompt
        return self.text if self.text is not None else "\n".join(m["content"] for m in self.messages)

    def render(self, tokenizer: Any) -> str:
        """The text to train on (a chat through the chat template); a prompt row has none: a ``ValueError``."""
        if self.prompt is not None:
            raise ValueError(
                f"replay row {self.id!r} is a prompt: what it trains on is the base model's answer, "
                "generated when training begins (its prompt's tokens: ReplayPool.prompt_ids)"
            )
        if self.text is not None:
            return self.text
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"replay row {self.id!r} is a chat (messages) but the tokenizer has no chat template; "
                "give the row as text, or use a tokenizer with a chat template"
            )
        return tokenizer.apply_chat_template(list(self.messages), tokenize=False)


def pool_rows(source: str, unit: str, kinds: tuple[str, ...] = KINDS) -> Rows[ReplayRow]:
    """A collector of pool rows holding one of ``kinds`` (from_prompts: prompts alone)."""

    def parse(row: Mapping[str, Any]) -> ReplayRow | list[FieldProblem]:
        if problems := list(_check(row, kinds)):
            return problems
        messages = row.get("messages") and tuple(map(dict, row["messages"]))
        return ReplayRow(row["id"], row.get("text"), messages, row.get("category", "all"), row.get("prompt"))

    return Rows(source, unit, parse, ReplayPoolError, "no rows found; add at least one row")


_WHAT = {
    "text": "'text' (text to train on)",
    "messages": "'messages' (a chat to train on)",
    "prompt": "'prompt' (text the base model answers, its answer trained on)",
}


def _check(row: Mapping[str, Any], kinds: tuple[str, ...]) -> Iterator[FieldProblem]:
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
    elif (field := given[0]) in ("text", "prompt"):
        if not isinstance(row[field], str) or not row[field].strip():
            yield field, f"must be non-empty text, got {type_name(row[field])}"
        elif message := unkeepable(row[field], allow_layout=True):
            yield field, message
    elif not isinstance(messages := row["messages"], list) or not messages:
        yield "messages", f"must be a non-empty list of {{role, content}} objects, got {type_name(messages)}"
    else:
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
                yield (
                    "messages",
                    f'turn {i} must be {{"role": one of {", ".join(ROLES)}, "content": text}}, got {shorten(m)}',
                )
            elif message := unkeepable(m["content"], allow_layout=True):
                yield "messages", f"turn {i}: content {message}"
    if "category" in row and (message := check_category(row["category"])):
        yield "category", message
    unknown = sorted(set(row) - {"id", "category", *kinds})
    if unknown:
        holds = "id, text, messages or prompt, category" if kinds == KINDS else f"id, {', '.join(kinds)}, category"
        yield None, f"unknown field(s) {', '.join(shorten(k) for k in unknown)}; a row holds {holds}"
