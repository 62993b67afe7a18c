"""ReplayPool: text the model may be trained on to repair forgetting, kept apart from the probes."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from itertools import islice
from typing import Any

from forgetwatch.common.files import content_hash
from forgetwatch.common.text import listing, shorten, type_name
from forgetwatch.probes.schema import check_category
from forgetwatch.replay.overlap import overlaps
from forgetwatch.replay.rows import Answering, ReplayRow, pool_rows
from forgetwatch.scoring.encoding import encode_many


class ReplayPool(Sequence[ReplayRow]):
    """Validated replay rows with unique ids; ``answering``: how the base answers its prompt rows
    (:class:`Answering`; ``None`` for a pool without any).

    Example:
        >>> pool = ReplayPool.from_records([{"id": "r1", "text": "Paris is in France.", "category": "geo"}])
        >>> pool.categories, pool[0].plain_text, pool.answering
        (['geo'], 'Paris is in France.', None)
    """

    def __init__(self, rows: Iterable[ReplayRow], source: str = "<records>", answering: Answering | None = None):
        self._rows = tuple(rows)
        self.source = source
        self.answering = (answering or Answering()) if any(r.prompt is not None for r in self._rows) else None
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
        answering = Answering(max_new_tokens=max_new_tokens, chat_template=chat_template, stop=stop)
        return cls(pool_rows(str(path), "line").read_jsonl(path, "replay pool file"), str(path), answering)

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
        """Build from dicts in the pool-file schema (errors name 1-based record numbers).

        Example:
            >>> pool = ReplayPool.from_records([{"id": "q", "prompt": "Name a river."}], max_new_tokens=16)
            >>> pool[0].prompt, pool.answering.max_new_tokens
            ('Name a river.', 16)
        """
        answering = Answering(max_new_tokens=max_new_tokens, chat_template=chat_template, stop=stop)
        return cls(pool_rows(source, "record").read_records(records), source, answering)

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
        """A pool of prompt rows, answered by the base model when training begins (synthetic replay):
        strings (ids ``p0``, ``p1``, ...), dicts ``{id?, prompt, category?}``, or a mapping of category
        to strings. ``category``: of rows that name none (default ``"all"``; not with a mapping).

        Example:
            >>> pool = ReplayPool.from_prompts(["Name a river of Europe.", "What is 2 + 3?"], max_new_tokens=32)
            >>> [(r.id, r.category) for r in pool], pool.answering.max_new_tokens
            ([('p0', 'all'), ('p1', 'all')], 32)
        """
        answering = Answering(max_new_tokens=max_new_tokens, chat_template=chat_template, stop=stop)
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
        rows = pool_rows("<prompts>", "prompt", kinds=("prompt",))
        for n, (cat, item) in enumerate(items):
            if not isinstance(item, (str, Mapping)):
                expected = "a prompt (a string) or a dict {id?, prompt, category?}"
                rows.problem(n, None, f"expected {expected}, got {type_name(item)}")
                continue
            record = {"id": f"p{n}", **({"prompt": item} if isinstance(item, str) else item)}
            rows.add(n, record if cat is None else {"category": cat, **record})
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
        """Build from a ``datasets.Dataset`` (or any iterable of dict rows): the column to train on
        (``text`` or ``messages``) or of prompts the base answers (``prompt``); ``id`` the id column
        (default: the row number), ``category`` one for every row, ``limit`` the first N rows.

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
        answering = Answering(max_new_tokens=max_new_tokens, chat_template=chat_template, stop=stop)
        if category is not None and (message := check_category(category)):
            raise ValueError(f"category= {message}")
        rows = pool_rows(getattr(getattr(dataset, "info", None), "dataset_name", None) or "<dataset>", "dataset row")
        for index, row in enumerate(dataset if limit is None else islice(dataset, limit)):
            if isinstance(row, Mapping) and column not in row:
                rows.problem(index, column, f"missing column {column!r}; this row has {', '.join(map(str, row))}")
            elif isinstance(row, Mapping):
                record = {"id": str(row[id]) if id is not None and id in row else str(index), kind: row[column]}
                rows.add(index, record if category is None else {**record, "category": category})
            else:
                rows.add(index, row)
        return cls(rows.finish(), rows.source, answering)

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i):  # type: ignore[override]
        return ReplayPool(self._rows[i], self.source, self.answering) if isinstance(i, slice) else self._rows[i]

    def __repr__(self) -> str:
        return f"ReplayPool({len(self)} rows from {self.source!r})"

    @property
    def categories(self) -> list[str]:
        return sorted({r.category for r in self._rows})

    def prompt_ids(self, tokenizer: Any) -> dict[str, list[int]]:
        """Every prompt row's model input as token ids, by row id (as a chat user turn, with the
        generation prompt, when ``answering.chat_template``)."""
        rows = [r for r in self._rows if r.prompt is not None]
        texts = [r.prompt for r in rows]
        if rows and self.answering.chat_template:
            if not getattr(tokenizer, "chat_template", None):
                raise ValueError(
                    f"replay pool {self.source}: its prompt rows ({listing(shorten(r.id) for r in rows)}) are answered "
                    "as chats (chat_template=True) but the tokenizer has no chat template; answer them as plain text "
                    "(chat_template=False), or use a tokenizer with a chat template"
                )
            turns = [[{"role": "user", "content": text}] for text in texts]
            texts = [tokenizer.apply_chat_template(t, tokenize=False, add_generation_prompt=True) for t in turns]
        return {r.id: ids for r, ids in zip(rows, encode_many(tokenizer, texts))}

    def fingerprint(self) -> str:
        """A hash of the rows (and of how prompt rows are answered): which pool a kept file was made for.

        Example:
            >>> ReplayPool.from_records([{"id": "r1", "text": "t"}]).fingerprint()
            '1a77ffe96941ceb7'
        """
        if self._fingerprint is None:  # the rows never change: hashed once
            rows = [
                [r.id, r.category, r.text, r.messages, *([] if r.prompt is None else [r.prompt])] for r in self._rows
            ]
            answering = [] if self.answering is None else [{"answering": self.answering.as_dict()}]
            self._fingerprint = content_hash(rows + answering).hexdigest()[:16]
        return self._fingerprint

    def check_disjoint(self, probes: Iterable[Any]) -> None:
        """Refuse rows that hold a probe's question, however it is written (:mod:`~forgetwatch.replay.overlap`):
        a ``ValueError`` naming each such row and probe (up to 20 pairs).

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
