"""Pieces of the messages we show: bounded values, did-you-mean, percentages, first lines."""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable
from typing import Any

#: Most characters of a user's value that an error message repeats (a huge value must not
#: make a huge message, or cost seconds to format).
SHOWN = 60


def describe(value: Any, limit: int = SHOWN) -> str:
    """``value`` as an error message shows it: a short repr and its type.

    Example:
        >>> describe("x" * 100, limit=10)
        "'xxxxxx... (str)"
    """
    return f"{shorten(value, limit)} ({type(value).__name__})"


def type_name(value: Any) -> str:
    """How a JSON value's type reads in an error message.

    Example:
        >>> type_name(None), type_name([1])
        ('null', 'list')
    """
    return "null" if value is None else type(value).__name__


def shorten(value: Any, limit: int = SHOWN) -> str:
    """A repr of at most ``limit`` characters; containers are not rendered whole first.

    Example:
        >>> shorten(list(range(10**6)), 20)
        'list of 1000000 items'
        >>> shorten(10**5000)
        'an integer of about 5001 digits'
    """
    if isinstance(value, (list, tuple, dict, set)) and len(value) > limit:
        return f"{type(value).__name__} of {len(value)} items"
    if isinstance(value, int) and value.bit_length() > 4 * limit:  # repr of a 5,000-digit int raises
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    if isinstance(value, str) and len(value) > limit:
        value = value[:limit]  # repr of a slice: never of the whole text
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def did_you_mean(word: str, options: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The option closest to ``word`` (a likely misspelling), or ``None``.

    Example:
        >>> did_you_mean("eval_step", ["eval_steps", "patience"])
        'eval_steps'
    """
    match = difflib.get_close_matches(word, [o for o in options if isinstance(o, str)], n=1, cutoff=cutoff)
    return match[0] if match else None


def suggestion(word: str, options: Iterable[str], cutoff: float = 0.6) -> str:
    """`` (did you mean 'x'?)`` for the option closest to ``word``, or ``""``.

    Example:
        >>> suggestion("eval_step", ["eval_steps", "patience"])
        " (did you mean 'eval_steps'?)"
    """
    match = did_you_mean(word, options, cutoff)
    return f" (did you mean {match!r}?)" if match else ""


def pct(x: float | None, width: int = 0, missing: str = "n/a", digits: int = 1) -> str:
    """A rate as a percentage for the console (``width`` pads it); ``missing`` when it does not apply.

    Example:
        >>> pct(0.0512), pct(float("nan")), pct(0.05, width=4, missing="-"), pct(0.0204, digits=2)
        ('5.1%', 'n/a', ' 5.0%', '2.04%')
    """
    return missing.rjust(width) if x is None or math.isnan(x) else f"{100 * x:{width}.{digits}f}%"


def first_line(err: BaseException) -> str:
    """The first line of an error's message, for one-line reports."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def listing(items: Iterable[Any], limit: int = 5) -> str:
    """The first ``limit`` items, comma-separated, and how many more there are.

    Example:
        >>> listing(["a", "b", "c"], limit=2), listing(["a"])
        ('a, b and 1 more', 'a')
    """
    items = [str(x) for x in items]
    shown = ", ".join(items[:limit])
    return shown if len(items) <= limit else f"{shown} and {len(items) - limit} more"
