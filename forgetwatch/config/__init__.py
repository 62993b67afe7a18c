"""A run's settings (:class:`ForgetWatchConfig`), and their one YAML form: flat keys, each a field's name
(``eval_steps: 50``, ``patience: 2``)."""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, InstanceOf, PlainValidator

from forgetwatch.common.problems import Problem
from forgetwatch.common.text import suggestion
from forgetwatch.config.settings import (
    GROUPS,
    ConfigError,
    Count,
    FilePath,
    Monitor,
    Output,
    Scoring,
    Settings,
    Share,
    checked_path,
    unknown_keyword,
)
from forgetwatch.config.yaml_files import read_settings
from forgetwatch.probes.lm_eval_tasks import LmEvalProbes

__all__ = ["FLAT_KEYS", "ConfigError", "ForgetWatchConfig"]

#: Settings holding file system paths: resolved against the YAML file's folder when relative.
PATH_KEYS = ("probes", "base", "output_dir")
ADAPTER_DISABLED = "adapter_disabled"  # the one value of ``base`` that is not a path


def _probes(value: Any) -> str | LmEvalProbes | None:
    """A probe file's path, or lm-eval tasks: ``{lm_eval: [names], num_fewshot: 5, ...}``."""
    if isinstance(value, Mapping):
        return LmEvalProbes.from_mapping(value)  # a ValueError names the key
    if value is None or isinstance(value, LmEvalProbes):
        return value
    value = os.fspath(value) if isinstance(value, os.PathLike) else value
    if not isinstance(value, str):
        raise ValueError("expected a probe file path, or lm-eval tasks as {lm_eval: [...], ...}")
    return checked_path(value)


class ForgetWatchConfig(Settings):
    """A run's settings, checked when built and immutable: ``watch.config``.

    Example:
        >>> cfg = ForgetWatchConfig.from_yaml("configs/early_stop_adjusted_5pct.yaml")
        >>> cfg.max_forgetting, cfg.monitor.patience, cfg.scoring.stop
        (0.05, 2, ('\\n',))
    """

    probes: Annotated[str | LmEvalProbes | None, PlainValidator(_probes)] = None
    """A probe JSONL file's path, or lm-eval tasks (``{lm_eval: [...], ...}``); None: probes given directly."""
    base: FilePath | None = None
    """A saved base answers snapshot (.json/.npz), or "adapter_disabled" (the PEFT model, adapters off); None: the
    model's answers when training begins."""
    eval_steps: Count | None = None
    """Evaluate every N optimizer steps; None: as often as ``max_overhead`` allows."""
    max_forgetting: Share | None = None
    """Stop training once the forgetting rate exceeds this (0..1, e.g. 0.05); None: never stop."""
    output_dir: FilePath | None = None
    """Where the base snapshot and history live; None: ``<trainer output_dir>/forgetwatch``."""
    scoring: InstanceOf[Scoring] = Field(default_factory=Scoring)
    """How probes are scored (:class:`~forgetwatch.Scoring`)."""
    monitor: InstanceOf[Monitor] = Field(default_factory=Monitor)
    """When else to evaluate, what else to measure, when to stop (:class:`~forgetwatch.Monitor`)."""
    output: InstanceOf[Output] = Field(default_factory=Output)
    """Where results go, how much is logged (:class:`~forgetwatch.Output`)."""

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str]) -> ForgetWatchConfig:
        """The settings of a YAML file of flat keys; relative paths are taken from the file's folder, ``~`` expanded.

        Raises:
            ConfigError: every problem (bad YAML, an unknown key, an invalid value), naming file, line and key.
        """
        data, lines = read_settings(path)
        return from_flat_keys(data, str(path), lines, Path(path).absolute().parent)

    def flat(self) -> dict[str, Any]:
        """Every setting by its key in a file (what :func:`from_flat_keys` reads)."""
        own = {key: value for key, value in self if key not in GROUPS}
        return own | {key: value for name in GROUPS for key, value in getattr(self, name)}

    def check_categories(self, categories: Sequence[str]) -> None:
        """Refuse per-category thresholds and groups for categories the probes lack (a typo would switch them off)."""
        have, problems = ", ".join(map(repr, categories)), []
        for key, group in (("category_max_forgetting", self.monitor), ("category_map", self.output)):
            if unknown := sorted(set(getattr(group, key)) - set(categories)):
                said = f"names categories the probes do not have: {', '.join(map(repr, unknown))}; they have {have}"
                problems.append(Problem("ForgetWatchCallback", None, key, said))
        if problems:
            raise ConfigError(problems)


#: the config's own settings (probes, base, ...), then every group's: each setting's one key in files
OWN_KEYS = tuple(key for key in ForgetWatchConfig.model_fields if key not in GROUPS)
FLAT_KEYS: tuple[str, ...] = (*OWN_KEYS, *(key for group in GROUPS.values() for key in group.model_fields))


def from_flat_keys(
    data: Mapping[Any, Any], source: str, lines: Mapping[Any, int] | None = None, relative_to: Path | None = None
) -> ForgetWatchConfig:
    """A config from flat keys, as a file or a framework's keys give them: every problem in one :class:`ConfigError`,
    each naming ``source``, its key and the key's line; relative paths taken from the folder ``relative_to``."""
    lines = lines or {}
    found = [Problem(source, lines.get(key), str(key), _unknown(str(key))) for key in data if key not in FLAT_KEYS]
    parts: dict[str, Any] = {}
    for name, group in [("", ForgetWatchConfig), *GROUPS.items()]:
        try:
            parts[name] = group(**{k: v for k, v in data.items() if k in group.model_fields and k not in GROUPS})
        except ConfigError as err:
            found += [p._replace(source=source, line=lines.get(p.key)) for p in err.errors]
    if found:
        raise ConfigError(sorted(found, key=lambda p: p.line or 0))
    config = parts.pop("")
    paths = {key: resolved_path(getattr(config, key), relative_to) for key in PATH_KEYS if relative_to and key in data}
    return config.model_copy(update={**parts, **paths})


def _unknown(key: str) -> str:
    if key in GROUPS:
        example = next(iter(GROUPS[key].model_fields))
        return f"is a group: write each of its settings as a key of its own (e.g. {example}: ...)"
    hint = suggestion(key, FLAT_KEYS) or f" (known keys: {', '.join(FLAT_KEYS)})"
    return f"unknown key{hint}; fix or remove it"


def checked_keywords(init: Callable[..., None]) -> Callable[..., None]:
    """``init`` (which takes no ``**kwargs``) refusing a keyword it does not take with :func:`unknown_keyword`'s
    ``TypeError``."""
    parameters = list(inspect.signature(init).parameters)[1:]

    @functools.wraps(init)
    def checked(self: Any, *args: Any, **kwargs: Any) -> None:
        if unknown := next((k for k in kwargs if k not in parameters), None):
            raise unknown_keyword(type(self).__name__, unknown, parameters)
        init(self, *args, **kwargs)

    return checked


def resolved_path(value: Any, folder: Path) -> Any:
    """A path setting with a relative path taken from ``folder`` (for lm-eval tasks, their task folder)."""
    if isinstance(value, LmEvalProbes) and value.include_path is not None:
        return value.model_copy(update={"include_path": resolved_path(value.include_path, folder)})
    if value is None or value == ADAPTER_DISABLED or isinstance(value, LmEvalProbes):
        return value
    expanded = Path(os.path.expanduser(value))  # no normpath: ".." past a symlink would point elsewhere
    return str(expanded if expanded.is_absolute() else folder / expanded)
