r"""Regular expressions a user supplies (a behaviour check's ``regex`` / ``not_regex``, a
generative probe's ``extract``), run by RE2, whose time is linear in the text whatever the
pattern.

Why RE2: Python's ``re`` backtracks, so a pattern such as ``(a+)+$`` takes minutes on a
30-character response and days on a 40-character one, and a response is the model's to write. A
time limit (the ``regex`` package's ``timeout=``) is no cure: whether a search ends in time
depends on the machine's load, so the same response could pass at one evaluation and fail at
the next, a flip out of nothing. A cap on the text's length does not bound backtracking either.
RE2 matches without backtracking, in time linear in the text, the same way every time. It
refuses the features that need backtracking (backreferences, lookarounds), and Python-only
syntax such as ``\Z`` (write ``\z``) or ``(?x)``: such a pattern is refused at load, naming its
field. In RE2, ``\w``, ``\d``, ``\s`` and ``\b`` are ASCII (``\pL``, ``\p{Nd}`` cover other
scripts).

Example:
    >>> search(r"(a+)+$", "a" * 100_000 + "b") is None  # at once; Python's re would not return
    True
    >>> pattern_problem(r"(\w+) \1")[:46]
    'does not compile (invalid escape sequence: \\1)'
"""

from __future__ import annotations

import functools
from typing import Any

import re2

__all__ = ["compiled", "pattern_problem", "search"]

SYNTAX = "https://github.com/google/re2/wiki/Syntax"


@functools.lru_cache(maxsize=1024)
def compiled(pattern: str) -> Any:
    """``pattern`` compiled by RE2 (once per pattern); raises ``re2.error`` if RE2 refuses it."""
    options = re2.Options()
    options.log_errors = False  # a refused pattern is reported once, by pattern_problem
    return re2.compile(pattern, options)


def pattern_problem(pattern: str) -> str | None:
    """Why RE2 cannot run ``pattern``, as the end of an error message, or ``None``."""
    try:
        compiled(pattern)
    except re2.error as exc:
        reason = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else exc
        return (
            f"does not compile ({reason}); patterns run on RE2, in time linear in the text: no "
            rf"backreferences or lookarounds, \z for \Z (syntax: {SYNTAX})"
        )
    except UnicodeError as exc:
        return f"cannot be read as UTF-8 ({exc.reason})"
    return None


def search(pattern: str, text: str) -> Any:
    """The first match of ``pattern`` (checked with :func:`pattern_problem`) in ``text``, or
    ``None``; a lone surrogate in ``text`` (no UTF-8 for it) is read as U+FFFD."""
    try:
        return compiled(pattern).search(text)
    except UnicodeEncodeError:
        return compiled(pattern).search(text.encode("utf-16", "surrogatepass").decode("utf-16", "replace"))
