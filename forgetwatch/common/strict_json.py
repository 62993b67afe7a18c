"""Reading JSON as strictly as :mod:`forgetwatch.common.files` writes it: NaN, infinities, huge numbers, lone
surrogates, deep nesting and non-JSON types are refused, naming where they are."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from forgetwatch.common.text import describe, shorten

#: Deepest nesting of lists and objects accepted.
MAX_DEPTH = 100
#: Most digits of an integer accepted: the least limit Python may be set to for converting
#: integers to and from text (``sys.set_int_max_str_digits``), so any setting reads them.
MAX_INT_DIGITS = 640
_INT_LIMIT = 10**MAX_INT_DIGITS
_SURROGATE = re.compile("[\ud800-\udfff]")


class StrictJSONError(ValueError):
    """A JSON text that parses but holds a value strict JSON cannot keep: ``where`` its path, ``why`` the problem."""

    def __init__(self, where: str, why: str):
        self.where, self.why = where, why
        super().__init__(f"{shorten(where)}: {why}" if where else why)


class _Refused:
    """Stands where the parser met a number it must refuse, so that its place can be named."""

    def __init__(self, why: str):
        self.why = why


def loads(text: str) -> Any:
    """``json.loads``, refusing what :func:`value_problem` refuses, naming where.

    Example:
        >>> loads('{"n": 1.5, "tags": ["a"]}')
        {'n': 1.5, 'tags': ['a']}
        >>> loads('{"tags": [NaN]}')
        Traceback (most recent call last):
            ...
        forgetwatch.common.strict_json.StrictJSONError: 'tags[0]': NaN is not JSON (strict JSON has no NaN or Infinity); write null, or the value as a string
    """
    try:
        value = _DECODER.decode(text)
    except RecursionError:  # json nests on the stack: a few thousand "[" exhaust it
        raise StrictJSONError("", _too_deep()) from None
    found = value_problem(value)
    if found is not None:
        raise StrictJSONError(*found)
    return value


def _parse_int(digits: str) -> int | _Refused:
    # checked before int(): Python refuses long ones with a ValueError naming no place
    n = len(digits) - digits.startswith("-")
    return int(digits) if n <= MAX_INT_DIGITS else _Refused(_long_int(f"{n} digits (at most {MAX_INT_DIGITS})"))


def _parse_float(number: str) -> float | _Refused:
    value = float(number)
    return (
        value
        if math.isfinite(value)
        else _Refused(f"{shorten(number)} is too large for a number; write it as a string")
    )


def _parse_constant(name: str) -> _Refused:
    return _Refused(f"{name} is not JSON (strict JSON has no NaN or Infinity); write null, or the value as a string")


#: the parser's refusals stand in place (a _Refused), for value_problem to find and name
_DECODER = json.JSONDecoder(parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant)


def value_problem(value: Any) -> tuple[str, str] | None:
    """The first place in ``value`` strict JSON cannot keep, as ``(path, what is wrong)`` (path like ``tags[2]``
    or ``check.regex``), or ``None``; iterative, so no depth exhausts the stack.

    Example:
        >>> value_problem({"id": "q1", "tags": ["a", float("nan")]})
        ('tags[1]', 'is nan, which strict JSON cannot hold; write None (null), or the value as a string')
    """
    # paths are built only when something is wrong: most values are fine, and this runs on every row
    return _locate(value) if _has_problem(value) else None


def _has_problem(value: Any) -> bool:
    """A fast pass over the common types: ``False`` when :func:`_locate` would find nothing."""
    if type(value) is not dict and type(value) is not list:
        return not _plain_scalar(value)
    todo = [(value, 0)]  # containers only: scalars are looked at where they stand
    while todo:
        item, depth = todo.pop()
        if depth >= MAX_DEPTH:
            return True
        if type(item) is dict:
            if not all(type(key) is str and (key.isascii() or not _SURROGATE.search(key)) for key in item):
                return True
            item = item.values()
        for child in item:
            kind = type(child)
            if kind is dict or kind is list:
                todo.append((child, depth + 1))
            elif not _plain_scalar(child):
                return True
    return False


def _plain_scalar(item: Any) -> bool:
    kind = type(item)
    if kind is str:
        return item.isascii() or not _SURROGATE.search(item)  # isascii: a flag, no scan
    return (
        item is None
        or kind is bool
        or (kind is int and -_INT_LIMIT < item < _INT_LIMIT)
        or (kind is float and math.isfinite(item))
    )  # anything else takes _locate's careful look


def _locate(value: Any) -> tuple[str, str] | None:
    todo: list[tuple[Any, str, int]] = [(value, "", 0)]
    while todo:
        item, path, depth = todo.pop()
        if isinstance(item, _Refused):
            return path, item.why
        if isinstance(item, str):
            if message := _surrogate(item):
                return path, message
        elif item is None or isinstance(item, bool):
            continue
        elif isinstance(item, int):
            if not -_INT_LIMIT < item < _INT_LIMIT:  # compared, not counted: str() of it is what fails
                return path, _long_int(f"more than {MAX_INT_DIGITS} digits")
        elif isinstance(item, float):
            if not math.isfinite(item):
                return path, f"is {item!r}, which strict JSON cannot hold; write None (null), or the value as a string"
        elif isinstance(item, (list, tuple, dict)) or (depth == 0 and isinstance(item, Mapping)):
            if depth >= MAX_DEPTH:
                return path, _too_deep()
            children = _children(item, path)
            if isinstance(children, tuple):
                return children
            todo.extend((child, where, depth + 1) for where, child in reversed(children))
        else:
            return path, (
                f"is {describe(item)}, not a JSON value (a string, number, true/false, null, list or "
                "dict); convert it, e.g. with int(), float() or str(), or leave it out"
            )
    return None


def _children(item: Any, path: str) -> list[tuple[str, Any]] | tuple[str, str]:
    """``(path, value)`` of each element, or the problem of a key that cannot be kept."""
    if not isinstance(item, Mapping):
        return [(f"{path}[{i}]", child) for i, child in enumerate(item)]
    children = []
    for key, child in item.items():
        if not isinstance(key, str):
            return path, f"has key {describe(key)}: JSON keys are strings; write it as one"
        where = f"{path}.{key}" if path else key
        if message := _surrogate(key):
            return where, f"the name {message}"
        children.append((where, child))
    return children


def _surrogate(text: str) -> str | None:
    found = _SURROGATE.search(text)
    if found is None:
        return None
    return (
        f"has a lone surrogate (U+{ord(found.group()):04X}) at character {found.start()}, "
        "which is not valid Unicode text"
    )


def _long_int(size: str) -> str:
    return f"is an integer of {size}; write it as a string"


def _too_deep() -> str:
    return f"is nested more than {MAX_DEPTH} levels deep (lists or objects within each other); flatten it"
