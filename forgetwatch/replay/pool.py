"""ReplayPool: text the model may be trained on to repair forgetting, kept apart from the probes
(the file format: :mod:`~forgetwatch.replay.rows`)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import islice
from typing import Any

from forgetwatch.common.files import content_hash
from forgetwatch.common.text import listing, shorten, type_name
from forgetwatch.replay.overlap import overlaps
from forgetwatch.replay.rows import Answering, ReplayPoolError, ReplayRow, check_category, pool_rows
from forgetwatch.scoring.encoding import encode_many

__all__ = ["Answering", "ReplayPool", "ReplayPoolError", "ReplayRow"]


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
        """Build from dicts in the pool-file schema; errors name 1-based record numbers.
        ``max_new_tokens``, ``chat_template``, ``stop``: how prompt rows are answered (:class:`Answering`).

        Example:
            >>> pool = ReplayPool.from_records([{"id": "q", "prompt": "Name a river."}], max_new_tokens=16)
            >>> pool[0].prompt, pool.answering.max_new_tokens
            ('Name a river.', 16)
        """
        answering = Answering(max_new_tokens, chat_template, stop)
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
        rows = pool_rows("<prompts>", "prompt", kinds=("prompt",))
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
        rows = pool_rows(getattr(getattr(dataset, "info", None), "dataset_name", None) or "<dataset>", "dataset row")
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
        for r in self._rows:
            row = [r.id, r.category, r.text, r.messages]
            yield row if r.prompt is None else [*row, r.prompt]
        if self._answering is not None:
            yield {"answering": self._answering.as_dict()}

    def subset(self, ids: Iterable[str]) -> ReplayPool:
        """The rows of ``ids`` (in the pool's order), from the same source, answered alike."""
        keep = set(ids)
        return ReplayPool([r for r in self._rows if r.id in keep], self.source, self._answering)

    def as_repair(self) -> Any:
        """This pool replayed with the defaults (a :class:`~forgetwatch.Replay`): what a run
        takes ``replay=pool`` for.

        Example:
            >>> ReplayPool.from_records([{"id": "r1", "text": "t"}]).as_repair().weight
            1.0
        """
        from forgetwatch.replay.replay import Replay  # replay.py never imports this module: no circle

        return Replay(self)

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
