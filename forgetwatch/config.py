"""Settings for :class:`~forgetwatch.callback.ForgetWatchCallback`, from code or a YAML file.

A config file is a YAML mapping of the fields of :class:`ForgetWatchConfig`, either on its own
or under a top-level ``forgetwatch:`` key of a bigger training config::

    # train.yaml
    learning_rate: 2.0e-5          # not ours: ignored
    forgetwatch:
      probes: probes/general_knowledge.jsonl   # relative paths are relative to this file
      eval_steps: 50
      max_forgetting: 0.05

Each setting is declared once, as a field carrying its default, its check and its help text.
Every value is checked when the config is built, in code as well as from a file, and all the
problems found are reported together in one :class:`ConfigError`. The checks live in
:mod:`forgetwatch.config_checks`, reading and writing YAML in :mod:`forgetwatch.config_yaml`.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from . import config_checks as check
from .config_checks import ConfigError, ConfigProblem, check_values
from .config_yaml import read_section, write_settings
from .options import MAX_NEW_TOKENS, NORMALIZE_MODES
from .stopping import STOP_METRICS
from .text import describe, suggestion

__all__ = ["ConfigError", "ConfigProblem", "ForgetWatchConfig", "options_doc", "with_settings"]

#: Fields holding file system paths: resolved against the YAML file's folder when relative.
PATH_FIELDS = ("probes", "base", "output_dir")
ADAPTER_DISABLED = "adapter_disabled"  # the one value of ``base`` that is not a path
_LONGER_THAN_ANY_CONTEXT = f"at most {MAX_NEW_TOKENS}: more than any model's context, which is all a response can use"


def _setting(*, check: Callable[[Any], Any], help: str, **default: Any) -> Any:
    """A config field: its default (``default=`` or ``default_factory=``), the check its value
    must pass, and the help text ``options_doc`` shows: declared once, here."""
    return field(metadata={"check": check, "help": help}, **default)


@dataclass(frozen=True)
class ForgetWatchConfig:
    """What to probe, how often, and when to stop: the settings of ``ForgetWatchCallback``.

    Every value is validated on construction; a wrong one raises :class:`ConfigError`. A
    config is immutable: :meth:`replace` makes a changed, validated copy. The settings, their
    types and defaults are listed by :func:`options_doc` (and below, in ``help()``).

    Example:
        >>> cfg = ForgetWatchConfig(probes="probes.jsonl", eval_steps=50, max_forgetting=0.05)
        >>> cfg.patience, cfg.stop
        (1, ['\\n'])
        >>> ForgetWatchConfig(patience=0)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
            ...
        forgetwatch.config_checks.ConfigError: ForgetWatchConfig: key 'patience': expected an integer >= 1, got 0 (int); ...
    """

    probes: str | None = _setting(
        default=None,
        check=check.optional(check.path, "passing probes to the callback directly"),
        help='Path to a probe JSONL file (the callback also accepts a ProbeSet object directly).')
    eval_steps: int | None = _setting(
        default=None,
        check=check.optional(check.integer(1), "the cost-budget schedule"),
        help='Evaluate every N optimizer steps; None: the cost-budget schedule (see ``max_overhead``).')
    max_overhead: float = _setting(
        default=0.05,
        check=check.rate(True, True, "0.05 for 5 % of wall time", floor=0.001,
                         why="below 0.1 % the schedule would barely evaluate (a tiny share overflows its wait); "
                             "for rare evaluations set eval_steps"),
        help='With the budget schedule, the share of wall time monitoring may take (0.001 <= x < 1).')
    eval_on_evaluate: bool = _setting(
        default=True,
        check=check.boolean,
        help='Also evaluate at every trainer evaluation (adds ``eval_forgetwatch_*`` metrics).')
    eval_on_train_end: bool = _setting(
        default=True,
        check=check.boolean,
        help='Evaluate once more when training ends.')
    max_forgetting: float | None = _setting(
        default=None,
        check=check.optional(check.rate(False, False, "0.05 to stop above 5 % forgetting"), "no early stop"),
        help='Stop training once the forgetting rate exceeds this (0..1); None: never stop.')
    stop_metric: str = _setting(
        default="forgetting",
        check=check.choice(STOP_METRICS),
        help='Which rate ``max_forgetting`` applies to: "forgetting" or "forgetting_adjusted".')
    patience: int = _setting(
        default=1,
        check=check.integer(1),
        help='Consecutive evaluations over the threshold before stopping (>= 1).')
    significance: bool = _setting(
        default=False,
        check=check.boolean,
        help='Stop only when the Wilson 95 % lower bound of the rate is over the threshold.')
    category_max_forgetting: dict[str, float] = _setting(
        default_factory=dict,
        check=check.category_rates,
        help='Per-category thresholds, category -> rate (0..1).')
    at_risk_share: float = _setting(
        default=0.5,
        check=check.rate(True, True, "0.5"),
        help='A still-right probe is at risk once its margin (multiple choice) or its reference answer\'s probability (generative) falls below this share of the base\'s (0 < x < 1).')
    at_risk_floor: float = _setting(
        default=0.1,
        check=check.non_negative,
        help='A still-right multiple-choice probe is also at risk once its margin falls below this many nats (>= 0).')
    noise_check: bool | None = _setting(
        default=None,
        check=check.optional(check.boolean, "on for GPUs and half-precision models"),
        help='Score the base twice, in batches of another size, and report how many probes flip with no weight change: the noise floor of forgetting; None: on for GPUs and half-precision models.')
    replay_loss: str = _setting(
        default="lm",
        check=check.choice(("lm", "kl")),
        help='With replay=: the loss replayed rows add: "lm" (next-token loss on their text) or "kl" (KL from the base model\'s next-token distribution on them, kept once when training begins).')
    replay_top_k: int = _setting(
        default=32,
        check=check.integer(1, 1024, "each costs 6 bytes at every position of every replay row, kept all run: "
                                     "a few dozen carry nearly all of the base's probability"),
        help='With replay_loss="kl": the base\'s most likely next tokens kept per position, the rest as one tail mass (1 to 1024).')
    replay_weight: float | str = _setting(
        default=1.0,
        check=check.weight_or_auto,
        help='With replay=: how much the replay loss counts next to the trainer\'s (0 to 100; 0 replays nothing), or "auto": set at each evaluation to bring forgetting to forgetting_target.')
    forgetting_target: float | None = _setting(
        default=None,
        check=check.optional(check.rate(False, False, "0.05", floor=0.001,
                                        why="the weight moves by the relative miss (forgetting - target) / target: "
                                            "below 0.1 % (0 divides by zero) one forgotten probe would overflow it"),
                             "no target"),
        help='With replay_weight="auto": the forgetting rate (stop_metric) the replay weight steers toward (0.001..1).')
    replay_batch_size: int = _setting(
        default=8,
        check=check.integer(1, 1024, "each row replayed costs a forward and a backward pass before every optimizer "
                                     "step; a few dozen are plenty"),
        help='With replay=: pool rows replayed before each optimizer step (1 to 1024).')
    replay_seed: int = _setting(
        default=0,
        check=check.integer(0),
        help='With replay=: the seed of the draws (the same on every rank).')
    save_on_stop: bool = _setting(
        default=True,
        check=check.boolean,
        help='Ask the trainer for a checkpoint before stopping.')
    output_dir: str | None = _setting(
        default=None,
        check=check.optional(check.path, "<trainer output_dir>/forgetwatch"),
        help='Where the base snapshot and history live; None: ``<trainer output_dir>/forgetwatch``.')
    base: str | None = _setting(
        default=None,
        check=check.optional(lambda v: v if v == ADAPTER_DISABLED else check.path(v), "computing the base snapshot"),
        help='A saved base answers snapshot (.json/.npz) to use instead of computing one; or "adapter_disabled": score the PEFT model with its adapters disabled (LoRA) whenever training begins or resumes, instead of keeping a snapshot.')
    batch_size: int | str = _setting(
        default="auto",
        check=check.batch_size,
        help='Probes per forward pass: a positive integer or "auto".')
    normalize: str | None = _setting(
        default=None,
        check=check.choice(tuple(m for m in NORMALIZE_MODES if m), allow_none=True),
        help='Multiple-choice score normalisation: None (lm-eval ``acc``) or "chars" (``acc_norm``).')
    chat_template: bool = _setting(
        default=False,
        check=check.boolean,
        help="Wrap each question in the tokenizer's chat template.")
    max_new_tokens: int = _setting(
        default=64,
        check=check.integer(1, MAX_NEW_TOKENS, _LONGER_THAN_ANY_CONTEXT),
        help='Generative probes: most tokens to generate (>= 1).')
    stop: list[str] = _setting(
        default_factory=lambda: ["\n"],
        check=check.stop_strings,
        help='Generative probes: generation stops at the first of these strings.')
    behaviour_max_new_tokens: int = _setting(
        default=256,
        check=check.integer(1, MAX_NEW_TOKENS, _LONGER_THAN_ANY_CONTEXT),
        help='Behaviour probes (rows with ``check``): most tokens of a response (>= 1); they run to EOS, ``stop`` does not apply.')
    table_rows: int = _setting(
        default=500,
        check=check.integer(1),
        help='W&B and TensorBoard tables: at most this many rows for each evaluation\'s flips, and in the final table of probes (>= 1).')
    log_categories: bool = _setting(
        default=True,
        check=check.boolean,
        help='Also log ``forgetwatch/<category>/<metric>`` keys.')
    max_logged_categories: int = _setting(
        default=100,
        check=check.integer(1),
        help='With log_categories: per-category keys for at most this many categories, the largest by probe count (each adds about a dozen values per evaluation); every category stays in history.jsonl and the report (>= 1).')
    verbose: bool = _setting(
        default=True,
        check=check.boolean,
        help='Print one console line per evaluation.')

    def __post_init__(self) -> None:
        # Checked here, not only in from_dict, so configs built in code are held to the same rules.
        values = {name: getattr(self, name) for name in _CHECKS}
        cleaned, problems = check_values(values, _CHECKS, "ForgetWatchConfig", {})
        if not problems and cleaned["replay_weight"] == "auto" and cleaned["forgetting_target"] is None:
            problems.append(ConfigProblem("ForgetWatchConfig", None, "forgetting_target",
                                          'replay_weight="auto" steers toward a forgetting rate: give '
                                          "forgetting_target, e.g. 0.05"))
        if problems:
            raise ConfigError(problems)
        # Normalised copies (list/dict copies, ints as floats): the caller's objects are not shared.
        for name, value in cleaned.items():
            object.__setattr__(self, name, value)  # frozen: only construction sets fields

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
            forgetwatch.config_checks.ConfigError: cfg: key 'eval_step': unknown key (did you mean 'eval_steps'?); ...
        """
        return cls._from_mapping(data, source, lines={}, relative_to=None)

    def replace(self, **changes: Any) -> ForgetWatchConfig:
        """A copy with ``changes``, checked like a new config (errors name the keyword).

        Example:
            >>> ForgetWatchConfig(eval_steps=50).replace(patience=2).patience
            2
        """
        return type(self).from_dict({**self.to_dict(), **changes}, source="replace()")

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str], **overrides: Any) -> ForgetWatchConfig:
        """Load a config from a YAML file; keyword ``overrides`` win over the file's settings.

        The document is either the config mapping itself or a bigger mapping holding it under a
        top-level ``forgetwatch:`` key (other top-level keys are then ignored). Relative
        ``probes``, ``base`` and ``output_dir`` paths are taken relative to the YAML file's
        folder, so a config and its probe files can move together; ``~`` is expanded.

        Raises:
            FileNotFoundError: the file does not exist.
            ConfigError: the YAML is malformed (names the file and line), uses anchors or aliases,
                is over 1 MiB, or a value is invalid.

        Example:
            >>> cfg = ForgetWatchConfig.from_yaml("configs/early_stop_adjusted_5pct.yaml")  # doctest: +SKIP
            >>> cfg.max_forgetting, cfg.stop_metric                                          # doctest: +SKIP
            (0.05, 'forgetting_adjusted')
            >>> ForgetWatchConfig.from_yaml("configs/early_stop_adjusted_5pct.yaml", patience=5).patience  # doctest: +SKIP
            5
        """
        data, lines, problems = read_section(path, _CHECKS)
        cfg = cls._from_mapping(data, str(path), lines, Path(path).absolute().parent, problems)
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
            message = f"expected a mapping of forgetwatch settings, got {describe(data)}"
            raise ConfigError([ConfigProblem(source, None, None, message)])
        known: dict[str, Any] = {}
        for key, value in data.items():
            if not isinstance(key, str):
                message = f"key {describe(key)} is not a string; write setting names such as 'eval_steps'"
                problems.append(ConfigProblem(source, None, None, message))
            elif key not in _CHECKS:
                hint = suggestion(key, _CHECKS) or f" (known keys: {', '.join(_CHECKS)})"
                message = f"unknown key{hint}; fix or remove it"
                problems.append(ConfigProblem(source, lines.get(key), key, message))
            else:
                known[key] = value
        cleaned, value_problems = check_values(known, _CHECKS, source, lines)
        problems += value_problems
        if problems:
            raise ConfigError(problems)
        if relative_to is not None:
            for name in PATH_FIELDS:
                if cleaned.get(name) not in (None, ADAPTER_DISABLED):
                    cleaned[name] = _resolve(cleaned[name], relative_to)
        return cls(**cleaned)

    def check_categories(self, categories: Sequence[str]) -> None:
        """Refuse per-category thresholds for categories the probes do not have: a misspelled
        one would leave its guard off all run long.

        Example:
            >>> ForgetWatchConfig(category_max_forgetting={"mth": 0.1}).check_categories(["math"])  # doctest: +ELLIPSIS
            Traceback (most recent call last):
                ...
            forgetwatch.config_checks.ConfigError: ForgetWatchCallback: key 'category_max_forgetting': names categories ...
        """
        unknown = sorted(set(self.category_max_forgetting) - set(categories))
        if unknown:
            message = (f"names categories the probes do not have: {', '.join(map(repr, unknown))}; "
                       f"they have {', '.join(map(repr, categories))}")
            raise ConfigError([ConfigProblem("ForgetWatchCallback", None, "category_max_forgetting", message)])

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
        write_settings(data, path)


#: every setting's check, from the fields: the known keys are the fields
_CHECKS: dict[str, Callable[[Any], Any]] = {f.name: f.metadata["check"] for f in fields(ForgetWatchConfig)}
_dataclass_init = ForgetWatchConfig.__init__


@functools.wraps(_dataclass_init)
def _init(self: ForgetWatchConfig, *args: Any, **kwargs: Any) -> None:
    # an unknown keyword is the project's error, with a hint, not a dataclass TypeError
    unknown = [k for k in kwargs if k not in _CHECKS]
    if unknown:
        raise ConfigError([ConfigProblem("ForgetWatchConfig", None, k, f"unknown key{suggestion(k, _CHECKS)}; "
                                         f"known keys: {', '.join(_CHECKS)}") for k in unknown])
    _dataclass_init(self, *args, **kwargs)


ForgetWatchConfig.__init__ = _init  # type: ignore[method-assign]


def options_doc() -> str:
    """Every setting, one per line: ``name (type, default X): help``.

    Example:
        >>> options_doc().splitlines()[1].split(":")[0].strip()
        'eval_steps (int | None, default None)'
    """
    lines = []
    for f in fields(ForgetWatchConfig):
        default = f.default if f.default is not MISSING else f.default_factory()
        lines.append(f"    {f.name} ({f.type}, default {default!r}): {f.metadata['help']}")
    return "\n".join(lines) + "\n"


def with_settings(signature: inspect.Signature) -> inspect.Signature:
    """``signature`` with every setting as a keyword-only parameter (type and default) in place
    of its ``**kwargs``: what ``help()`` and editors show for a function taking settings."""
    params = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    named = {p.name for p in params}
    for f in fields(ForgetWatchConfig):
        if f.name not in named:
            default = f.default if f.default is not MISSING else f.default_factory()
            params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                            annotation=f.type))
    return signature.replace(parameters=params)


ForgetWatchConfig.__doc__ += "\n    Settings:\n" + "\n".join("    " + line for line in options_doc().splitlines()) + "\n"


def _resolve(path: str, folder: Path) -> str:
    # No normpath: collapsing ".." past a symlink would point somewhere else.
    expanded = Path(os.path.expanduser(path))
    return str(expanded if expanded.is_absolute() else folder / expanded)


