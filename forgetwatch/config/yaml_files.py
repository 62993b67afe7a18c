"""Settings from YAML, with each key's line, read by ruamel.yaml as YAML 1.2 (``010`` is 10, ``1:30`` and ``yes``
are text): plain values only, no tags, anchors or aliases, nothing over 1 MiB, too deep or too long a number."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.events import AliasEvent, CollectionEndEvent, CollectionStartEvent, Event, NodeEvent, ScalarEvent

from forgetwatch.common.problems import Problem
from forgetwatch.common.strict_json import MAX_DEPTH, MAX_INT_DIGITS
from forgetwatch.common.text import describe
from forgetwatch.config.settings import ConfigError

MAX_BYTES = 1 << 20  # 1 MiB: a settings file is small; anything else is a mistake or a bomb


def read_settings(path: str | os.PathLike[str]) -> tuple[dict[Any, Any], dict[Any, int]]:
    """A YAML file's top-level settings and each key's line; ``FileNotFoundError`` or :class:`ConfigError`."""
    source = str(path)
    try:
        if (size := Path(path).stat().st_size) > MAX_BYTES:
            message = f"is {size} bytes; a forgetwatch config is a few settings (at most {MAX_BYTES} bytes)"
            raise ConfigError([Problem(source, None, None, message)])
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, "forgetwatch config file not found; check the path", source) from None
    except UnicodeDecodeError as exc:
        message = f"not UTF-8 text ({exc.reason} at byte {exc.start}); save the file as UTF-8"
        raise ConfigError([Problem(source, None, None, message)]) from None
    data, lines = _loaded(text, source)
    if not isinstance(data, dict):
        got = "an empty document" if data is None else describe(data)
        message = f"the document must be a mapping of forgetwatch settings (key: value lines), got {got}"
        raise ConfigError([Problem(source, None, None, message)])
    return data, dict(zip(data, lines))  # a mapping's keys in the order written: no key is given twice


def read_value(text: str, source: str) -> Any:
    """YAML text (a file's, an environment variable's) as plain values, or a :class:`ConfigError` naming the line."""
    return _loaded(text, source)[0]


def _loaded(text: str, source: str) -> tuple[Any, list[int]]:
    """The values of YAML text and the line of each top-level key."""
    try:
        yaml_12 = YAML(typ="safe", pure=True)
        lines = _refuse_what_no_setting_needs(yaml_12.parse(text), source)
        return yaml_12.load(text), lines
    except MarkedYAMLError as exc:  # the syntax, or a key given twice
        mark = exc.problem_mark or exc.context_mark
        where = f" (column {mark.column + 1})" if mark is not None else ""
        what = " ".join(p for p in (exc.context, exc.problem) if p)
        message = f"YAML error: {what}{where}; fix the YAML at that spot"
        raise ConfigError([Problem(source, mark.line + 1 if mark else None, None, message)]) from None
    except ConfigError:
        raise
    except (YAMLError, ValueError) as exc:  # a value YAML reads as a type it cannot build (a date of month 13)
        message = f"YAML cannot build a value ({exc}); quote it to keep it as text"
        raise ConfigError([Problem(source, None, None, message)]) from None


def _refuse_what_no_setting_needs(events: Iterable[Event], source: str) -> list[int]:
    """Each top-level key's line; refuses first what would explode (aliases), run deep, or not fit a setting."""
    depth, key, at_key = 0, None, True  # key: the top-level key above each node; at_key: the next one is a key
    lines = []
    for event in events:
        if isinstance(event, CollectionEndEvent):
            depth -= 1
            at_key ^= depth == 1
            continue
        if not isinstance(event, NodeEvent):
            continue
        if depth == 1 and at_key:
            lines.append(event.start_mark.line + 1)
            key = event.value if isinstance(event, ScalarEvent) else None
        message = None
        if isinstance(event, AliasEvent) or event.anchor is not None:
            message = "YAML anchors and aliases (&name / *name) are not allowed in forgetwatch settings; write it out"
        elif event.tag is not None:
            message = f"YAML tags ({event.tag}) are not allowed in forgetwatch settings; write plain values"
        elif isinstance(event, CollectionStartEvent) and depth >= MAX_DEPTH:
            message = f"values nested more than {MAX_DEPTH} levels deep; no forgetwatch setting takes one"
        elif isinstance(event, ScalarEvent) and event.style is None and len(event.value) > MAX_INT_DIGITS:
            if event.value.lstrip("+-").isdigit():
                message = f"an integer of {len(event.value)} characters; no forgetwatch setting takes one this long"
        if message:
            raise ConfigError([Problem(source, event.start_mark.line + 1, key if depth else None, message)])
        if isinstance(event, CollectionStartEvent):
            depth += 1
        else:
            at_key ^= depth == 1
    return lines


def yaml11_misreadings(path: str | os.PathLike[str]) -> dict[str, tuple[int, str, Any]]:
    """Top-level keys whose plain value YAML 1.1 (the frameworks' PyYAML) reads as another number or true/false than
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
