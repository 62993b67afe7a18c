"""The checks behind each setting: a value as given, normalised, or :class:`Invalid` saying what was expected and
what to write instead (with hints for the usual slips: a quoted number, ``5e-2`` read as text, a percentage)."""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable, Mapping
from typing import Any

from forgetwatch.common.problems import InputError, Problem
from forgetwatch.common.strict_json import value_problem
from forgetwatch.common.text import describe, shorten, suggestion
from forgetwatch.config.options import MAX_INT
from forgetwatch.probes.schema import check_category

#: Stop strings: at most this many, each at most this long (transformers builds a vocabulary-wide table for each).
MAX_STOP_STRINGS, MAX_STOP_CHARS = 64, 200


class ConfigError(InputError):
    """A forgetwatch config is invalid: one line per problem (``train.yaml: line 3: key 'eval_step': ...``), and
    ``errors``, the :class:`~forgetwatch.common.problems.Problem` tuples."""


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


def rate(low_open: bool, high_open: bool, example: str, floor: float = 0.0, why: str = "") -> Callable[[Any], float]:
    """A number between 0 and 1, each end open or closed as asked; with ``floor``, between it
    (closed) and 1, ``why`` saying what a smaller one would do."""
    low = f"[{floor:g}" if floor else "(0" if low_open else "[0"
    expected = f"a number in {low}, 1{')' if high_open else ']'}"

    def check(value: Any) -> float:
        number = _real(value, expected, example)
        low_bad = number < floor if floor else number <= 0 if low_open else number < 0
        high_bad = number >= 1 if high_open else number > 1
        if math.isnan(number) or low_bad or high_bad:
            if 1 < number <= 100:
                hint = f"rates are fractions, not percentages: write {number / 100:g} for {number:g} %"
            elif 0 <= number < floor and why:
                hint = why
            else:
                hint = f"write a number such as {example}"
            raise Invalid(expected, value, hint)
        return number

    return check


def non_negative(value: Any) -> float:
    number = _real(value, "a number >= 0", "0.1")
    if not number >= 0 or math.isinf(number):
        raise Invalid("a number >= 0", value, "write a number such as 0.1")
    return number


#: The coldest sampling temperature: colder draws are greedy decoding but for rounding, and overflow the logits.
MIN_TEMPERATURE = 0.01


def temperature(value: Any) -> float:
    """0 (greedy decoding), or a sampling temperature of at least :data:`MIN_TEMPERATURE`."""
    number = non_negative(value)
    if 0 < number < MIN_TEMPERATURE:
        raise Invalid(
            f"0 or a number >= {MIN_TEMPERATURE:g}",
            value,
            "sampling this cold is greedy decoding, and divides the logits past what floats hold: write 0 for "
            "greedy answers, or a temperature such as 0.6",
        )
    return number


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
        hint = "give the path, or remove the key"
    elif "\0" in value:  # no file system takes one: open() and mkdir() raise, late
        hint = f"it has a NUL character at character {value.index(chr(0))}; remove it"
    else:
        return value
    raise Invalid("a file system path (a non-empty string)", value, hint)


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
    """A positive integer or "auto": the one rule of the settings, the scorer and the command line."""
    if value == "auto" and isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_INT:
        hint = "write e.g. 32, or 'auto' to find the largest batch that fits"
        raise Invalid("a positive integer or 'auto'", value, hint)
    return value


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


def category_rates(value: Any) -> dict[str, float]:
    if not isinstance(value, Mapping):
        raise Invalid(
            "a mapping of category name to rate in [0, 1], e.g. {math: 0.05}",
            value,
            "remove the key for no per-category thresholds",
        )
    fraction = rate(False, False, "0.05")
    cleaned: dict[str, float] = {}
    for category, threshold in value.items():
        _name(category, "category", "0.05")
        try:
            cleaned[category] = fraction(threshold)
        except Invalid as exc:
            raise Invalid(exc.expected, exc.value, exc.hint, prefix=f"category {shorten(category)}: ") from None
    return cleaned


def category_map(value: Any) -> dict[str, str]:
    expected = "a mapping of category name to group name, e.g. {abstract_algebra: stem}"
    if not isinstance(value, Mapping):
        raise Invalid(expected, value, "remove the key to log each category as it is")
    for category, group in value.items():
        _name(category, "category", "recent")
        _name(group, "group", "recent")
    return dict(value)


def _name(name: Any, what: str, example: str) -> None:
    if not isinstance(name, str) or not name:
        raise Invalid(f"{what} names as non-empty strings", name, f"quote the name in YAML, e.g. '2024': {example}")
    if message := check_category(name):  # the probes' own rule for a category's name
        raise Invalid(f"a {what} name", name, message)


def check_values(
    values: Mapping[str, Any], checks: Mapping[str, Callable[[Any], Any]], source: str, lines: Mapping[str, int]
) -> tuple[dict[str, Any], list[Problem]]:
    """Run each value's check; the normalised values, and every problem found."""
    cleaned: dict[str, Any] = {}
    problems: list[Problem] = []
    for name, value in values.items():
        try:
            cleaned[name] = checks[name](value)
        except Invalid as exc:
            problems.append(Problem(source, lines.get(name), name, str(exc)))
    return cleaned, problems
