"""The groups of settings (:class:`Scoring`, :class:`Monitor`, :class:`Output`): each field declared once, with its
type, check, default and help; YAML keys, scoring flags and ``forgetwatch_<key>`` settings are the field names."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    field_validator,
)

from forgetwatch.common.problems import InputError, Problem
from forgetwatch.common.text import describe, did_you_mean, shorten
from forgetwatch.probes.schema import check_category

__all__ = ["ConfigError", "Monitor", "Output", "Scoring"]

MAX_INT = 2**63 - 1  # the largest count any setting may be: what a 64-bit integer holds
BatchSize = int | str  # a positive int, or "auto"
MAX_NEW_TOKENS = 1 << 20  # more than any model's context
#: Stop strings: at most this many, each at most this long (transformers builds a vocabulary-wide table for each).
MAX_STOP_STRINGS, MAX_STOP_CHARS = 64, 200
MIN_TEMPERATURE = 0.01  # colder sampling is greedy decoding but for rounding, and overflows the logits


class ConfigError(InputError):
    """Invalid settings: one line per problem (``train.yaml: line 3: key 'eval_step': ...``); ``errors`` holds them."""


def problems(err: ValidationError, source: str) -> list[Problem]:
    """A pydantic error as one problem per key (a union's branches each say why: joined); the caller adds lines."""
    found: dict[str | None, tuple[list[str], Any]] = {}
    for e in err.errors(include_url=False):
        key = str(e["loc"][0]) if e["loc"] else None
        message = str(e["ctx"]["error"]) if e["type"] == "value_error" else e["msg"]
        inside = [shorten(part) for part in e["loc"][1:] if part != "[key]"]
        inner = f"item {', '.join(inside)}: " if inside else ""
        found.setdefault(key, ([], e["input"]))[0].append(inner + message)
    return [
        Problem(source, None, key, f"{' or '.join(dict.fromkeys(said))}; given {describe(given)}")
        for key, (said, given) in found.items()
    ]


def unknown_keyword(source: str, key: str, keywords: Sequence[str]) -> TypeError:
    """The error for ``source(key=...)``: it names the group a setting belongs to, or the nearest keyword."""
    groups = {name: group for group in GROUPS.values() for name in group.model_fields}
    match = did_you_mean(key, [*keywords, *groups])
    if key in groups and key not in keywords:
        hint = f": write {_grouped_as(key, groups[key])}"
    elif match in keywords:
        hint = f" (did you mean {match!r}?)"
    else:
        hint = f" (did you mean {_grouped_as(match, groups[match])}?)" if match else ""
    return TypeError(f"{source}() got an unexpected keyword argument {key!r}{hint}")


def _grouped_as(key: str, group: type) -> str:
    return f"{group.__name__.lower()}={group.__name__}({key}=...)"


class Settings(BaseModel):
    """Settings checked when built (a :class:`ConfigError` naming each wrong field), immutable, strictly typed (``"5"``
    is no integer), no unknown fields (a ``TypeError`` with a did-you-mean)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, use_attribute_docstrings=True)

    def __init__(self, **values: Any) -> None:
        fields = type(self).model_fields
        if unknown := next((key for key in values if key not in fields), None):
            raise unknown_keyword(type(self).__name__, unknown, list(fields))
        try:
            super().__init__(**values)
        except ValidationError as err:
            raise ConfigError(problems(err, type(self).__name__)) from None


def checked_path(value: str) -> str:
    """``value`` as a path setting, or a ``ValueError`` saying why no file system takes it."""
    if not value.strip():
        raise ValueError("a path cannot be empty; give the path, or remove the key")
    if "\0" in value:  # no file system takes one: open() and mkdir() raise, late
        raise ValueError(f"a path has no NUL character; this one has one at character {value.index(chr(0))}")
    return value


def _category(value: str) -> str:
    if message := check_category(value):  # the probes' own rule for a category's name
        raise ValueError(message)
    return value


#: A file system path: a non-empty string (or an os.PathLike).
FilePath = Annotated[
    str, BeforeValidator(lambda v: os.fspath(v) if isinstance(v, os.PathLike) else v), AfterValidator(checked_path)
]
Count = Annotated[int, Field(ge=1, le=MAX_INT)]  # a whole number (not a bool) of at least 1
Tokens = Annotated[int, Field(ge=1, le=MAX_NEW_TOKENS)]  # of a response
Share = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]  # a rate, 0 to 1: a fraction, not a percentage
Category = Annotated[str, AfterValidator(_category)]
StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]  # valid Unicode: a strict str's rule


class FrozenDict(dict):  # type: ignore[type-arg]
    """A mapping of settings: checked once, when built, it cannot change since (a deep copy is itself)."""

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("settings cannot change once checked: build new ones")

    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _refuse  # type: ignore

    def __deepcopy__(self, memo: Any) -> FrozenDict:
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return FrozenDict, (dict(self),)


Frozen = AfterValidator(FrozenDict)


def _temperature(value: float) -> float:
    if 0 < value < MIN_TEMPERATURE:
        raise ValueError(
            f"a temperature is 0 or at least {MIN_TEMPERATURE:g}: sampling this cold is greedy decoding, and divides "
            "the logits past what floats hold; write 0 for greedy answers, or a temperature such as 0.6"
        )
    return value


def _batch_size(value: Any) -> int | str:
    if value == "auto" or isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_INT:
        return value if isinstance(value, str) else int(value)
    raise ValueError("a batch size is a positive integer, or 'auto' for the largest batch that fits")


class Scoring(Settings):
    """How probes are scored: by the callback, ``evaluate``, ``Scorer`` and the command line (``--<field>``).

    Example:
        >>> Scoring(batch_size=8, normalize="chars").batch_size
        8
        >>> Scoring(samples=3, temperature=0.6, top_p=0.95).sampled
        True
    """

    batch_size: Annotated[int | Literal["auto"], PlainValidator(_batch_size)] = "auto"
    """Probes per forward pass: a positive integer, or "auto" for the largest batch that fits."""
    normalize: Literal["chars"] | None = None
    """Multiple choice: None (lm-eval ``acc``) or "chars" (``acc_norm``: log-probability per character)."""
    chat_template: bool = False
    """Wrap each question in the tokenizer's chat template (a user turn, generation prompt)."""
    max_new_tokens: Tokens = 64
    """Generative probes: most tokens to generate (>= 1)."""
    stop: Annotated[tuple[StopString, ...], Field(max_length=MAX_STOP_STRINGS, strict=False)] = ("\n",)
    """Generative probes: generation stops at the first of these strings (EOS always stops)."""
    behaviour_max_new_tokens: Tokens = 256
    """Behaviour probes (rows with ``check``): most tokens of a response (>= 1); ``stop`` does not apply."""
    shared_prefixes: bool = True
    """Compute a prompt prefix many probes share once per evaluation, read from the KV cache: same answers, faster."""
    precision: Literal["weights", "autocast"] = "weights"
    """"weights" (their dtype, autocast off: answers equal lm-eval's) or "autocast" (faster; rounding flips answers)."""
    temperature: Annotated[float, Field(ge=0, allow_inf_nan=False), AfterValidator(_temperature)] = 0.0
    """Generation's temperature: 0 decodes greedily; 0.01 or more samples, each answer with its own seed."""
    top_p: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = 1.0
    """Sampling draws from the smallest set of tokens whose probability reaches this (0 < x <= 1)."""
    samples: Annotated[int, Field(ge=1, le=16)] = 1
    """Answers drawn per generative or behaviour probe (1 to 16), right when most are; > 1 needs a temperature."""
    seed: Annotated[int, Field(ge=0, le=MAX_INT)] = 0
    """Sampling seed: answer j of probe p is drawn with a seed of (seed, p's id, j), whatever the batches or ranks."""

    @field_validator("samples")
    @classmethod
    def _samples_need_a_temperature(cls, samples: int, info: Any) -> int:
        if samples > 1 and info.data.get("temperature") == 0:
            raise ValueError(
                f"samples={samples} with temperature=0 draws one greedy answer {samples} times; give a temperature "
                "(Harmon et al. sample at 0.6, top_p 0.95), or samples=1"
            )
        return samples

    @property
    def sampled(self) -> bool:
        """Whether answers are drawn (temperature above 0) rather than decoded greedily."""
        return self.temperature > 0


class Monitor(Settings):
    """How a run is watched beside ``eval_steps`` and ``max_forgetting``: when else to evaluate, what to measure, when
    to stop.

    Example:
        >>> Monitor(patience=3, stop_metric="forgetting_adjusted").max_overhead
        0.05
    """

    max_overhead: Annotated[float, Field(ge=0.001, lt=1, allow_inf_nan=False)] = 0.05
    """Without ``eval_steps``, the share of wall time monitoring may take (0.001 <= x < 1); with it, a warning past."""
    eval_on_evaluate: bool = True
    """Also evaluate at every trainer evaluation (adds ``eval_forgetwatch_*`` metrics)."""
    eval_on_train_end: bool = True
    """Evaluate once more when training ends."""
    stop_metric: Literal["forgetting", "forgetting_adjusted"] = "forgetting"
    """Which rate max_forgetting applies to: "forgetting" or "forgetting_adjusted"."""
    patience: Count = 1
    """Consecutive evaluations over the threshold before stopping (>= 1)."""
    significance: bool = False
    """Stop only when the Wilson 95 % lower bound of the rate is over the threshold."""
    category_max_forgetting: Annotated[Mapping[Category, Share], Frozen] = FrozenDict()
    """Per-category thresholds, category -> rate (0..1); none by default."""
    save_on_stop: bool = True
    """Ask the trainer for a checkpoint before stopping."""
    at_risk_share: Annotated[float, Field(gt=0, lt=1)] = 0.5
    """A right probe is at risk once its margin (or reference's probability) falls below this share of the base's."""
    at_risk_floor: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.1
    """A still-right multiple-choice probe is also at risk below this margin in nats (>= 0)."""
    noise_check: bool | None = None
    """Score the base twice, in other batch sizes, to report the noise floor; None: on for GPUs and reduced precision."""
    train_kl_rows: Annotated[int, Field(ge=0, le=4096)] = 128
    """Training rows (a seeded sample, 0 to 4096; 0: off) on which ``forgetwatch/drift/train_kl`` is measured."""


class Output(Settings):
    """Where results go and how much is logged.

    Example:
        >>> Output(verbose=False).table_rows
        500
    """

    table_rows: Count = 500
    """W&B and TensorBoard tables: at most this many rows (>= 1)."""
    log_categories: bool = True
    """Also log ``forgetwatch/<category>/<metric>`` keys, per group where categories have groups."""
    category_map: Annotated[Mapping[Category, Category], Frozen] = FrozenDict()
    """Category -> group: the logged per-category figures are the groups'; history.jsonl keeps every category."""
    min_logged_right: Count = 6
    """Log a category only with at least this many probes right at the base (6: the fewest McNemar calls significant)."""
    max_logged_categories: Count = 100
    """Per-category keys for at most this many categories, the largest (>= 1)."""
    verbose: bool = True
    """Print one console line per evaluation."""


#: the groups, by their field of ForgetWatchConfig
GROUPS: dict[str, type[Settings]] = {"scoring": Scoring, "monitor": Monitor, "output": Output}
