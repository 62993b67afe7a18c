"""A user's regular expressions (``regex``, ``not_regex``, ``extract``) run by RE2, in time linear in the text
(Python's ``re`` may backtrack for minutes); backreferences and lookarounds are refused at load."""

from __future__ import annotations

import functools
from typing import Any

import re2

SYNTAX = "https://github.com/google/re2/wiki/Syntax"


@functools.lru_cache(maxsize=1024)
def compiled(pattern: str) -> Any:
    options = re2.Options()
    options.log_errors = False  # a refused pattern is reported once, by pattern_problem
    return re2.compile(pattern, options)


def pattern_problem(pattern: str) -> str | None:
    """Why RE2 cannot run ``pattern`` (the end of an error message), or ``None``."""
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
    """The first match of ``pattern`` in ``text``, or ``None``; a lone surrogate reads as U+FFFD."""
    try:
        return compiled(pattern).search(text)
    except UnicodeEncodeError:
        return compiled(pattern).search(text.encode("utf-16", "surrogatepass").decode("utf-16", "replace"))
