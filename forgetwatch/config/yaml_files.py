"""Settings from and to YAML, with each key's line: plain values only, read by YAML 1.2's core schema (``010`` is 10,
``1:30`` and ``yes`` are text); no tags, anchors or aliases, nothing over 1 MiB, too deep or too long a number."""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from forgetwatch.common.files import atomic_write
from forgetwatch.common.problems import Problem
from forgetwatch.common.strict_json import MAX_DEPTH, MAX_INT_DIGITS
from forgetwatch.common.text import describe, did_you_mean
from forgetwatch.config.checks import ConfigError

MAX_BYTES = 1 << 20  # 1 MiB
#: Top-level key under which a bigger YAML file may hold the forgetwatch section.
ROOT_KEY = "forgetwatch"


def read_section(
    path: str | os.PathLike[str], known: Sequence[str]
) -> tuple[Mapping[str, Any], dict[str, int], list[Problem]]:
    """The settings of a YAML file (its top level, or its ``forgetwatch:`` section), each key's line, and the
    problems found so far (unknown keys come later); ``FileNotFoundError`` or :class:`ConfigError` otherwise."""
    source = str(path)
    try:
        size = Path(path).stat().st_size
        if size > MAX_BYTES:  # a settings file is small; anything else is a mistake or a bomb
            message = f"is {size} bytes; a forgetwatch config is a few settings (at most {MAX_BYTES} bytes)"
            raise ConfigError([Problem(source, None, None, message)])
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, "forgetwatch config file not found; check the path", source) from None
    except UnicodeDecodeError as exc:
        message = f"not UTF-8 text ({exc.reason} at byte {exc.start}); save the file as UTF-8"
        raise ConfigError([Problem(source, None, None, message)]) from None

    node, data = _parse_yaml(text, source)
    if not isinstance(data, Mapping):
        got = "an empty document" if data is None else describe(data)
        message = f"the document must be a mapping of forgetwatch settings (key: value lines), got {got}"
        raise ConfigError([Problem(source, None, None, message)])

    lines = _key_lines(node)
    problems: list[Problem] = []
    if ROOT_KEY in data:
        # The section lives inside a bigger config: only its own keys are ours.
        root_line = lines.get(ROOT_KEY, (None,))[0]
        section = data[ROOT_KEY]
        if not isinstance(section, Mapping):
            got = "nothing" if section is None else describe(section)
            message = f"expected a mapping of forgetwatch settings, got {got}; indent the settings under '{ROOT_KEY}:'"
            raise ConfigError([Problem(source, root_line, ROOT_KEY, message)])
        data = section
        lines = _key_lines(_value_node(node, ROOT_KEY))
    elif data and not any(k in known or did_you_mean(str(k), known) for k in data):
        # Nothing we know or nearly know: likely a training config without a forgetwatch section.
        message = (
            "no forgetwatch settings found; if this is a bigger training config, "
            f"put the forgetwatch settings under a top-level '{ROOT_KEY}:' key"
        )
        problems.append(Problem(source, None, None, message))

    for key, key_lines in lines.items():
        if len(key_lines) > 1:
            # PyYAML silently keeps the last one; a repeated key is almost always a mistake.
            shown = ", ".join(str(n) for n in key_lines)
            message = f"appears {len(key_lines)} times (lines {shown}); keep one"
            problems.append(Problem(source, key_lines[-1], key, message))
    return data, {k: v[0] for k, v in lines.items()}, problems


def read_value(text: str, source: str) -> Any:
    """One value written as YAML text (an environment variable's), read as a config file's are."""
    return _parse_yaml(text, source)[1]


def yaml11_misreadings(path: str | os.PathLike[str]) -> dict[str, tuple[int, str, Any]]:
    """Top-level keys whose plain value YAML 1.1 (the frameworks') reads as another number or true/false than
    YAML 1.2 does (``010`` as 8, ``1:30`` as 90, ``yes`` as true): key -> (line, text, YAML 1.1's value)."""
    try:
        if Path(path).stat().st_size > MAX_BYTES:
            return {}
        text = Path(path).read_text(encoding="utf-8")
        node, data = yaml.compose(text, Loader=yaml.SafeLoader), yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    found: dict[str, tuple[int, str, Any]] = {}
    for key_node, value_node in node.value if isinstance(data, dict) else ():
        old = data.get(key_node.value) if isinstance(key_node, yaml.ScalarNode) else None
        # a number or true/false where YAML 1.2 reads another (a date, say, fails the settings' own checks)
        with contextlib.suppress(ConfigError):
            if isinstance(old, (bool, int, float)) and repr(old) != repr(read_value(value_node.value, "")):
                found[key_node.value] = (value_node.start_mark.line + 1, value_node.value, old)
    return found


def write_settings(data: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Write settings as a flat YAML file, atomically."""
    text = yaml.dump(dict(data), Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True)
    with atomic_write(path) as f:
        f.write("# forgetwatch settings; load with ForgetWatchConfig.from_yaml(path)\n")
        f.write(text)


_INT_TAG = "tag:yaml.org,2002:int"


class _Loader(yaml.SafeLoader):
    """SafeLoader by YAML 1.2's core schema, refusing while it composes an alias (nested ones explode), deep
    nesting, or an integer too long for Python; it remembers the node it builds (to name a bad value's line)."""

    building: yaml.Node | None = None
    yaml_implicit_resolvers: dict[str, list[tuple[str, re.Pattern[str]]]] = {}

    def __init__(self, text: str, source: str):
        super().__init__(text)
        self.source, self.keys = source, [None]  # the nearest mapping key above each node, to name in errors

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        key = str(index.value) if isinstance(index, yaml.ScalarNode) else self.keys[-1]
        line = self.peek_event().start_mark.line + 1
        if self.check_event(yaml.AliasEvent):
            message = (
                "YAML anchors and aliases (&name / *name) are not allowed in a forgetwatch config; write each value out"
            )
            raise ConfigError([Problem(self.source, line, key, message)])
        if len(self.keys) > MAX_DEPTH:
            message = f"values nested more than {MAX_DEPTH} levels deep; no forgetwatch setting takes one"
            raise ConfigError([Problem(self.source, line, key, message)])
        self.keys.append(key)
        node = super().compose_node(parent, index)
        self.keys.pop()
        if node.tag == _INT_TAG and len(node.value.lstrip("+-").replace("_", "")) > MAX_INT_DIGITS:
            message = f"an integer of {len(node.value)} characters; no forgetwatch setting takes one this long"
            raise ConfigError([Problem(self.source, line, key, message)])
        return node

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        self.building = node
        return super().construct_object(node, deep)


for _tag, _pattern, _first in (
    ("null", r"~|null|Null|NULL|", ["~", "n", "N", ""]),
    ("bool", r"true|True|TRUE|false|False|FALSE", list("tTfF")),
    ("int", r"[-+]?[0-9]+", list("-+0123456789")),
    (
        "float",
        r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)",
        list("-+.0123456789"),
    ),
):
    _Loader.add_implicit_resolver(f"tag:yaml.org,2002:{_tag}", re.compile(f"^(?:{_pattern})$"), _first)
# a decimal integer, whatever its leading zeros: YAML 1.1's constructor would read 010 as octal
_Loader.add_constructor(_INT_TAG, lambda loader, node: int(loader.construct_scalar(node)))


class _Dumper(yaml.SafeDumper):
    """SafeDumper double-quoting strings with control characters (``"\\n"``, not a scalar broken over lines)."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = '"' if any(ch < " " or ch == "\x7f" for ch in value) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


def _parse_yaml(text: str, source: str) -> tuple[yaml.Node | None, Any]:
    loader = _Loader(text, source)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        column = f" (column {mark.column + 1})" if mark is not None else ""
        what = " ".join(p for p in (exc.context, exc.problem) if p) or "invalid YAML"
        if isinstance(exc, yaml.constructor.ConstructorError):
            # Parsed fine, but asks for an object safe_load will not build (e.g. !!python/...).
            message = f"YAML error: {what}{column}; use plain values only (no '!!' tags)"
        else:
            message = (
                f"YAML syntax error: {what}{column}; fix the YAML at that spot "
                "(indentation, a missing ':' or an unclosed bracket or quote)"
            )
        raise ConfigError([Problem(source, line, None, message)]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([Problem(source, None, None, f"YAML error: {exc}")]) from None
    except ConfigError:
        raise
    except (ValueError, OverflowError) as exc:  # a scalar YAML reads as a type it cannot build
        line = loader.building.start_mark.line + 1 if loader.building is not None else None
        message = f"YAML cannot build this value ({exc}); quote it to keep it as text"
        raise ConfigError([Problem(source, line, None, message)]) from None
    finally:
        loader.dispose()
    return node, data


def _key_lines(node: yaml.Node | None) -> dict[str, list[int]]:
    lines: dict[str, list[int]] = {}
    if isinstance(node, yaml.MappingNode):
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                lines.setdefault(str(key_node.value), []).append(key_node.start_mark.line + 1)
    return lines


def _value_node(node: yaml.Node | None, key: str) -> yaml.Node | None:
    pairs = node.value if isinstance(node, yaml.MappingNode) else []
    return next((v for k, v in reversed(pairs) if isinstance(k, yaml.ScalarNode) and k.value == key), None)
