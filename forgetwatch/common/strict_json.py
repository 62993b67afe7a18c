"""Reading JSON as strictly as :mod:`forgetwatch.common.files` writes it: NaN, infinities, huge numbers, lone
surrogates, deep nesting and non-JSON types are refused, naming where they are."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from forgetwatch.common.text import describe, shorten

MAX_DEPTH = 100  # deepest nesting of lists and objects accepted
#: Most digits of an integer accepted: the least ``sys.set_int_max_str_digits`` allows, so any setting reads them.
MAX_INT_DIGITS = 640
_INT_LIMIT = 10**MAX_INT_DIGITS
_SURROGATE = re.compile("[\ud800-\udfff]")
#: what the nesting of a JSON text turns on: brackets, and strings (which may hold brackets)
_STRUCTURE = re.compile(r'[\[\]{}"\\]')
_TOO_DEEP = f"is nested more than {MAX_DEPTH} levels deep (lists or objects within each other); flatten it"
_LONG_INT = "is an integer of {}; write it as a string"


class StrictJSONError(ValueError):
    """A JSON text that parses but holds a value strict JSON cannot keep: ``where`` its path, ``why`` the problem."""

    def __init__(self, where: str, why: str):
        self.where, self.why = where, why
        super().__init__(f"{shorten(where)}: {why}" if where else why)


class _Refused:  # stands where the parser met a number it must refuse, so that its place can be named
    def __init__(self, why: str):
        self.why = why


def loads(text: str) -> Any:
    """``json.loads``, refusing what :func:`value_problem` refuses, naming where."""
    try:
        value = _DECODER.decode(text)
    except RecursionError:  # json nests on the stack: a few thousand "[" exhaust it
        raise StrictJSONError("", _TOO_DEEP) from None
    if found := value_problem(value):
        raise StrictJSONError(*found)
    return value


def nests_within(text: str, limit: int, start: int = 0) -> bool:
    """Whether the JSON value at ``start`` nests at most ``limit`` deep (strings skipped): checked before ``json``,
    which recurses once a level, parses text a model wrote.

    Example:
        >>> nests_within('{"a": ["[[[["]}', 2), nests_within("[" * 3000, 100)
        (True, False)
    """
    depth, in_string, pos = 0, False, start
    while (found := _STRUCTURE.search(text, pos)) is not None:
        char, pos = found.group(), found.end()
        if in_string:
            if char == "\\":
                pos += 1  # the escaped character, whatever it is
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                return False
        elif char in "]}":
            depth -= 1
        if depth <= 0 and not in_string:  # the value ended
            return True
    return True


def _parse_int(digits: str) -> int | _Refused:
    # checked before int(): Python refuses long ones with a ValueError naming no place
    n = len(digits.lstrip("-"))
    return int(digits) if n <= MAX_INT_DIGITS else _Refused(_LONG_INT.format(f"{n} digits (at most {MAX_INT_DIGITS})"))


_DECODER = json.JSONDecoder(
    parse_int=_parse_int,
    parse_float=lambda s: (
        v if math.isfinite(v := float(s)) else _Refused(f"{shorten(s)} is too large for a number; write it as a string")
    ),
    parse_constant=lambda name: _Refused(
        f"{name} is not JSON (strict JSON has no NaN or Infinity); write null, or the value as a string"
    ),
)


def value_problem(value: Any, depth: int = 0) -> tuple[str, str] | None:
    """The first place in ``value`` strict JSON cannot keep, as ``(path, what is wrong)`` (path like ``tags[2]``),
    or ``None``; it goes no deeper than :data:`MAX_DEPTH`, so no depth exhausts the stack."""
    why = None
    if isinstance(value, str):
        why = None if value.isascii() else lone_surrogate(value)  # isascii: a flag, no scan
    elif isinstance(value, _Refused):
        why = value.why
    elif isinstance(value, float) and not math.isfinite(value):
        why = f"is {value!r}, which strict JSON cannot hold; write None (null), or the value as a string"
    elif isinstance(value, int) and not isinstance(value, bool) and not -_INT_LIMIT < value < _INT_LIMIT:
        why = _LONG_INT.format(f"more than {MAX_INT_DIGITS} digits")  # compared: str() of it is what fails
    elif isinstance(value, (list, tuple, dict)) or (depth == 0 and isinstance(value, Mapping)):
        if depth >= MAX_DEPTH:
            return "", _TOO_DEEP
        for key in value if isinstance(value, Mapping) else ():
            if not isinstance(key, str):
                return "", f"has key {describe(key)}: JSON keys are strings; write it as one"
            if message := lone_surrogate(key):
                return (f".{key}" if depth else key), f"the name {message}"
        for key, child in value.items() if isinstance(value, Mapping) else enumerate(value):
            if found := value_problem(child, depth + 1):  # within: ".name" or "[index]", the first "." cut at the top
                path = (f"[{key}]" if isinstance(key, int) else f".{key}") + found[0]
                return path if depth else path.removeprefix("."), found[1]
    elif not (value is None or isinstance(value, (bool, int, float))):
        why = (
            f"is {describe(value)}, not a JSON value (a string, number, true/false, null, list or dict); convert "
            "it, e.g. with int(), float() or str(), or leave it out"
        )
    return ("", why) if why else None


def lone_surrogate(text: str) -> str | None:
    if found := _SURROGATE.search(text):
        where = f"(U+{ord(found.group()):04X}) at character {found.start()}"
        return f"has a lone surrogate {where}, which is not valid Unicode text"
    return None
