"""forgetwatch's settings as a training framework carries them (``forgetwatch_<key>`` in its YAML,
``FORGETWATCH_<KEY>`` in the environment; see docs/frameworks.md), checked before any model work."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch.utils.data import get_worker_info

from forgetwatch.common.problems import Problem
from forgetwatch.common.text import describe, did_you_mean, first_line
from forgetwatch.config import FLAT_KEYS, PATH_KEYS, ConfigError, ForgetWatchConfig, from_flat_keys, resolved_path
from forgetwatch.config.yaml_files import read_value, yaml11_misreadings
from forgetwatch.integrations.callback import ForgetWatchCallback
from forgetwatch.merge import MergeAtEnd
from forgetwatch.merge.at_end import OPTIONS as MERGE_OPTIONS
from forgetwatch.merge.sweep import read_texts
from forgetwatch.probes import ProbeSet
from forgetwatch.probes.lm_eval_tasks import LmEvalProbes
from forgetwatch.probes.probe_set import as_probe_set
from forgetwatch.replay import Replay, ReplayPool
from forgetwatch.replay.replay import ReplayOptions, checked_options

KEY_PREFIX, ENV_PREFIX = "forgetwatch_", "FORGETWATCH_"
#: MergeAtEnd's settings, as merge_<option>: a target (texts or probes, a file) and its options
MERGE = ("target_texts", "target_probes", "keep", "alphas", "by_layer", "save")
#: every setting a framework may give, without its prefix: the config's flat keys, then the frameworks' own
NAMES = (
    *FLAT_KEYS,
    "config",
    "replay",
    *(f"replay_{name}" for name in ReplayOptions.model_fields),
    *(f"merge_{name}" for name in MERGE),
)
#: the settings that are file paths: a relative one is taken from the folder of the file that names it
PATHS = (*PATH_KEYS, "config", "replay", "merge_target_texts", "merge_target_probes")
#: how each source spells its settings: a framework config's keys, the environment's variables
_SPELLING = {KEY_PREFIX: ("keys", str.lower), ENV_PREFIX: ("environment variables", str.upper)}


@dataclass(frozen=True)
class FrameworkSettings:
    """A checked config, its loaded probes and replay pool: what a framework's plugin adds a callback with."""

    config: ForgetWatchConfig
    probes: ProbeSet
    replay: Replay | None = None
    merge: MergeAtEnd | None = None

    @classmethod
    def from_keys(
        cls, values: Mapping[str, Any], source: str, config_file: str | os.PathLike[str] | None = None
    ) -> FrameworkSettings:
        """From the ``forgetwatch_*`` keys of a framework's config; ``config_file``, the file it read them from:
        relative paths are taken from its folder (else from the working directory), and in a YAML file a value
        YAML 1.1 reads otherwise than YAML 1.2 (``010`` as 8) is an error naming its line."""
        given, problems = _prefixed(values, KEY_PREFIX, source)
        yaml_file = None if config_file is None or str(config_file).lower().endswith(".json") else config_file
        for key, (line, text, old) in (yaml11_misreadings(yaml_file) if yaml_file is not None else {}).items():
            if key.startswith(KEY_PREFIX) and key[len(KEY_PREFIX) :] in given and values[key] == old:  # not overridden
                message = (
                    f"the framework reads {text} as {json.dumps(old)} (YAML 1.1: a leading 0 is octal, a colon "
                    f"base 60, yes/no/on/off true/false); write {json.dumps(old)} if you mean that, or quote text"
                )
                problems.append(Problem(str(yaml_file), line, key, message))
        folder = None if config_file is None else Path(config_file).absolute().parent
        return cls._build(given, problems, KEY_PREFIX, source, folder)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> FrameworkSettings:
        """From ``FORGETWATCH_*`` environment variables, read as YAML values (paths as text)."""
        given, problems = _prefixed(os.environ if environ is None else environ, ENV_PREFIX, "environment")
        return cls._build(given, problems, ENV_PREFIX, "environment")

    @classmethod
    def _build(
        cls, given: dict[str, Any], problems: list[Problem], prefix: str, source: str, folder: Path | None = None
    ) -> FrameworkSettings:
        def named(name: str) -> str:
            return _SPELLING[prefix][1](prefix + name)

        def located(path: Any) -> Any:  # from the file that names it, as the paths in a forgetwatch_config file are
            return path if folder is None else resolved_path(path, folder)

        def problem(name: str, message: str) -> None:
            problems.append(Problem(source, None, named(name), message))

        for name in [name for name in given if name not in NAMES]:
            match = did_you_mean(name, NAMES)
            problem(name, f"unknown key{f' (did you mean {named(match)!r}?)' if match else ''}; fix or remove it")
            del given[name]
        config_path, replay_path = given.pop("config", None), given.pop("replay", None)
        for name, value in (("config", config_path), ("replay", replay_path)):
            if value is not None and not isinstance(value, (str, os.PathLike)):
                problem(name, f"expected a file path, got {describe(value)}")
        replay_options = {}
        for name in ReplayOptions.model_fields:
            if (value := given.pop(f"replay_{name}", None)) is not None:
                try:
                    checked_options(**{name: value})
                    replay_options[name] = value
                except ValueError as err:  # a ConfigError, or a retired value
                    problem(f"replay_{name}", err.errors[0].message if isinstance(err, ConfigError) else str(err))
        if replay_options and replay_path is None:
            pool = f"replay options need a pool: set {named('replay')} to a replay pool file"
            problem(f"replay_{next(iter(replay_options))}", pool)
        merge = _merge_at_end({name: given.pop(f"merge_{name}") for name in MERGE if f"merge_{name}" in given}, located)
        if isinstance(merge, Problem):
            problem(merge.key, merge.message)
            merge = None
        if isinstance(given.get("probes"), list):  # lm-eval task names
            given["probes"] = {"lm_eval": given["probes"]}
        if problems:
            raise ConfigError(problems)
        file = ForgetWatchConfig.from_yaml(located(config_path)) if config_path is not None else ForgetWatchConfig()
        try:  # the keys over the file's settings
            config = from_flat_keys({**file.flat(), **given}, source, relative_to=folder)
        except ConfigError as err:  # named as the user wrote them
            raise ConfigError(
                [Problem(source, None, named(p.key) if p.key else None, p.message) for p in err.errors]
            ) from None
        if config.probes is None:
            message = f"no probes: set {named('probes')} (a probe file or lm-eval task names)"
            where = f" or give probes in the file {named('config')} names" if config_path is None else ""
            raise ConfigError([Problem(source, None, named("probes"), message + where)])
        probes = as_probe_set(config.probes)
        replay = None
        if replay_path is not None:
            replay = Replay(ReplayPool.from_jsonl(located(replay_path)), **replay_options)
            replay.hold_out(probes)
        return cls(config, probes, replay, merge)

    def callback(self, trainer: Any = None) -> ForgetWatchCallback:
        settings = {**dict(self.config), "probes": self.probes}
        return ForgetWatchCallback(**settings, replay=self.replay, merge_at_end=self.merge, trainer=trainer)

    def describe(self, framework: str) -> str:
        """The plugin's first console line: it loaded, and what it will do."""
        config = self.config
        probes, steps, limit = config.probes, config.eval_steps, config.max_forgetting
        what = f"lm-eval: {', '.join(probes.tasks)}" if isinstance(probes, LmEvalProbes) else probes
        when = f"every {steps} steps" if steps else f"within a {config.monitor.max_overhead:.0%} time budget"
        stop = f", stopping above {limit:.1%} forgetting" if limit is not None else ""
        replay = f", replaying {len(self.replay.pool)} rows" if self.replay is not None else ""
        merge = ", merging with the base at the end" if self.merge is not None else ""
        return (
            f"[forgetwatch] {framework} plugin loaded: {len(self.probes)} probes ({what}), evaluating "
            f"{when}{stop}{replay}{merge}; results in the run's output_dir/forgetwatch"
        )


def _merge_at_end(given: dict[str, Any], located: Callable[[Any], Any]) -> MergeAtEnd | Problem | None:
    """The merge_* settings as a MergeAtEnd, or the problem with them (its key without the prefix)."""
    if not given:
        return None
    targets = [f"merge_{name}" for name in ("target_texts", "target_probes") if name in given]
    if len(targets) != 1:
        first = f"merge_{next(iter(given))}"
        what = "one target, not both" if targets else "a target"
        return Problem("", None, first, f"merging at the end needs {what}: merge_target_texts or merge_target_probes")
    key = targets[0]
    path = given.pop(key.removeprefix("merge_"))
    for name, value in given.items():  # each option named as given, not as the target
        try:
            MERGE_OPTIONS[name](value)
        except (TypeError, ValueError) as err:
            return Problem("", None, f"merge_{name}", first_line(err))
    try:
        path = located(path)
        target = read_texts(path) if key == "merge_target_texts" else ProbeSet.from_jsonl(path)
        return MergeAtEnd(target, **given)
    except (OSError, TypeError, ValueError) as err:
        return Problem("", None, key, first_line(err))


def _prefixed(values: Mapping[str, Any], prefix: str, source: str) -> tuple[dict[str, Any], list[Problem]]:
    """The settings in ``values`` by name, and the problems of those misspelt or (environment) empty."""
    what, case = _SPELLING[prefix]
    given: dict[str, Any] = {}
    problems: list[Problem] = []
    for key, value in values.items():
        if not (isinstance(key, str) and case(key).startswith(prefix)):
            continue
        name = key[len(prefix) :].lower()
        if key != case(key):
            known = name if name in NAMES else did_you_mean(name, NAMES) or name
            message = f"forgetwatch's {what} are {case.__name__} case: write {case(prefix + known)!r}"
            problems.append(Problem(source, None, key, message))
        elif prefix == KEY_PREFIX:
            given[name] = value
        elif not value.strip():
            message = "is set but empty; give it a value (null for the default), or unset it"
            problems.append(Problem(source, None, key, message))
        elif name in PATHS and not value.lstrip().startswith(("[", "{")):
            given[name] = value  # paths stay text unless a list or mapping is written (lm-eval tasks)
        else:
            try:
                given[name] = read_value(value, source)
            except ConfigError as err:
                problems += [Problem(source, None, key, p.message) for p in err.errors]
    return given, problems


def main_process() -> bool:
    """Whether this is the launch's first process, not a data loader's worker (plugins load before torch.distributed)."""
    return os.environ.get("RANK", "0") == "0" and get_worker_info() is None
