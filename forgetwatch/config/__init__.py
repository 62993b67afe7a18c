"""Settings for :class:`~forgetwatch.Watch` and :class:`~forgetwatch.ForgetWatchCallback` from a YAML file or a
dict: flat keys (``eval_steps``, ``stop_metric``), at the top level or under a ``forgetwatch:`` key."""

from __future__ import annotations

import copy
import functools
import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, fields, replace
from pathlib import Path
from typing import Any

from forgetwatch.common.problems import Problem
from forgetwatch.common.text import describe, did_you_mean, suggestion
from forgetwatch.config import checks as check
from forgetwatch.config.checks import ConfigError, check_values
from forgetwatch.config.settings import Monitor, Output, Scoring, _Group, flat_key, option
from forgetwatch.config.yaml_files import read_section, write_settings
from forgetwatch.probes.lm_eval_tasks import LmEvalProbes

__all__ = ["FLAT_KEYS", "ConfigError", "ForgetWatchConfig"]

#: Settings holding file system paths (flat keys): resolved against the YAML file's folder when relative.
PATH_KEYS = ("probes", "base", "output_dir")
ADAPTER_DISABLED = "adapter_disabled"  # the one value of ``base`` that is not a path


def _base(value: Any) -> str:
    return value if value == ADAPTER_DISABLED else check.path(value)


def _probes(value: Any) -> str | LmEvalProbes:
    """A probe file's path, or lm-eval tasks: ``{lm_eval: [names], num_fewshot: 5, ...}``."""
    if isinstance(value, LmEvalProbes):
        return value
    if isinstance(value, Mapping):
        try:
            return LmEvalProbes.from_mapping(value)
        except ValueError as err:
            raise check.Invalid(
                "a probe file path, or lm-eval tasks as {lm_eval: [...], ...}", value, str(err)
            ) from None
    return check.path(value)


def _group(group: type) -> Callable[[Any], Any]:
    def check_group(value: Any) -> Any:
        if value is None:
            return group()
        if not isinstance(value, group):
            raise check.Invalid(f"a {group.__name__}", value, f"write {group.__name__.lower()}={group.__name__}(...)")
        return value

    return check_group


def checked_keywords(init: Callable[..., None]) -> Callable[..., None]:
    """``init`` refusing a keyword it does not take with :func:`unknown_keyword`'s ``TypeError``."""
    signature = inspect.signature(init)

    @functools.wraps(init)
    def checked(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            signature.bind(self, *args, **kwargs)
        except TypeError as err:
            unknown = next((k for k in kwargs if k not in signature.parameters), None)
            if unknown is None:
                raise
            raise unknown_keyword(type(self).__name__, unknown, list(signature.parameters)[1:]) from err
        init(self, *args, **kwargs)

    return checked


def unknown_keyword(source: str, key: str, keywords: Sequence[str]) -> TypeError:
    """The error for ``source(key=...)``: it names the group a setting belongs to, or the nearest keyword."""
    match = did_you_mean(key, [*keywords, *_GROUPED])
    if grouped := _grouped_as(key):
        hint = f": write {grouped}"
    elif match in keywords:
        hint = f" (did you mean {match!r}?)"
    else:
        hint = f" (did you mean {_grouped_as(match)}?)" if match else ""
    return TypeError(f"{source}() got an unexpected keyword argument {key!r}{hint}")


@dataclass(frozen=True)
class ForgetWatchConfig(_Group):
    """A run's settings as a file holds them, checked on construction (:class:`ConfigError`) and immutable
    (:meth:`replace` makes a checked copy). ``ForgetWatchCallback.from_config(config)`` builds a run from one.

    Attributes:
        probes: Path to a probe JSONL file, or lm-eval tasks (``{lm_eval: [...], ...}``).
        base: A saved base answers snapshot (.json/.npz), or "adapter_disabled": score the PEFT model with
            its adapters disabled whenever training begins or resumes.
        eval_steps: Evaluate every N optimizer steps; None: as often as ``max_overhead`` allows.
        max_forgetting: Stop training once the forgetting rate exceeds this (0..1); None: never stop.
        output_dir: Where the base snapshot and history live; None: ``<trainer output_dir>/forgetwatch``.
        scoring: How probes are scored (:class:`~forgetwatch.Scoring`).
        monitor: When else to evaluate, what else to measure, when to stop (:class:`~forgetwatch.Monitor`).
        output: Where results go, how much is logged (:class:`~forgetwatch.Output`).

    Example:
        >>> cfg = ForgetWatchConfig.from_dict({"eval_steps": 50, "max_forgetting": 0.05, "patience": 2})
        >>> cfg.eval_steps, cfg.max_forgetting, cfg.monitor.patience, cfg.scoring.stop
        (50, 0.05, 2, ['\\n'])
    """

    probes: str | os.PathLike[str] | LmEvalProbes | None = option(
        None, check=check.optional(_probes, "passing probes to the callback directly")
    )
    _: KW_ONLY
    base: str | os.PathLike[str] | None = option(None, check=check.optional(_base, "computing the base snapshot"))
    eval_steps: int | None = option(None, check=check.optional(check.integer(1), "the cost-budget schedule"))
    max_forgetting: float | None = option(
        None, check=check.optional(check.rate(False, False, "0.05 to stop above 5 % forgetting"), "no early stop")
    )
    output_dir: str | os.PathLike[str] | None = option(
        None, check=check.optional(check.path, "<trainer output_dir>/forgetwatch")
    )
    scoring: Scoring = option(check=_group(Scoring), factory=Scoring)
    monitor: Monitor = option(check=_group(Monitor), factory=Monitor)
    output: Output = option(check=_group(Output), factory=Output)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "<dict>") -> ForgetWatchConfig:
        """Build a config from flat keys (what :meth:`to_dict` writes); every problem is reported in one
        :class:`ConfigError` whose lines start with ``source``. Paths are kept as given.

        Example:
            >>> ForgetWatchConfig.from_dict({"eval_steps": 50, "patience": 3}).monitor.patience
            3
        """
        return cls._from_mapping(data, source, lines={}, relative_to=None)

    def replace(self, **changes: Any) -> ForgetWatchConfig:
        """A checked copy with ``changes``: a flat key changes one setting, a group object the whole group.

        Example:
            >>> ForgetWatchConfig(eval_steps=50).replace(patience=2).monitor.patience
            2
        """
        data = self.to_dict()
        for name in changes.keys() & GROUPS.keys():
            for f in fields(GROUPS[name]):
                del data[flat_key(f)]
        return type(self)._from_mapping({**data, **changes}, "replace()", {}, None)

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str], **overrides: Any) -> ForgetWatchConfig:
        """Load a config from a YAML file (its top level, or its ``forgetwatch:`` key); ``overrides`` (as for
        :meth:`replace`) win. Relative paths are taken from the file's folder; ``~`` is expanded.

        Raises:
            FileNotFoundError: the file does not exist.
            ConfigError: malformed YAML (naming the line), anchors or aliases, over 1 MiB, or an invalid value.

        Example:
            >>> ForgetWatchConfig.from_yaml("configs/early_stop_adjusted_5pct.yaml", patience=5).monitor.patience
            5
        """
        data, lines, problems = read_section(path, FLAT_KEYS)
        cfg = cls._from_mapping(data, str(path), lines, Path(path).absolute().parent, problems)
        return cfg.replace(**overrides) if overrides else cfg

    @classmethod
    def _from_mapping(
        cls,
        data: Mapping[str, Any],
        source: str,
        lines: Mapping[str, int],
        relative_to: Path | None,
        problems: Sequence[Problem] = (),
    ) -> ForgetWatchConfig:
        if not isinstance(data, Mapping):
            message = f"expected a mapping of forgetwatch settings, got {describe(data)}"
            raise ConfigError([Problem(source, None, None, message)])
        flat, found = _flatten(data, source, lines)
        own, value_problems = check_values(flat, _CHECKS, source, lines)  # in the order the settings were given
        if problems := [*problems, *found, *value_problems]:
            raise ConfigError(problems)
        groups: dict[str, dict[str, Any]] = {name: {} for name in GROUPS}
        for key in own.keys() & _GROUPED.keys():
            group, name = _GROUPED[key]
            groups[group][name] = own.pop(key)
        if relative_to is not None:
            for key in PATH_KEYS:
                if key in own:
                    own[key] = resolved_path(own[key], relative_to)
        return cls(**own, **{name: GROUPS[name](**values) for name, values in groups.items()})

    def keywords(self) -> dict[str, Any]:
        """The settings as keywords of :class:`~forgetwatch.Watch` and the callback (``probes`` when named)."""
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "probes"}
        return own if self.probes is None else {"probes": self.probes, **own}

    def check_categories(self, categories: Sequence[str]) -> None:
        """Refuse per-category thresholds and groups for categories the probes lack (a typo would leave its guard off).

        Example:
            >>> cfg = ForgetWatchConfig(monitor=Monitor(category_max_forgetting={"mth": 0.1}))
            >>> cfg.check_categories(["math"])  # doctest: +ELLIPSIS
            Traceback (most recent call last):
                ...
            forgetwatch.config.checks.ConfigError: ForgetWatchCallback: key 'category_max_forgetting': names categories ...
        """
        problems = []
        for key, named in (
            ("category_max_forgetting", self.monitor.category_max_forgetting),
            ("category_map", self.output.category_map),
        ):
            if unknown := sorted(set(named) - set(categories)):
                message = (
                    f"names categories the probes do not have: {', '.join(map(repr, unknown))}; "
                    f"they have {', '.join(map(repr, categories))}"
                )
                problems.append(Problem("ForgetWatchCallback", None, key, message))
        if problems:
            raise ConfigError(problems)

    def to_dict(self) -> dict[str, Any]:
        """Every setting by its flat key, as plain values (YAML/JSON-ready): what :meth:`from_dict` reads.

        Example:
            >>> ForgetWatchConfig(eval_steps=50).to_dict()["eval_steps"]
            50
        """
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in GROUPS}
        for name, group in GROUPS.items():
            values.update((flat_key(f), getattr(getattr(self, name), f.name)) for f in fields(group))
        return {k: v.to_dict() if isinstance(v, LmEvalProbes) else copy.copy(v) for k, v in values.items()}

    def to_yaml(self, path: str | os.PathLike[str]) -> None:
        """Write the config as a flat YAML file (atomically), relative paths made absolute, for :meth:`from_yaml`.

        Example:
            >>> ForgetWatchConfig(eval_steps=50).to_yaml("/tmp/forgetwatch.yaml")
            >>> ForgetWatchConfig.from_yaml("/tmp/forgetwatch.yaml").eval_steps
            50
        """
        resolved = {key: resolved_path(getattr(self, key), Path.cwd()) for key in PATH_KEYS}
        write_settings(self.replace(**resolved).to_dict(), path)


ForgetWatchConfig.__init__ = checked_keywords(ForgetWatchConfig.__init__)  # type: ignore[method-assign]
#: the groups, by their field of ForgetWatchConfig
GROUPS: dict[str, type[Any]] = {"scoring": Scoring, "monitor": Monitor, "output": Output}
#: the config's own settings (probes, base): their checks
_OWN: dict[str, Callable[[Any], Any]] = {
    f.name: f.metadata["check"] for f in fields(ForgetWatchConfig) if f.name not in GROUPS
}
#: every group setting's flat key -> (group, field): the one key table
_GROUPED: dict[str, tuple[str, str]] = {
    flat_key(f): (name, f.name) for name, group in GROUPS.items() for f in fields(group)
}
#: every flat key's check: the config's own settings, then the groups'
_CHECKS = {**_OWN, **{flat_key(f): f.metadata["check"] for group in GROUPS.values() for f in fields(group)}}
#: every setting's one name in files (``eval_steps``, ``stop_metric``), in declaration order
FLAT_KEYS: tuple[str, ...] = tuple(_CHECKS)


def _grouped_as(key: str) -> str | None:
    """Where a flat key is set in code, e.g. ``monitor=Monitor(patience=...)``."""
    if key not in _GROUPED:
        return None
    group, name = _GROUPED[key]
    return f"{group}={GROUPS[group].__name__}({name}=...)"


def _flatten(data: Mapping[Any, Any], source: str, lines: Mapping[str, int]) -> tuple[dict[str, Any], list[Problem]]:
    """Settings by flat key (group objects taken apart), and the problems found."""
    flat: dict[str, Any] = {}
    written: dict[str, str] = {}
    problems: list[Problem] = []

    def add(key: str, as_written: str, value: Any) -> None:
        if key in flat:
            message = f"given twice, as {written[key]!r} and as {as_written!r}; keep one"
            problems.append(Problem(source, lines.get(as_written), as_written, message))
        flat[key], written[key] = value, as_written

    for key, value in data.items():
        if not isinstance(key, str):
            message = f"key {describe(key)} is not a string; write setting names such as 'eval_steps'"
            problems.append(Problem(source, None, None, message))
        elif key in GROUPS and isinstance(value, GROUPS[key]):
            for f in fields(value):
                add(flat_key(f), f"{key}.{f.name}", getattr(value, f.name))
        elif key in _OWN or key in _GROUPED:
            add(key, key, value)
        elif key in GROUPS:
            message = f"write each of its settings as a key of its own (e.g. {flat_key(fields(GROUPS[key])[0])}: ...)"
            problems.append(Problem(source, lines.get(key), key, message))
        else:
            hint = suggestion(key.rpartition(".")[2], FLAT_KEYS) or f" (known keys: {', '.join(FLAT_KEYS)})"
            problems.append(Problem(source, lines.get(key), key, f"unknown key{hint}; fix or remove it"))
    return flat, problems


def resolved_path(value: Any, folder: Path) -> Any:
    """A path setting with a relative path taken from ``folder`` (for lm-eval tasks, their task folder)."""
    if isinstance(value, LmEvalProbes):
        return (
            value
            if value.include_path is None
            else replace(value, include_path=resolved_path(value.include_path, folder))
        )
    if value in (None, ADAPTER_DISABLED):
        return value
    expanded = Path(os.path.expanduser(value))  # no normpath: ".." past a symlink would point elsewhere
    return str(expanded if expanded.is_absolute() else folder / expanded)
