"""Tool-call probes (CapTrack's H3): the tools' schemas checked, the model's call read from its reply (the chat
template's tool-call format or plain JSON), and judged by name and arguments."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from forgetwatch.common.strict_json import nests_within
from forgetwatch.common.text import shorten, type_name

#: How a call's arguments are matched: all of them equal, or the expected ones present and equal.
ARGUMENT_MATCHES = ("exact", "subset")
#: Characters of a reply searched for a call: a reply is a few hundred tokens; JSON is decoded from each "{" or "[".
MAX_SEARCHED = 20_000
#: Deepest nesting of a call read: deeper JSON is no call. Reading a reply's brackets costs up to this many steps
#: a character, and a call is a few levels deep.
MAX_CALL_DEPTH = 32


def tool_name(tool: Mapping[str, Any]) -> Any:
    """A tool schema's name: ``{"type": "function", "function": {"name": ...}}`` or ``{"name": ...}``."""
    inner = tool.get("function")
    return inner.get("name") if isinstance(inner, Mapping) else tool.get("name")


def tools_problems(tools: Any) -> list[tuple[str, str]]:
    """What is wrong with a probe's ``tools``: a non-empty list of JSON-schema objects, each with a name."""
    if not isinstance(tools, (list, tuple)) or not tools:
        return [("tools", f"must be a non-empty list of tool schemas (JSON objects), got {type_name(tools)}")]
    problems = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            problems.append((f"tools[{i}]", f"must be a JSON object, got {type_name(tool)} {shorten(tool)}"))
        elif not isinstance(tool_name(tool), str) or not tool_name(tool):
            problems.append((f"tools[{i}]", 'has no name: give {"type": "function", "function": {"name": ...}}'))
    return problems


def call_problems(answer: Any, tools: Any) -> list[tuple[str, str]]:
    """What is wrong with the expected call: ``{"name": one of the tools, "arguments": {...}}``."""
    if not isinstance(answer, Mapping):
        return [("answer", f'must be the expected call {{"name": ..., "arguments": {{...}}}}, got {type_name(answer)}')]
    problems = []
    if extra := sorted(set(answer) - {"name", "arguments"}):
        problems.append(("answer", f"unknown key {extra[0]!r}; a call has 'name' and 'arguments'"))
    names = {tool_name(t) for t in tools if isinstance(t, Mapping)} if isinstance(tools, (list, tuple)) else set()
    if not isinstance(answer.get("name"), str) or not answer.get("name"):
        problems.append(("answer.name", "missing; give the name of the tool the model should call"))
    elif names and answer["name"] not in names:
        problems.append(
            ("answer.name", f"{shorten(answer['name'])} is none of the tools ({', '.join(sorted(map(str, names)))})")
        )
    if not isinstance(answer.get("arguments", {}), Mapping):
        problems.append(("answer.arguments", f"must be a JSON object, got {type_name(answer.get('arguments'))}"))
    return problems


def parse_call(text: str | None) -> dict[str, Any] | None:
    """The first tool call in a reply, or ``None``: a JSON object with a ``name`` (alone, first in a list, or under
    ``function``) and ``arguments`` (or ``parameters``), wherever it stands (``<tool_call>`` tags, ``[TOOL_CALLS]``,
    a code block). JSON nested deeper than ``MAX_CALL_DEPTH`` is no call: the parser recurses a level at a time."""
    if not text:
        return None
    decoder = json.JSONDecoder()
    text = text[:MAX_SEARCHED]
    for start, char in enumerate(text):
        if char not in "{[" or not nests_within(text, MAX_CALL_DEPTH, start):
            continue
        try:
            value, _ = decoder.raw_decode(text, start)
        except ValueError:
            continue
        call = _as_call(value[0] if isinstance(value, list) and value else value)
        if call is not None:
            return call
    return None


def _as_call(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, dict):
        return None
    if isinstance(value.get("function"), dict) and "name" not in value:  # OpenAI's {"type", "function": {...}}
        value = value["function"]
    name = value.get("name")
    if not isinstance(name, str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    # a JSON string is read; one that is not JSON (or nests too deep) is kept, judged wrong unless not compared
    if isinstance(arguments, str) and nests_within(arguments, MAX_CALL_DEPTH, len(arguments) - len(arguments.lstrip())):
        with contextlib.suppress(ValueError):
            arguments = json.loads(arguments)
    return {"name": name, "arguments": arguments}


def json_equal(a: Any, b: Any) -> bool:
    """Equal as JSON values: numbers by value (1 == 1.0), but true is not 1; objects by keys, lists in order."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b and not (isinstance(a, float) and math.isnan(a))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, Sequence) and isinstance(b, Sequence) and not isinstance(a, str) and not isinstance(b, str):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def calls_match(
    expected: Mapping[str, Any], produced: Mapping[str, Any] | None, arguments_match: str = "exact"
) -> bool:
    """Whether ``produced`` calls the expected tool with the expected arguments (all of them and no others for
    ``"exact"``; at least those, equal, for ``"subset"``)."""
    if produced is None or produced.get("name") != expected["name"]:
        return False
    want, got = expected.get("arguments", {}), produced.get("arguments")
    if not isinstance(got, Mapping):
        return False
    if arguments_match == "subset":
        return all(k in got and json_equal(v, got[k]) for k, v in want.items())
    return json_equal(want, got)
