"""Settings for :class:`~forgetwatch.callback.ForgetWatchCallback`, from code or a YAML file.

A config file is a YAML mapping of the fields of :class:`ForgetWatchConfig`, either on its own
or under a top-level ``forgetwatch:`` key of a bigger training config::

    # train.yaml
    learning_rate: 2.0e-5          # not ours: ignored
    forgetwatch:
      probes: probes/mmlu_subset.jsonl   # relative paths are relative to this file
      eval_steps: 50
      max_forgetting: 0.05

Every value is checked when the config is built, in code as well as from a file, and all the
problems found are reported together in one :class:`ConfigError`.
"""

from __future__ import annotations

import difflib
import errno
import math
import numbers
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from .files import atomic_write
from .stopping import STOP_METRICS

__all__ = ["ConfigError", "ConfigProblem", "ForgetWatchConfig"]

#: Top-level key under which a bigger YAML file may hold the forgetwatch section.
ROOT_KEY = "forgetwatch"
NORMALIZE_MODES = ("chars",)
#: Fields holding file system paths: resolved against the YAML file's folder when relative.
PATH_FIELDS = ("probes", "base", "output_dir")
ADAPTER_DISABLED = "adapter_disabled"  # the one value of ``base`` that is not a path


class ConfigProblem(NamedTuple):
    """One problem in a config: where it is (``source``, ``line``, ``key``) and what is wrong."""

    source: str
    line: int | None
    key: str | None
    message: str

    def __str__(self) -> str:
        where = self.source
        if self.line is not None:
            where += f": line {self.line}"
        if self.key is not None:
            where += f": key {self.key!r}"
        return f"{where}: {self.message}"


class ConfigError(ValueError):
    """A forgetwatch config is invalid.

    The message has one line per problem, e.g.
    ``train.yaml: line 3: key 'eval_step': unknown key (did you mean 'eval_steps'?)``;
    ``errors`` holds the same problems as :class:`ConfigProblem` tuples
    ``(source, line, key, message)``.
    """

    def __init__(self, errors: Sequence[ConfigProblem]):
        self.errors = list(errors)
        super().__init__("\n".join(str(e) for e in self.errors))


@dataclass
class ForgetWatchConfig:
    """What to probe, how often, and when to stop: the settings of ``ForgetWatchCallback``.

    Every value is validated on construction; a wrong one raises :class:`ConfigError`.

    Example:
        >>> cfg = ForgetWatchConfig(probes="probes.jsonl", eval_steps=50, max_forgetting=0.05)
        >>> cfg.patience, cfg.stop
        (1, ['\\n'])
        >>> ForgetWatchConfig(patience=0)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
            ...
        forgetwatch.config.ConfigError: ForgetWatchConfig: key 'patience': expected an integer >= 1, got 0 (int); ...
    """

    #: Path to a probe JSONL file (the callback also accepts a ProbeSet object directly).
    probes: str | None = None
    #: Evaluate every N optimizer steps; None: the cost-budget schedule (see ``max_overhead``).
    eval_steps: int | None = None
    #: With the budget schedule, the share of wall time monitoring may take (0 < x < 1).
    max_overhead: float = 0.05
    #: Also evaluate at every trainer evaluation (adds ``eval_forgetwatch_*`` metrics).
    eval_on_evaluate: bool = True
    #: Evaluate once more when training ends.
    eval_on_train_end: bool = True
    #: Stop training once the forgetting rate exceeds this (0..1); None: never stop.
    max_forgetting: float | None = None
    #: Which rate ``max_forgetting`` applies to: "forgetting" or "forgetting_adjusted".
    stop_metric: str = "forgetting"
    #: Consecutive evaluations over the threshold before stopping (>= 1).
    patience: int = 1
    #: Stop only when the Wilson 95 % lower bound of the rate is over the threshold.
    significance: bool = False
    #: Per-category thresholds, category -> rate (0..1).
    category_max_forgetting: dict[str, float] = field(default_factory=dict)
    #: Ask the trainer for a checkpoint before stopping.
    save_on_stop: bool = True
    #: Where the base snapshot and history live; None: ``<trainer output_dir>/forgetwatch``.
    output_dir: str | None = None
    #: A saved base answers snapshot (.json/.npz) to use instead of computing one; or
    #: "adapter_disabled": score the PEFT model with its adapters disabled (LoRA) whenever
    #: training begins or resumes, instead of keeping a snapshot.
    base: str | None = None
    #: Probes per forward pass: a positive integer or "auto".
    batch_size: int | str = "auto"
    #: Multiple-choice score normalisation: None (lm-eval ``acc``) or "chars" (``acc_norm``).
    normalize: str | None = None
    #: Wrap each question in the tokenizer's chat template.
    chat_template: bool = False
    #: Generative probes: most tokens to generate (>= 1).
    max_new_tokens: int = 64
    #: Generative probes: generation stops at the first of these strings.
    stop: list[str] = field(default_factory=lambda: ["\n"])
    #: Also log ``forgetwatch/<category>/<metric>`` keys.
    log_categories: bool = True
    #: Print one console line per evaluation.
    verbose: bool = True

    def __post_init__(self) -> None:
        # Checked here, not only in from_dict, so configs built in code are held to the same rules.
        values = {name: getattr(self, name) for name in _CHECKS}
        cleaned, problems = _check_values(values, "ForgetWatchConfig", {})
        if problems:
            raise ConfigError(problems)
        # Normalised copies (list/dict copies, ints as floats): the caller's objects are not shared.
        for name, value in cleaned.items():
            setattr(self, name, value)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "<dict>") -> ForgetWatchConfig:
        """Build a config from a mapping of field names to values; missing keys keep defaults.

        All problems (unknown keys, wrong types, values out of range) are reported together in
        one :class:`ConfigError` whose lines start with ``source``. Paths are kept as given
        (relative ones stay relative to the current directory).

        Example:
            >>> ForgetWatchConfig.from_dict({"eval_steps": 50}).eval_steps
            50
            >>> ForgetWatchConfig.from_dict({"eval_step": 50}, source="cfg")  # doctest: +ELLIPSIS
            Traceback (most recent call last):
                ...
            forgetwatch.config.ConfigError: cfg: key 'eval_step': unknown key (did you mean 'eval_steps'?); ...
        """
        return cls._from_mapping(data, source, lines={}, relative_to=None)

    def replace(self, **changes: Any) -> ForgetWatchConfig:
        return type(self).from_dict({**self.to_dict(), **changes})

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str], **overrides: Any) -> ForgetWatchConfig:
        """Load a config from a YAML file.

        The document is either the config mapping itself or a bigger mapping holding it under a
        top-level ``forgetwatch:`` key (other top-level keys are then ignored). Relative
        ``probes``, ``base`` and ``output_dir`` paths are taken relative to the YAML file's
        folder, so a config and its probe files can move together; ``~`` is expanded.

        Raises:
            FileNotFoundError: the file does not exist.
            ConfigError: the YAML is malformed (names the file and line) or a value is invalid.

        Example:
            >>> cfg = ForgetWatchConfig.from_yaml("configs/early_stop_adjusted_5pct.yaml")  # doctest: +SKIP
            >>> cfg.max_forgetting, cfg.stop_metric                                          # doctest: +SKIP
            (0.05, 'forgetting_adjusted')
        """
        source = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise FileNotFoundError(errno.ENOENT, "forgetwatch config file not found; check the path",
                                    source) from None
        except UnicodeDecodeError as exc:
            message = f"not UTF-8 text ({exc.reason} at byte {exc.start}); save the file as UTF-8"
            raise ConfigError([ConfigProblem(source, None, None, message)]) from None

        node, data = _parse_yaml(text, source)
        if not isinstance(data, Mapping):
            got = "an empty document" if data is None else f"a {_yaml_kind(data)}"
            message = f"the document must be a mapping of forgetwatch settings (key: value lines), got {got}"
            raise ConfigError([ConfigProblem(source, None, None, message)])

        lines = _key_lines(node)
        problems: list[ConfigProblem] = []
        if ROOT_KEY in data:
            # The section lives inside a bigger config: only its own keys are ours.
            root_line = lines.get(ROOT_KEY, (None,))[0]
            section = data[ROOT_KEY]
            if not isinstance(section, Mapping):
                got = "nothing" if section is None else _describe(section)
                message = (f"expected a mapping of forgetwatch settings, got {got}; "
                           f"indent the settings under '{ROOT_KEY}:'")
                raise ConfigError([ConfigProblem(source, root_line, ROOT_KEY, message)])
            data = section
            lines = _key_lines(_value_node(node, ROOT_KEY))
        elif data and not any(k in _CHECKS or _did_you_mean(str(k), _CHECKS) for k in data):
            # Nothing we know or nearly know: likely a training config without a forgetwatch section.
            message = ("no forgetwatch settings found; if this is a bigger training config, "
                       f"put the forgetwatch settings under a top-level '{ROOT_KEY}:' key")
            problems.append(ConfigProblem(source, None, None, message))

        for key, key_lines in lines.items():
            if len(key_lines) > 1:
                # PyYAML silently keeps the last one; a repeated key is almost always a mistake.
                shown = ", ".join(str(n) for n in key_lines)
                message = f"appears {len(key_lines)} times (lines {shown}); keep one"
                problems.append(ConfigProblem(source, key_lines[-1], key, message))

        relative_to = Path(path).absolute().parent
        cfg = cls._from_mapping(data, source, {k: v[0] for k, v in lines.items()}, relative_to, problems)
        return cfg.replace(**overrides) if overrides else cfg

    @classmethod
    def _from_mapping(
        cls,
        data: Mapping[str, Any],
        source: str,
        lines: Mapping[str, int],
        relative_to: Path | None,
        problems: list[ConfigProblem] | None = None,
    ) -> ForgetWatchConfig:
        problems = list(problems or [])
        if not isinstance(data, Mapping):
            message = f"expected a mapping of forgetwatch settings, got {_describe(data)}"
            raise ConfigError([ConfigProblem(source, None, None, message)])
        known: dict[str, Any] = {}
        for key, value in data.items():
            if not isinstance(key, str):
                message = f"key {_describe(key)} is not a string; write setting names such as 'eval_steps'"
                problems.append(ConfigProblem(source, None, None, message))
            elif key not in _CHECKS:
                hint = _did_you_mean(key, _CHECKS) or f" (known keys: {', '.join(_CHECKS)})"
                message = f"unknown key{hint}; fix or remove it"
                problems.append(ConfigProblem(source, lines.get(key), key, message))
            else:
                known[key] = value
        cleaned, value_problems = _check_values(known, source, lines)
        problems += value_problems
        if problems:
            raise ConfigError(problems)
        if relative_to is not None:
            for name in PATH_FIELDS:
                if cleaned.get(name) not in (None, ADAPTER_DISABLED):
                    cleaned[name] = _resolve(cleaned[name], relative_to)
        return cls(**cleaned)

    def to_dict(self) -> dict[str, Any]:
        """All fields as a plain dict (only str, int, float, bool, None, list, dict): YAML/JSON-ready.

        Example:
            >>> ForgetWatchConfig(eval_steps=50).to_dict()["eval_steps"]
            50
        """
        return {
            f.name: (list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v)
            for f in fields(self)
            for v in (getattr(self, f.name),)
        }

    def to_yaml(self, path: str | os.PathLike[str]) -> None:
        """Write the config as a flat YAML file (atomically) that :meth:`from_yaml` reads back.

        Relative paths are written as absolute ones (resolved against the current directory),
        because :meth:`from_yaml` would otherwise read them relative to the file's folder.

        Example:
            >>> ForgetWatchConfig(eval_steps=50).to_yaml("/tmp/forgetwatch.yaml")
            >>> ForgetWatchConfig.from_yaml("/tmp/forgetwatch.yaml").eval_steps
            50
        """
        data = self.to_dict()
        for name in PATH_FIELDS:
            if data[name] not in (None, ADAPTER_DISABLED):
                data[name] = _resolve(data[name], Path.cwd())
        text = yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                         allow_unicode=True)
        with atomic_write(path) as f:
            f.write("# forgetwatch settings; load with ForgetWatchConfig.from_yaml(path)\n")
            f.write(text)


# --- checks --------------------------------------------------------------------------------


class _Invalid(Exception):
    """Raised by a field check: what was expected, the value given, and what to do."""

    def __init__(self, expected: str, value: Any, hint: str = "", prefix: str = ""):
        self.expected, self.value, self.hint, self.prefix = expected, value, hint, prefix
        message = f"{prefix}expected {expected}, got {_describe(value)}"
        super().__init__(f"{message}; {hint}" if hint else message)


def _describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"


def _yaml_kind(value: Any) -> str:
    if isinstance(value, list):
        return "list"
    if isinstance(value, str):
        return f"plain string {value[:40]!r}"
    return f"{type(value).__name__} {value!r}"


def _did_you_mean(word: str, options: Sequence[str]) -> str:
    match = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


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
            return f"YAML reads {text} as text; write it with a dot: {number!r}"
        return "remove the quotes"
    return ""


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    is_01 = isinstance(value, numbers.Number) and value in (0, 1)
    hint = _slip_hint(value, "bool") or "write true or false" + (", not 0 or 1" if is_01 else "")
    raise _Invalid("true or false", value, hint)


def _int(minimum: int) -> Callable[[Any], int]:
    expected = f"an integer >= {minimum}"

    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            if isinstance(value, float) and value.is_integer():
                hint = f"write {int(value)}, without the decimal point"
            else:
                hint = _slip_hint(value, "int") or "write a whole number"
            raise _Invalid(expected, value, hint)
        if value < minimum:
            raise _Invalid(expected, value, f"use {minimum} or more")
        return int(value)

    return check


def _rate(low_open: bool, high_open: bool, example: str) -> Callable[[Any], float]:
    """A number between 0 and 1, each end open or closed as asked."""
    expected = f"a number in {'(' if low_open else '['}0, 1{')' if high_open else ']'}"

    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise _Invalid(expected, value, _slip_hint(value, "float") or f"write a number such as {example}")
        number = float(value)
        low_bad = number <= 0 if low_open else number < 0
        high_bad = number >= 1 if high_open else number > 1
        if math.isnan(number) or low_bad or high_bad:
            if 1 < number <= 100:
                hint = f"rates are fractions, not percentages: write {number / 100:g} for {number:g} %"
            else:
                hint = f"write a number such as {example}"
            raise _Invalid(expected, value, hint)
        return number

    return check


def _optional(check: Callable[[Any], Any], none_means: str) -> Callable[[Any], Any]:
    def checked(value: Any) -> Any:
        if value is None:
            return None
        try:
            return check(value)
        except _Invalid as exc:
            expected = f"{exc.expected} or null ({none_means})"
            raise _Invalid(expected, exc.value, exc.hint, exc.prefix) from None

    return checked


def _path(value: Any) -> str:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip():
        raise _Invalid("a file system path (a non-empty string)", value, "give the path, or remove the key")
    return value


def _choice(options: tuple[str, ...], allow_none: bool = False) -> Callable[[Any], str | None]:
    expected = "one of " + ", ".join(repr(o) for o in options) + (", null" if allow_none else "")

    def check(value: Any) -> str | None:
        if value is None and allow_none:
            return None
        if isinstance(value, str) and value in options:
            return value
        near = _did_you_mean(value, options).strip(" ()") if isinstance(value, str) else ""
        raise _Invalid(expected, value, near or "pick one of these")

    return check


def _batch_size(value: Any) -> int | str:
    if isinstance(value, str) and value == "auto":
        return value
    try:
        return _int(1)(value)
    except _Invalid:
        hint = "write e.g. 32, or 'auto' to find the largest batch that fits"
        raise _Invalid("a positive integer or 'auto'", value, hint) from None


def _stop(value: Any) -> list[str]:
    expected = 'a list of non-empty strings, e.g. ["\\n"]'
    if isinstance(value, str):
        raise _Invalid(expected, value, f"write a single stop string as a list: [{value!r}]")
    if not isinstance(value, (list, tuple)):
        raise _Invalid(expected, value, 'remove the key to use the default ["\\n"]')
    for i, item in enumerate(value):
        if not isinstance(item, str) or item == "":
            hint = "remove it or give the text generation should stop at"
            raise _Invalid("a non-empty string", item, hint, prefix=f"item {i}: ")
    return list(value)


def _categories(value: Any) -> dict[str, float]:
    if not isinstance(value, Mapping):
        raise _Invalid("a mapping of category name to rate in [0, 1], e.g. {math: 0.05}", value,
                       "remove the key for no per-category thresholds")
    rate = _rate(False, False, "0.05")
    cleaned: dict[str, float] = {}
    for category, threshold in value.items():
        if not isinstance(category, str) or not category:
            raise _Invalid("category names as non-empty strings", category,
                           "quote the name in YAML, e.g. '2024': 0.05")
        try:
            cleaned[category] = rate(threshold)
        except _Invalid as exc:
            raise _Invalid(exc.expected, exc.value, exc.hint, prefix=f"category {category!r}: ") from None
    return cleaned


_CHECKS: dict[str, Callable[[Any], Any]] = {
    "probes": _optional(_path, "passing probes to the callback directly"),
    "eval_steps": _optional(_int(1), "the cost-budget schedule"),
    "max_overhead": _rate(True, True, "0.05 for 5 % of wall time"),
    "eval_on_evaluate": _bool,
    "eval_on_train_end": _bool,
    "max_forgetting": _optional(_rate(False, False, "0.05 to stop above 5 % forgetting"), "no early stop"),
    "stop_metric": _choice(STOP_METRICS),
    "patience": _int(1),
    "significance": _bool,
    "category_max_forgetting": _categories,
    "save_on_stop": _bool,
    "output_dir": _optional(_path, "<trainer output_dir>/forgetwatch"),
    "base": _optional(lambda v: v if v == ADAPTER_DISABLED else _path(v), "computing the base snapshot"),
    "batch_size": _batch_size,
    "normalize": _choice(NORMALIZE_MODES, allow_none=True),
    "chat_template": _bool,
    "max_new_tokens": _int(1),
    "stop": _stop,
    "log_categories": _bool,
    "verbose": _bool,
}


def _check_values(
    values: Mapping[str, Any], source: str, lines: Mapping[str, int]
) -> tuple[dict[str, Any], list[ConfigProblem]]:
    """Check each known field; return the normalised values and every problem found."""
    cleaned: dict[str, Any] = {}
    problems: list[ConfigProblem] = []
    for name, value in values.items():
        try:
            cleaned[name] = _CHECKS[name](value)
        except _Invalid as exc:
            problems.append(ConfigProblem(source, lines.get(name), name, str(exc)))
    return cleaned, problems


def _resolve(path: str, folder: Path) -> str:
    # No normpath: collapsing ".." past a symlink would point somewhere else.
    expanded = Path(os.path.expanduser(path))
    return str(expanded if expanded.is_absolute() else folder / expanded)


# --- YAML ----------------------------------------------------------------------------------


class _Dumper(yaml.SafeDumper):
    """SafeDumper writing strings with newlines or other control characters double-quoted.

    The default would write ``"\\n"`` as a quoted scalar broken over two lines: valid, but
    hard to read and easy to break by hand.
    """


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = '"' if any(ch < " " or ch == "\x7f" for ch in value) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


def _parse_yaml(text: str, source: str) -> tuple[yaml.Node | None, Any]:
    """Parse once, keeping the node tree (for line numbers) and the plain data."""
    loader = yaml.SafeLoader(text)
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
            message = (f"YAML syntax error: {what}{column}; fix the YAML at that spot "
                       "(indentation, a missing ':' or an unclosed bracket or quote)")
        raise ConfigError([ConfigProblem(source, line, None, message)]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([ConfigProblem(source, None, None, f"YAML error: {exc}")]) from None
    finally:
        loader.dispose()
    return node, data


def _key_lines(node: yaml.Node | None) -> dict[str, list[int]]:
    """1-based line numbers of each string key of a mapping node (several if repeated)."""
    lines: dict[str, list[int]] = {}
    if isinstance(node, yaml.MappingNode):
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                lines.setdefault(str(key_node.value), []).append(key_node.start_mark.line + 1)
    return lines


def _value_node(node: yaml.Node | None, key: str) -> yaml.Node | None:
    """The node of ``key``'s value in a mapping node (the last one if the key repeats)."""
    found = None
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.value == key:
                found = value_node
    return found


def options_doc() -> str:
    return ""
