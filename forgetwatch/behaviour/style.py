"""What a response looks like, from its text alone: length, bullets, tables, emoji, hedging, refusal. The
detectors look for stock phrases and miss other wording: pass your own ``refusal_detector`` when that matters."""

from __future__ import annotations

import re

#: Stock refusal wording, matched case-insensitively within the opening of a response.
REFUSAL_PHRASES = tuple(
    "i can't help|i cannot help|i can't assist|i cannot assist|i can't provide|i cannot provide|"
    "i can't do that|i cannot do that|i won't help|i won't provide|i will not|i'm unable to|"
    "i am unable to|i'm not able to|i am not able to|i must decline|i have to decline|i can't comply|"
    "i cannot comply|i'm sorry, but|i am sorry, but|sorry, i can't|sorry, but i can't|as an ai|i refuse|"
    "i can't share|i cannot share|not something i can help".split("|")
)
#: Hedging wording, matched case-insensitively as whole words anywhere.
HEDGING_PHRASES = tuple(
    "i think|i believe|i'm not sure|i am not sure|not entirely sure|probably|possibly|perhaps|maybe|might|"
    "it depends|it seems|it is possible|it's possible|as far as i know|i could be wrong|to my knowledge|"
    "likely".split("|")
)
#: How far into a response a refusal phrase counts (characters): a refusal comes first.
REFUSAL_WINDOW = 200

_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'"})
_REFUSAL = re.compile("|".join(re.escape(p) for p in REFUSAL_PHRASES))
_HEDGING = re.compile(r"\b(?:" + "|".join(re.escape(p) for p in HEDGING_PHRASES) + r")\b")
_WORD = re.compile(r"\w")
# linear in the response: a match starts only where a run starts (the lookbehind), spaces within a line
_SENTENCE_END = re.compile(r"(?<![.!?])[.!?]+(?=\s|$)")
_BULLET = re.compile(r"^[^\S\n]*(?:[-*+\u2022]|\d{1,3}[.)])[^\S\n]+\S", re.MULTILINE)
_TABLE_CELL = re.compile(r":?-{3,}:?")
_EMOJI = re.compile(
    "[\U0001f1e6-\U0001f1ff\U0001f300-\U0001f5ff\U0001f600-\U0001f64f\U0001f680-\U0001f6ff"
    "\U0001f900-\U0001f9ff\U0001fa70-\U0001faff\u2600-\u26ff\u2700-\u27bf]"
)


def _plain(text: str) -> str:
    return text.translate(_APOSTROPHES).lower()


def looks_like_refusal(response: str) -> bool:
    """Whether the response opens with stock refusal wording (see :data:`REFUSAL_PHRASES`)."""
    return _REFUSAL.search(_plain(response[:REFUSAL_WINDOW])) is not None


def hedges(response: str) -> bool:
    """Whether the response holds hedging wording (see :data:`HEDGING_PHRASES`)."""
    return _HEDGING.search(_plain(response)) is not None


def word_count(response: str) -> int:
    """Whitespace-separated pieces holding at least one letter or digit."""
    return sum(1 for piece in response.split() if _WORD.search(piece))


def sentence_count(response: str) -> int:
    """Pieces ended by ``.``, ``!`` or ``?`` (then a space or the end), plus a last one, that hold a word."""
    pieces = _SENTENCE_END.split(response)
    return sum(1 for piece in pieces if _WORD.search(piece))


def bullet_lines(response: str) -> int:
    """Lines that start with a bullet or a number (``1.``, ``2)``)."""
    return len(_BULLET.findall(response))


def has_table(response: str) -> bool:
    """Whether the response holds a Markdown table rule line (``|---|:---:|``)."""
    return any("|" in line and _is_table_rule(line) for line in response.split("\n"))


def _is_table_rule(line: str) -> bool:
    cells = line.strip().removeprefix("|").removesuffix("|").split("|")
    return len(cells) >= 2 and all(_TABLE_CELL.fullmatch(cell.strip()) for cell in cells)


def has_emoji(response: str) -> bool:
    """Whether the response holds an emoji (pictographs, flags, dingbats)."""
    return _EMOJI.search(response) is not None
