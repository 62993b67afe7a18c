"""The checks behind each forgetwatch setting, and the error that reports what they find.

Each check takes a value as given (in code or from YAML) and returns it normalised, or raises
:class:`Invalid` saying what was expected, what was given, and what to write instead: the
usual slips (a quoted number, ``5e-2`` that YAML reads as text, a percentage for a rate) get a
hint of their own.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable, Mapping
from typing import Any

from .options import batch_size_problem
from .problems import InputError, Problem
from .text import describe, shorten, suggestion

#: One problem of a config: ``(source, line, key, message)``.
ConfigProblem = Problem


class ConfigError(InputError):
    """A forgetwatch config is invalid.

    The message has one line per problem, e.g.
    ``train.yaml: line 3: key 'eval_step': unknown key (did you mean 'eval_steps'?)``;
    ``errors`` holds the same problems as :class:`ConfigProblem` tuples
    ``(source, line, key, message)``.
    """

    noun = "key"


class Invalid(Exception):
    """Raised by a field check: what was expected, the value given, and what to do."""

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


def integer(minimum: int) -> Callable[[Any], int]:
    expected = f"an integer >= {minimum}"

    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            if isinstance(value, float) and value.is_integer():
                hint = f"write {int(value)}, without the decimal point"
            else:
                hint = _slip_hint(value, "int") or "write a whole number"
            raise Invalid(expected, value, hint)
        if value < minimum:
            raise Invalid(expected, value, f"use {minimum} or more")
        return int(value)

    return check


def rate(low_open: bool, high_open: bool, example: str) -> Callable[[Any], float]:
    """A number between 0 and 1, each end open or closed as asked."""
    expected = f"a number in {'(' if low_open else '['}0, 1{')' if high_open else ']'}"

    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise Invalid(expected, value, _slip_hint(value, "float") or f"write a number such as {example}")
        number = float(value)
        low_bad = number <= 0 if low_open else number < 0
        high_bad = number >= 1 if high_open else number > 1
        if math.isnan(number) or low_bad or high_bad:
            if 1 < number <= 100:
                hint = f"rates are fractions, not percentages: write {number / 100:g} for {number:g} %"
            else:
                hint = f"write a number such as {example}"
            raise Invalid(expected, value, hint)
        return number

    return check


def non_negative(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value >= 0 or math.isinf(value):
        raise Invalid("a number >= 0", value, _slip_hint(value, "float") or "write a number such as 0.1")
    return float(value)


def weight_or_auto(value: Any) -> float | str:
    if value == "auto":
        return value
    try:
        return non_negative(value)
    except Invalid as exc:
        raise Invalid('a number >= 0 or "auto"', value, exc.hint) from None


def optional(check: Callable[[Any], Any], none_means: str) -> Callable[[Any], Any]:
    def checked(value: Any) -> Any:
        if value is None:
            return None
        try:
            return check(value)
        except Invalid as exc:
            expected = f"{exc.expected} or null ({none_means})"
            raise Invalid(expected, exc.value, exc.hint, exc.prefix) from None

    return checked


def path(value: Any) -> str:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip():
        raise Invalid("a file system path (a non-empty string)", value, "give the path, or remove the key")
    return value


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


def batch_size(value: Any) -> int | str:
    if batch_size_problem(value):
        raise Invalid("a positive integer or 'auto'", value,
                      "write e.g. 32, or 'auto' to find the largest batch that fits")
    return value


def stop_strings(value: Any) -> list[str]:
    expected = 'a list of non-empty strings, e.g. ["\\n"]'
    if isinstance(value, str):
        raise Invalid(expected, value, f"write a single stop string as a list: [{shorten(value)}]")
    if not isinstance(value, (list, tuple)):
        raise Invalid(expected, value, 'remove the key to use the default ["\\n"]')
    for i, item in enumerate(value):
        if not isinstance(item, str) or item == "":
            hint = "remove it or give the text generation should stop at"
            raise Invalid("a non-empty string", item, hint, prefix=f"item {i}: ")
    return list(value)


def category_rates(value: Any) -> dict[str, float]:
    if not isinstance(value, Mapping):
        raise Invalid("a mapping of category name to rate in [0, 1], e.g. {math: 0.05}", value,
                      "remove the key for no per-category thresholds")
    fraction = rate(False, False, "0.05")
    cleaned: dict[str, float] = {}
    for category, threshold in value.items():
        if not isinstance(category, str) or not category:
            raise Invalid("category names as non-empty strings", category,
                          "quote the name in YAML, e.g. '2024': 0.05")
        try:
            cleaned[category] = fraction(threshold)
        except Invalid as exc:
            raise Invalid(exc.expected, exc.value, exc.hint, prefix=f"category {shorten(category)}: ") from None
    return cleaned


def check_values(values: Mapping[str, Any], checks: Mapping[str, Callable[[Any], Any]], source: str,
                 lines: Mapping[str, int]) -> tuple[dict[str, Any], list[ConfigProblem]]:
    """Run each value's check; the normalised values, and every problem found."""
    cleaned: dict[str, Any] = {}
    problems: list[ConfigProblem] = []
    for name, value in values.items():
        try:
            cleaned[name] = checks[name](value)
        except Invalid as exc:
            problems.append(ConfigProblem(source, lines.get(name), name, str(exc)))
    return cleaned, problems
