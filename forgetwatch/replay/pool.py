"""ReplayPool: text the model may be trained on to repair forgetting, kept apart from the probes.

A pool file is JSONL, one row per line::

    {"id": "r1", "text": "The capital of France is Paris.", "category": "geography"}
    {"id": "r2", "messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}]}

``text`` is trained on as it is; ``messages`` (a chat) is rendered with the tokenizer's chat
template. ``category`` (default ``"all"``) names the probe category the row helps repair.
Every row is validated before anything is returned, and :meth:`ReplayPool.check_disjoint`
refuses a pool that holds a probe's question: a probe trained on is no longer held out, and
what it measures would mean nothing.
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
from forgetwatch.common.text import shorten, type_name
from forgetwatch.config.settings import ReplaySettings
from forgetwatch.probes.schema import check_category, unkeepable
from forgetwatch.replay.overlap import overlaps

if TYPE_CHECKING:
    from forgetwatch.replay.driver import Replay

__all__ = ["ReplayPool", "ReplayPoolError", "ReplayRow"]

ROLES = ("system", "user", "assistant", "tool")


class ReplayPoolError(InputError):
    """A replay pool file or record set is malformed (one line per problem: file, line, field)."""

    noun = "field"


@dataclass(frozen=True)
class ReplayRow:
    """One row of a pool: ``text``, or a chat as ``messages`` (role/content dicts)."""

    id: str
    text: str | None = None
    messages: tuple[Mapping[str, str], ...] | None = None
    category: str = "all"

    @property
    def plain_text(self) -> str:
        """What the row says, chat turns joined: what the overlap check reads."""
        return self.text if self.text is not None else "\n".join(m["content"] for m in self.messages)

    def render(self, tokenizer: Any) -> str:
        """The text to train on: ``text``, or ``messages`` through the tokenizer's chat template."""
        if self.text is not None:
            return self.text
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"replay row {self.id!r} is a chat (messages) but the tokenizer has no chat template; "
                "give the row as text, or use a tokenizer with a chat template"
            )
        return tokenizer.apply_chat_template(list(self.messages), tokenize=False)


class ReplayPool(Sequence[ReplayRow]):
    """Validated replay rows with unique ids.

    Example:
        >>> pool = ReplayPool.from_records([{"id": "r1", "text": "Paris is in France.", "category": "geo"}])
        >>> pool.categories, pool[0].plain_text
        (['geo'], 'Paris is in France.')
    """

    def __init__(self, rows: Iterable[ReplayRow], source: str = "<records>"):
        self._rows = tuple(rows)
        self.source = source
        self._fingerprint: str | None = None

    @classmethod
    def from_jsonl(cls, path: str | os.PathLike[str]) -> ReplayPool:
        """Load and validate a JSONL pool file; every bad row is named in one :class:`ReplayPoolError`.

        Example:
            >>> pool = ReplayPool.from_jsonl("replay.jsonl")  # doctest: +SKIP
        """
        return cls(_rows(str(path), "line").read_jsonl(path, "replay pool file"), str(path))

    @classmethod
    def from_records(cls, records: Iterable[Mapping[str, Any]], source: str = "<records>") -> ReplayPool:
        """Build from dicts in the pool-file schema; errors name 1-based record numbers."""
        return cls(_rows(source, "record").read_records(records), source)

    @classmethod
    def from_hf(
        cls,
        dataset: Iterable[Mapping[str, Any]],
        *,
        text: str | None = None,
        messages: str | None = None,
        id: str | None = None,
        category: str | None = None,
        limit: int | None = None,
    ) -> ReplayPool:
        """Build from a ``datasets.Dataset`` (or any iterable of dict rows): ``text`` or
        ``messages`` names the column to train on, ``id`` the id column (default: the row
        number), ``category`` a category for every row; ``limit`` keeps the first N rows.
        Errors name 0-based dataset rows.

        Example:
            >>> pool = ReplayPool.from_hf(load_dataset("wikitext", split="train"), text="text")  # doctest: +SKIP
        """
        if (text is None) == (messages is None):
            raise ValueError("give the column to train on: text=COLUMN or messages=COLUMN (one of them)")
        if category is not None and (message := check_category(category)):
            raise ValueError(f"category= {message}")
        rows = _rows(getattr(getattr(dataset, "info", None), "dataset_name", None) or "<dataset>", "dataset row")
        for index, row in enumerate(dataset if limit is None else islice(dataset, limit)):
            if not isinstance(row, Mapping):
                rows.add(index, row)
                continue
            record: dict[str, Any] = {"id": str(row[id]) if id is not None and id in row else str(index)}
            column = text if text is not None else messages
            if column not in row:
                rows.problem(index, column, f"missing column {column!r}; this row has {', '.join(map(str, row))}")
                continue
            record["text" if text is not None else "messages"] = row[column]
            if category is not None:
                record["category"] = category
            rows.add(index, record)
        return cls(rows.finish(), rows.source)

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i):  # type: ignore[override]
        return ReplayPool(self._rows[i], self.source) if isinstance(i, slice) else self._rows[i]

    def __iter__(self) -> Iterator[ReplayRow]:
        return iter(self._rows)

    def __repr__(self) -> str:
        return f"ReplayPool({len(self)} rows from {self.source!r})"

    @property
    def categories(self) -> list[str]:
        return sorted({r.category for r in self._rows})

    def fingerprint(self) -> str:
        """A hash of the rows' content (ids, categories, texts or chats, in order): which pool a
        kept replay state or base distribution was made for.

        Example:
            >>> ReplayPool.from_records([{"id": "r1", "text": "t"}]).fingerprint()
            '1a77ffe96941ceb7'
        """
        if self._fingerprint is None:  # the rows never change: hashed once
            self._fingerprint = content_hash([r.id, r.category, r.text, r.messages] for r in self._rows).hexdigest()[
                :16
            ]
        return self._fingerprint

    def as_repair(self, settings: ReplaySettings | None = None) -> Replay:
        """This pool replayed with ``settings``: the repair method a run takes as ``replay=``.

        Example:
            >>> pool.as_repair(ReplaySettings(weight=0.5)).weight   # doctest: +SKIP
            0.5
        """
        from forgetwatch.replay.driver import Replay  # the driver reads pools: imported when used

        return Replay(self, settings)

    def check_disjoint(self, probes: Iterable[Any]) -> None:
        """Refuse rows that contain a probe's question, in whatever form it is written (case,
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


def _rows(source: str, unit: str) -> Rows[ReplayRow]:
    return Rows(source, unit, _parse, ReplayPoolError, "no rows found; add at least one row")


def _parse(row: Mapping[str, Any]) -> ReplayRow | list[FieldProblem]:
    """One pool row, or every problem found in it."""
    problems = list(_check(row))
    if problems:
        return problems
    messages = row.get("messages")
    return ReplayRow(
        id=row["id"],
        text=row.get("text"),
        category=row.get("category", "all"),
        messages=None if messages is None else tuple(dict(m) for m in messages),
    )


def _check(row: Mapping[str, Any]) -> Iterator[FieldProblem]:
    """Every problem of one pool row, as ``(field, message)``."""
    pid = row.get("id")
    if not isinstance(pid, str) or not pid.strip():
        yield "id", f"must be a non-empty string, got {type_name(pid)}; give every row a unique id"
    elif message := unkeepable(pid, allow_layout=False):
        yield "id", message
    has_text, has_messages = row.get("text") is not None, row.get("messages") is not None
    if has_text == has_messages:
        yield None, "give either 'text' (a string) or 'messages' (a chat), not " + ("both" if has_text else "neither")
    elif has_text and (not isinstance(row["text"], str) or not row["text"].strip()):
        yield "text", f"must be non-empty text, got {type_name(row['text'])}"
    elif has_text and (message := unkeepable(row["text"], allow_layout=True)):
        yield "text", message
    elif has_messages:
        yield from _check_messages(row["messages"])
    if "category" in row and (message := check_category(row["category"])):
        yield "category", message
    unknown = sorted(set(row) - {"id", "text", "messages", "category"})
    if unknown:
        yield (
            None,
            (f"unknown field(s) {', '.join(shorten(k) for k in unknown)}; a row holds id, text or messages, category"),
        )


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
