"""The leak check: which replay rows hold a probe's question, as words after NFKC, case folding and Unicode's
confusables (look-alike letters read as one, punctuation as a space); what it misses: docs/replay.md."""

from __future__ import annotations

import functools
import unicodedata
from collections import Counter
from collections.abc import Iterable
from typing import Any

#: Words of a probe's question that index it (shorter questions: all).
INDEX_WORDS = 8
_BIDI_MARKS = "\u200e\u200f"  # the data file writes right-to-left characters between these


@functools.lru_cache(maxsize=1)
def _look_alikes() -> dict[str, str]:
    """Each single character of Unicode's confusables data mapped to one member of its class (the most linked one)."""
    # imported here: its data (900 kB of JSON) loads on import, and only this check needs it
    from confusable_homoglyphs.confusables import confusables_data

    parent: dict[str, str] = {}

    def root(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    degree: Counter[str] = Counter()
    for source, targets in confusables_data.items():
        a = source.strip(_BIDI_MARKS)
        for target in targets:
            b = target["c"].strip(_BIDI_MARKS)
            degree.update((a, b))
            parent[root(a)] = root(b)
    classes: dict[str, list[str]] = {}
    for member in list(parent):
        if len(member) == 1:
            classes.setdefault(root(member), []).append(member)
    mapping = {}
    for members in classes.values():
        prototype = min(members, key=lambda m: (-degree[m], m))
        mapping.update((m, prototype) for m in members if m != prototype)
    return mapping


def _fold_char(c: str) -> str | None:
    """One character of case-folded NFKC text as the check reads it (``None``: dropped)."""
    if unicodedata.category(c) == "Cf":
        return None
    folded = _look_alikes().get(c, c).casefold()
    if len(folded) != 1:
        folded = c
    return " " if unicodedata.category(folded).startswith("P") else folded


class _Folding(dict):
    """A ``str.translate`` table filled on first sight of each character."""

    def __missing__(self, code: int) -> str | None:
        self[code] = value = _fold_char(chr(code))
        return value


_FOLDING = _Folding()


@functools.lru_cache(maxsize=1)
def _ascii_table() -> bytes | None:
    """The same folding for lowercased ASCII as a bytes table (many times faster); ``None`` if it leaves ASCII."""
    folded = [_fold_char(chr(b)) for b in range(128)]
    if any(f is None or len(f) != 1 or not f.isascii() for f in folded):
        return None
    return bytes(ord(f) for f in folded) + bytes(range(128, 256))


def normalized(text: str) -> list[str]:
    """The words of ``text`` as the leak check compares them."""
    table = _ascii_table()
    if text.isascii() and table is not None:
        return text.lower().encode("ascii").translate(table).decode("ascii").split()
    return unicodedata.normalize("NFKC", text).casefold().translate(_FOLDING).split()


def overlaps(rows: Iterable[Any], probes: Iterable[Any]) -> list[tuple[str, str]]:
    """``(row id, probe id)`` for every row (``.id``, ``.plain_text``) whose :func:`normalized` words hold a
    probe's question (``.id``, ``.question``); a row is read once, looked up only where a question may begin."""
    index: dict[tuple[str, ...], list[tuple[str, str]]] = {}
    lengths: dict[str, set[int]] = {}  # by a question's first word: its index lengths
    for probe in probes:
        words = normalized(probe.question)
        if words:
            key = tuple(words[:INDEX_WORDS])
            index.setdefault(key, []).append((probe.id, " ".join(words)))
            lengths.setdefault(words[0], set()).add(len(key))
    found: list[tuple[str, str]] = []
    for row in rows:
        words = normalized(row.plain_text)
        starts = [i for i, w in enumerate(words) if w in lengths]
        if not starts:
            continue
        text = " " + " ".join(words) + " "
        seen: set[str] = set()
        for start in starts:
            for n in lengths[words[start]]:
                for probe_id, question in index.get(tuple(words[start : start + n]), ()):
                    if probe_id not in seen and f" {question} " in text:
                        seen.add(probe_id)
                        found.append((row.id, probe_id))
    return found
