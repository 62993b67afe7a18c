"""The rules a check's value is validated by: each returns a message for a bad value, ``None`` for a good one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from forgetwatch.common.text import shorten, type_name


def got(value: Any) -> str:
    """The end of a message about a bad value: its type and (shortened) value."""
    return f"got {type_name(value)} {shorten(value)}"


def count(least: int, why: str = "") -> Callable[[Any], str | None]:
    """A rule for an integer from ``least`` up (``why`` follows the range in the message)."""

    def check(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            return f"must be an integer >= {least}{why}, {got(value)}"
        return None

    return check


def text(value: Any) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return f"must be a non-empty string, {got(value)}"
    return None


def strings(entry: Callable[[Any], str | None] = text, why: str = "") -> Callable[[Any], str | None]:
    """A rule for a non-empty list of strings, each passing ``entry``."""

    def check(value: Any) -> str | None:
        if isinstance(value, str):
            return f'must be a list of strings{why}; write ["{value:.40}"]'
        if not isinstance(value, list) or not value:
            return f"must be a non-empty list of strings{why}, {got(value)}"
        return next((f"entry {i}: {problem}" for i, v in enumerate(value) if (problem := entry(v))), None)

    return check
