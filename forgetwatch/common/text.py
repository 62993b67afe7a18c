"""Pieces of the messages we show: bounded values, did-you-mean, percentages, first lines."""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable
from typing import Any

SHOWN = 60  # most characters of a user's value a message repeats: a huge value must not make a huge message


def describe(value: Any, limit: int = SHOWN) -> str:
    """``value`` as an error message shows it: a short repr and its type."""
    return f"{shorten(value, limit)} ({type(value).__name__})"


def type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def shorten(value: Any, limit: int = SHOWN) -> str:
    """A repr of at most ``limit`` characters; containers and huge integers are not rendered whole first."""
    if isinstance(value, (list, tuple, dict, set)) and len(value) > limit:
        return f"{type(value).__name__} of {len(value)} items"
    if isinstance(value, int) and value.bit_length() > 4 * limit:  # repr of a 5,000-digit int raises
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    if isinstance(value, str) and len(value) > limit:
        value = value[:limit]  # repr of a slice: never of the whole text
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def did_you_mean(word: str, options: Iterable[str], cutoff: float = 0.6) -> str | None:
    match = difflib.get_close_matches(word, [o for o in options if isinstance(o, str)], n=1, cutoff=cutoff)
    return match[0] if match else None


def suggestion(word: str, options: Iterable[str], cutoff: float = 0.6) -> str:
    """`` (did you mean 'x'?)`` for the option closest to ``word``, or ``""``."""
    match = did_you_mean(word, options, cutoff)
    return f" (did you mean {match!r}?)" if match else ""


def pct(x: float | None, width: int = 0, missing: str = "n/a", digits: int = 1) -> str:
    """A rate as a percentage for the console; ``missing`` when it does not apply (None or NaN)."""
    return missing.rjust(width) if x is None or math.isnan(x) else f"{100 * x:{width}.{digits}f}%"


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def listing(items: Iterable[Any], limit: int = 5) -> str:
    """The first ``limit`` items, comma-separated, and how many more there are."""
    items = [str(x) for x in items]
    shown = ", ".join(items[:limit])
    return shown if len(items) <= limit else f"{shown} and {len(items) - limit} more"
