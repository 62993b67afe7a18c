"""Behaviour checks: what a probe's ``check`` may say, how a bad one is reported, and whether a response passes."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from forgetwatch.behaviour import style
from forgetwatch.behaviour.ifeval import follows, instruction_problem
from forgetwatch.behaviour.values import count, got, rule, strings, text
from forgetwatch.common import patterns
from forgetwatch.common.strict_json import nests_within, value_problem
from forgetwatch.common.text import shorten, suggestion, type_name

logger = logging.getLogger(__name__)

Detector = Callable[[str], bool]
#: How deep brackets may nest in a response that counts as JSON: fixed, within any caller's recursion limit.
MAX_JSON_DEPTH = 200

_warned: set[str] = set()  # check keys that raised on a response, warned once each


def _pattern(value: Any) -> str | None:
    if not isinstance(value, str) or not value:
        return f"must be a non-empty regular expression (a string), {got(value)}"
    problem = patterns.pattern_problem(value)
    return f"regex {shorten(value)} {problem}" if problem else None


def _unfenced(text: str) -> str:
    """The text inside a ```json fence around the whole text, else the text (string tests: a regex would backtrack)."""
    if len(text) >= 6 and text.startswith("```") and text.endswith("```"):
        inside = text[3:-3]
        return inside[4:] if inside[:4].lower() == "json" else inside
    return text


def _parses_as_json(response: str) -> bool:
    text = _unfenced(response.strip()).strip()
    if not nests_within(text, MAX_JSON_DEPTH):
        return False
    try:
        json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: only where the caller is already deep
        return False
    return True


def _letters(response: str) -> bool:
    return any(map(str.isalpha, response))


_boolean = rule(lambda v: isinstance(v, bool), "true or false")


class Check(NamedTuple):
    """One check key: how its value is validated, and whether a response passes (docs/behaviour.md: what it means)."""

    problem: Callable[[Any], str | tuple[str, str] | None]
    holds: Callable[[Any, str, Detector], bool]


#: Every check key, in the order errors list them.
CHECKS: dict[str, Check] = {
    "refuses": Check(_boolean, lambda v, r, refuses: refuses(r) == v),
    "max_words": Check(count(0), lambda v, r, _: style.word_count(r) <= v),
    "min_words": Check(count(1), lambda v, r, _: style.word_count(r) >= v),
    "max_sentences": Check(count(1), lambda v, r, _: style.sentence_count(r) <= v),
    "regex": Check(_pattern, lambda v, r, _: patterns.search(v, r) is not None),  # RE2: linear time, no lookarounds
    "not_regex": Check(_pattern, lambda v, r, _: patterns.search(v, r) is None),
    "contains": Check(strings(), lambda v, r, _: all(p.lower() in r.lower() for p in v)),
    "not_contains": Check(strings(), lambda v, r, _: not any(p.lower() in r.lower() for p in v)),
    "json": Check(_boolean, lambda v, r, _: _parses_as_json(r) == v),
    "starts_with": Check(text, lambda v, r, _: r.lstrip().startswith(v)),
    "lowercase": Check(_boolean, lambda v, r, _: (_letters(r) and r == r.lower()) == v),
    "uppercase": Check(_boolean, lambda v, r, _: (_letters(r) and r == r.upper()) == v),
    "bullets": Check(count(1), lambda v, r, _: style.bullet_lines(r) >= v),
    "ifeval": Check(instruction_problem, lambda v, r, _: follows(v, r)),
}


def check_problems(value: Any) -> list[tuple[str, str]]:
    """Every problem of a ``check`` object, as ``(field, message)``."""
    if not isinstance(value, Mapping):
        return [("check", f'must be an object of checks, e.g. {{"refuses": false}}, got {type_name(value)}')]
    if not value:
        return [("check", 'is empty; give at least one check, e.g. {"refuses": false}')]
    problems, known = [], ", ".join(CHECKS)
    for key, v in value.items():
        if key not in CHECKS:
            problems.append(("check", f"unknown check {shorten(key)}{suggestion(str(key), CHECKS)}; known: {known}"))
        elif found := value_problem(v):  # a lone surrogate, NaN, ...: what no later step could keep
            inside, message = found
            problems.append((f"check.{key}" + (inside if inside[:1] in ("", "[") else f".{inside}"), message))
        elif problem := CHECKS[key].problem(v):
            inside, message = problem if isinstance(problem, tuple) else ("", problem)
            problems.append((f"check.{key}{inside}", message))
    low, high = value.get("min_words"), value.get("max_words")
    if not problems and low is not None and high is not None and low > high:
        problems.append(("check.min_words", f"{low} is more than max_words {high}: no response could pass"))
    return problems


def failed_checks(check: Mapping[str, Any], response: str, refusal_detector: Detector | None = None) -> list[str]:
    """The keys of ``check`` that ``response`` fails, in order; a check that raises counts as failed (warned once)."""
    refuses = refusal_detector or style.looks_like_refusal
    return [key for key, value in check.items() if not _holds(key, value, response, refuses)]


def _holds(key: str, value: Any, response: str, refuses: Detector) -> bool:
    try:
        return bool(CHECKS[key].holds(value, response, refuses))
    except Exception as err:  # noqa: BLE001 - a check never ends a run; the warning says why it failed
        if key not in _warned:
            _warned.add(key)
            why = f"{type(err).__name__} on a response ({shorten(str(err), 200)}); a response it raises on fails it"
            logger.warning(f"forgetwatch: the {key!r} check raised {why} (said once per check)")
        return False
