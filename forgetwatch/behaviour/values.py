"""The rules a check's value is validated by: each returns a message for a bad value, ``None`` for a good one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from forgetwatch.common.text import shorten, type_name

Rule = Callable[[Any], "str | None"]


def got(value: Any) -> str:
    """The end of a message about a bad value: its type and (shortened) value."""
    return f"got {type_name(value)} {shorten(value)}"


def rule(ok: Callable[[Any], Any], expected: str) -> Rule:
    """A rule passing the values ``ok`` holds for; others get "must be <expected>, got ..."."""
    return lambda value: None if ok(value) else f"must be {expected}, {got(value)}"


def count(least: int, why: str = "") -> Rule:
    """A rule for an integer from ``least`` up (``why`` follows the range in the message)."""
    return rule(lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= least, f"an integer >= {least}{why}")


text = rule(lambda v: isinstance(v, str) and v.strip(), "a non-empty string")


def strings(entry: Rule = text, why: str = "") -> Rule:
    """A rule for a non-empty list of strings, each passing ``entry``."""

    def check(value: Any) -> str | None:
        if isinstance(value, str):
            return f'must be a list of strings{why}; write ["{value:.40}"]'
        if not isinstance(value, list) or not value:
            return f"must be a non-empty list of strings{why}, {got(value)}"
        return next((f"entry {i}: {problem}" for i, v in enumerate(value) if (problem := entry(v))), None)

    return check
