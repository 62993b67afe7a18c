"""Checks of replay's options (replay/replay.py, replay/rows.py): a value as given, normalised, or :class:`Invalid`
saying what was expected and what to write instead. The settings groups are checked by pydantic (settings.py)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

from forgetwatch.common.strict_json import value_problem
from forgetwatch.common.text import describe, shorten, suggestion
from forgetwatch.config.settings import MAX_INT, MAX_STOP_CHARS, MAX_STOP_STRINGS


class Invalid(Exception):
    """A check's verdict: what was expected, the value given, and what to do."""

    def __init__(self, expected: str, value: Any, hint: str = "", prefix: str = ""):
        self.expected, self.value, self.hint, self.prefix = expected, value, hint, prefix
        message = f"{prefix}expected {expected}, got {describe(value)}"
        super().__init__(f"{message}; {hint}" if hint else message)


def _slip_hint(value: Any, kind: str) -> str:
    """A hint for the usual slips behind a wrong type, or ""."""
    if isinstance(value, bool):
        return "true/false is not a number here; write a number"
    if isinstance(value, str):
        text = value.strip()
        if kind == "bool" and text.lower() in ("true", "false"):
            return "remove the quotes"
        try:
            number = float(text)
        except ValueError:
            return ""
        if not math.isfinite(number):
            return ""  # "1.0e999" is no number to write without quotes
        if kind == "float" and "e" in text.lower() and "." not in text:
            # PyYAML (YAML 1.1) reads 5e-2 as text: its floats need a dot.
            return f"YAML reads {shorten(text)} as text; write it with a dot: {number!r}"
        return "remove the quotes"
    return ""


def boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    is_01 = isinstance(value, numbers.Number) and value in (0, 1)
    hint = _slip_hint(value, "bool") or "write true or false" + (", not 0 or 1" if is_01 else "")
    raise Invalid("true or false", value, hint)


def integer(minimum: int, maximum: int = MAX_INT, why: str = "") -> Callable[[Any], int]:
    """An integer in ``[minimum, maximum]``; ``why`` says what a larger one would cost."""
    expected = f"an integer >= {minimum}" if maximum == MAX_INT else f"an integer from {minimum} to {maximum}"

    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            if isinstance(value, float) and value.is_integer():
                hint = f"write {int(value)}, without the decimal point"
            else:
                hint = _slip_hint(value, "int") or "write a whole number"
            raise Invalid(expected, value, hint)
        if value < minimum:
            raise Invalid(expected, value, f"use {minimum} or more")
        if value > maximum:
            raise Invalid(expected, value, why or f"use at most {maximum} (what a 64-bit integer holds)")
        return int(value)

    return check


def _real(value: Any, expected: str, example: str) -> float:
    """``value`` as a float, or :class:`Invalid` (a bool, text, or an int too large for a float)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise Invalid(expected, value, _slip_hint(value, "float") or f"write a number such as {example}")
    try:
        return float(value)
    except OverflowError:  # 10**400: float() raises instead of giving inf
        raise Invalid(expected, value, f"write a number such as {example}") from None


def non_negative(value: Any) -> float:
    number = _real(value, "a number >= 0", "0.1")
    if not number >= 0 or math.isinf(number):
        raise Invalid("a number >= 0", value, "write a number such as 0.1")
    return number


def choice(options: tuple[str, ...], allow_none: bool = False) -> Callable[[Any], str | None]:
    expected = "one of " + ", ".join(repr(o) for o in options) + (", null" if allow_none else "")

    def check(value: Any) -> str | None:
        if value is None and allow_none:
            return None
        if isinstance(value, str) and value in options:
            return value
        near = suggestion(value, options).strip(" ()") if isinstance(value, str) else ""
        raise Invalid(expected, value, near or "pick one of these")

    return check


def stop_strings(value: Any) -> list[str]:
    expected = 'a list of non-empty strings, e.g. ["\\n"]'
    if isinstance(value, str):
        raise Invalid(expected, value, f"write a single stop string as a list: [{shorten(value)}]")
    if not isinstance(value, (list, tuple)):
        raise Invalid(expected, value, "remove the key to use the default")
    if len(value) > MAX_STOP_STRINGS:
        raise Invalid(
            f"at most {MAX_STOP_STRINGS} stop strings",
            value,
            "each one costs a pass over the vocabulary when generation starts; keep the markers that end an answer",
        )
    for i, item in enumerate(value):
        if not isinstance(item, str) or item == "":
            expected, hint = "a non-empty string", "remove it or give the text generation should stop at"
        elif len(item) > MAX_STOP_CHARS:
            expected = f"a string of at most {MAX_STOP_CHARS} characters"
            hint = 'a stop string is a short marker such as "Question:"; generation builds a table that wide'
        elif found := value_problem(item):
            expected, hint = "a string of Unicode text", found[1]
        else:
            continue
        raise Invalid(expected, item, hint, prefix=f"item {i}: ")
    return list(value)
