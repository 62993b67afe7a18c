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

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Any

from forgetwatch.common.files import content_hash
from forgetwatch.common.problems import InputError
from forgetwatch.common.rows import FieldProblem, Rows
from forgetwatch.common.text import listing, shorten, type_name
from forgetwatch.config import checks as check
from forgetwatch.config.settings import ReplaySettings
from forgetwatch.probes.schema import check_category, unkeepable
from forgetwatch.replay.overlap import overlaps
from forgetwatch.scoring.encoding import encode_many

if TYPE_CHECKING:
    from forgetwatch.replay.driver import Replay

__all__ = ["Answering", "ReplayPool", "ReplayPoolError", "ReplayRow"]

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


class ReplayPool(Sequence[ReplayRow]):
    """Validated replay rows with unique ids.

    ``answering``: how the base model answers the prompt rows (default :class:`Answering`'s);
    a pool without prompt rows has none (:attr:`answering` is ``None``).

    Example:
        >>> pool = ReplayPool.from_records([{"id": "r1", "text": "Paris is in France.", "category": "geo"}])
        >>> pool.categories, pool[0].plain_text, pool.answering
        (['geo'], 'Paris is in France.', None)
    """

    def __init__(self, rows: Iterable[ReplayRow], source: str = "<records>", answering: Answering | None = None):
        self._rows = tuple(rows)
        self.source = source
        has_prompts = any(r.prompt is not None for r in self._rows)
        self._answering = (answering or Answering()) if has_prompts else None
        self._fingerprint: str | None = None

    @classmethod
    def from_jsonl(
        cls,
        path: str | os.PathLike[str],
        *,
        max_new_tokens: int = 64,
        chat_template: bool = False,
        stop: Sequence[str] = (),
    ) -> ReplayPool:
        """Load and validate a JSONL pool file; every bad row is named in one :class:`ReplayPoolError`.
        ``max_new_tokens``, ``chat_template``, ``stop``: how prompt rows are answered (:class:`Answering`).

        Example:
            >>> pool = ReplayPool.from_jsonl("replay.jsonl")  # doctest: +SKIP
        """
        answering = Answering(max_new_tokens, chat_template, stop)
        return cls(_rows(str(path), "line").read_jsonl(path, "replay pool file"), str(path), answering)

    @classmethod
    def from_records(
        cls,
        records: Iterable[Mapping[str, Any]],
        source: str = "<records>",
        *,
        max_new_tokens: int = 64,
        chat_template: bool = False,
        stop: Sequence[str] = (),
    ) -> ReplayPool:
        """Build from dicts in the pool-file schema; errors name 1-based record numbers.
        ``max_new_tokens``, ``chat_template``, ``stop``: how prompt rows are answered (:class:`Answering`).

        Example:
            >>> pool = ReplayPool.from_records([{"id": "q", "prompt": "Name a river."}], max_new_tokens=16)
            >>> pool[0].prompt, pool.answering.max_new_tokens
            ('Name a river.', 16)
        """
        answering = Answering(max_new_tokens, chat_template, stop)
        return cls(_rows(source, "record").read_records(records), source, answering)

    @classmethod
    def from_prompts(
        cls,
        prompts: Iterable[str | Mapping[str, Any]] | Mapping[str, Iterable[str]],
        *,
        max_new_tokens: int = 64,
        chat_template: bool = False,
        stop: Sequence[str] = (),
        category: str | None = None,
    ) -> ReplayPool:
        """A pool of prompt rows, answered by the base model when training begins (synthetic
        replay: the model's own answers are what it is kept close to, no curated text needed).

        ``prompts``: strings (ids ``p0``, ``p1``, ... in order), dicts ``{id?, prompt,
        category?}`` (a missing id is ``p`` and the position), or a mapping of category to
        strings (ids numbered on across categories). ``category``: the category of rows that
        name none (default ``"all"``; not with a mapping). ``max_new_tokens`` (1 to 4096),
        ``chat_template``, ``stop``: how they are answered (:class:`Answering`). Every bad
        prompt is named (``prompt N``: its position) in one :class:`ReplayPoolError`.

        Example:
            >>> pool = ReplayPool.from_prompts(["Name a river of Europe.", "What is 2 + 3?"], max_new_tokens=32)
            >>> [(r.id, r.category) for r in pool], pool.answering.max_new_tokens
            ([('p0', 'all'), ('p1', 'all')], 32)
            >>> pool = ReplayPool.from_prompts({"geo": ["Name a river."], "math": ["What is 2 + 3?"]})
            >>> [(r.id, r.category, r.prompt) for r in pool]
            [('p0', 'geo', 'Name a river.'), ('p1', 'math', 'What is 2 + 3?')]
            >>> ReplayPool.from_prompts([{"id": "sum", "prompt": "What is 2 + 3?"}], category="math")[0]
            ReplayRow(id='sum', text=None, messages=None, category='math', prompt='What is 2 + 3?')
        """
        answering = Answering(max_new_tokens, chat_template, stop)
        if category is not None and (message := check_category(category)):
            raise ValueError(f"category= {message}")
        if isinstance(prompts, (str, bytes)):
            raise TypeError("give the prompts as a list of strings, not one string: from_prompts([prompt])")
        if isinstance(prompts, Mapping):
            if category is not None:
                raise ValueError("give each prompt's category as the mapping's keys or as category=, not both")
            items: list[tuple[Any, Any]] = []
            for key, members in prompts.items():
                if isinstance(members, (str, bytes)) or not isinstance(members, Iterable):
                    raise TypeError(f"category {shorten(key)}: give a list of prompt strings, got {type_name(members)}")
                items += [(key, m) for m in members]
        else:
            items = [(category, m) for m in prompts]
        rows = _rows("<prompts>", "prompt", kinds=("prompt",))
        for n, (cat, item) in enumerate(items):
            if isinstance(item, str):
                record = {"id": f"p{n}", "prompt": item}
            elif isinstance(item, Mapping):
                record = {"id": f"p{n}", **item}
            else:
                rows.problem(
                    n, None, f"expected a prompt (a string) or a dict {{id?, prompt, category?}}, got {type_name(item)}"
                )
                continue
            if cat is not None and "category" not in record:
                record["category"] = cat
            rows.add(n, record)
        return cls(rows.finish(), rows.source, answering)

    @classmethod
    def from_hf(
        cls,
        dataset: Iterable[Mapping[str, Any]],
        *,
        text: str | None = None,
        messages: str | None = None,
        prompt: str | None = None,
        id: str | None = None,
        category: str | None = None,
        limit: int | None = None,
        max_new_tokens: int = 64,
        chat_template: bool = False,
        stop: Sequence[str] = (),
    ) -> ReplayPool:
        """Build from a ``datasets.Dataset`` (or any iterable of dict rows): ``text`` or
        ``messages`` names the column to train on, or ``prompt`` a column of prompts the base
        model answers (answered as ``max_new_tokens``, ``chat_template``, ``stop`` say:
        :class:`Answering`); ``id`` the id column (default: the row number), ``category`` a
        category for every row; ``limit`` keeps the first N rows. Errors name 0-based dataset
        rows.

        Example:
            >>> pool = ReplayPool.from_hf(load_dataset("wikitext", split="train"), text="text")  # doctest: +SKIP
            >>> pool = ReplayPool.from_hf(instructions, prompt="instruction", max_new_tokens=128)  # doctest: +SKIP
        """
        columns = {k: c for k, c in (("text", text), ("messages", messages), ("prompt", prompt)) if c is not None}
        if len(columns) != 1:
            raise ValueError(
                "give the column to train on: text=COLUMN or messages=COLUMN, or the column of prompts the base "
                "model answers: prompt=COLUMN (one of them)"
            )
        [(kind, column)] = columns.items()
        answering = Answering(max_new_tokens, chat_template, stop)
        if category is not None and (message := check_category(category)):
            raise ValueError(f"category= {message}")
        rows = _rows(getattr(getattr(dataset, "info", None), "dataset_name", None) or "<dataset>", "dataset row")
        for index, row in enumerate(dataset if limit is None else islice(dataset, limit)):
            if not isinstance(row, Mapping):
                rows.add(index, row)
                continue
            record: dict[str, Any] = {"id": str(row[id]) if id is not None and id in row else str(index)}
            if column not in row:
                rows.problem(index, column, f"missing column {column!r}; this row has {', '.join(map(str, row))}")
                continue
            record[kind] = row[column]
            if category is not None:
                record["category"] = category
            rows.add(index, record)
        return cls(rows.finish(), rows.source, answering)

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i):  # type: ignore[override]
        return ReplayPool(self._rows[i], self.source, self._answering) if isinstance(i, slice) else self._rows[i]

    def __iter__(self) -> Iterator[ReplayRow]:
        return iter(self._rows)

    def __repr__(self) -> str:
        return f"ReplayPool({len(self)} rows from {self.source!r})"

    @property
    def categories(self) -> list[str]:
        return sorted({r.category for r in self._rows})

    @property
    def answering(self) -> Answering | None:
        """How the base model answers the prompt rows; ``None`` for a pool without any (all
        its rows are trained on as written).

        Example:
            >>> ReplayPool.from_prompts(["Name a river."], stop=["\\n"]).answering
            Answering(max_new_tokens=64, chat_template=False, stop=('\\n',))
        """
        return self._answering

    def prompt_ids(self, tokenizer: Any) -> dict[str, list[int]]:
        """Every prompt row's model input as token ids, by row id, rendered as
        :attr:`answering` says (as :meth:`ReplayRow.prompt_ids` renders one row, here in one
        batch); a ``ValueError`` naming the rows if they are answered as chats and the tokenizer
        has no chat template.

        Example:
            >>> pool = ReplayPool.from_prompts(["Name a river.", "What is 2 + 3?"])
            >>> ids = pool.prompt_ids(tokenizer)  # doctest: +SKIP
            >>> list(ids)  # doctest: +SKIP
            ['p0', 'p1']
        """
        rows = [r for r in self._rows if r.prompt is not None]
        if not rows:
            return {}
        chat = self._answering is not None and self._answering.chat_template
        if chat and not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"replay pool {self.source}: its prompt rows ({listing(shorten(r.id) for r in rows)}) are answered "
                "as chats (chat_template=True) but the tokenizer has no chat template; answer them as plain text "
                "(chat_template=False), or use a tokenizer with a chat template"
            )
        texts = [r.prompt_text(tokenizer, chat) for r in rows]
        return {r.id: ids for r, ids in zip(rows, encode_many(tokenizer, texts))}

    def fingerprint(self) -> str:
        """A hash of the rows' content (ids, categories, texts, chats or prompts, in order) and,
        with prompt rows, of how they are answered: which pool a kept replay state, base
        distribution or set of answers was made for.

        Example:
            >>> ReplayPool.from_records([{"id": "r1", "text": "t"}]).fingerprint()
            '1a77ffe96941ceb7'
        """
        if self._fingerprint is None:  # the rows never change: hashed once
            self._fingerprint = content_hash(self._hashed()).hexdigest()[:16]
        return self._fingerprint

    def _hashed(self) -> Iterator[Any]:
        # a pool without prompt rows hashes as it always has: kept states stay usable
        for r in self._rows:
            row = [r.id, r.category, r.text, r.messages]
            yield row if r.prompt is None else [*row, r.prompt]
        if self._answering is not None:
            yield {"answering": self._answering.as_dict()}

    def as_repair(self, settings: ReplaySettings | None = None) -> Replay:
        """This pool replayed with ``settings``: the repair method a run takes as ``replay=``.

        Example:
            >>> pool.as_repair(ReplaySettings(weight=0.5)).weight   # doctest: +SKIP
            0.5
        """
        from forgetwatch.replay.driver import Replay  # the driver reads pools: imported when used

        return Replay(self, settings)

    def check_disjoint(self, probes: Iterable[Any]) -> None:
        """Refuse rows (a prompt row: its prompt) that contain a probe's question, in whatever form it is written (case,
        spacing, punctuation, Unicode forms, invisible characters and look-alike letters aside:
        :mod:`~forgetwatch.replay.overlap`): a ``ValueError`` naming each such row and probe (up
        to 20 pairs).

        Example:
            >>> from forgetwatch import Probe
            >>> pool = ReplayPool.from_records([{"id": "r1", "text": "Q:The ｃａｐｉｔａｌ of Zet\u0430 is? A: Vo"}])
            >>> pool.check_disjoint([Probe(id="p1", question="the capital of  zeta is", answer="Vo")])
            Traceback (most recent call last):
                ...
            ValueError: replay pool <records> holds probe questions; a probe trained on is no longer held out. Remove these rows: row 'r1' contains the question of probe 'p1'
        """
        pairs = overlaps(self._rows, probes)
        if pairs:
            shown = "; ".join(f"row {shorten(r)} contains the question of probe {shorten(p)}" for r, p in pairs[:20])
            more = f"; and {len(pairs) - 20} more" if len(pairs) > 20 else ""
            raise ValueError(
                f"replay pool {self.source} holds probe questions; a probe trained on is no longer "
                f"held out. Remove these rows: {shown}{more}"
            )


def _rows(source: str, unit: str, kinds: tuple[str, ...] = KINDS) -> Rows[ReplayRow]:
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
