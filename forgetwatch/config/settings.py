"""The three groups of settings (:class:`Scoring`, :class:`Monitor`, :class:`Output`): each field declares its
default, its check and its flat YAML key once; its help is the ``Attributes:`` entry of its group's docstring."""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Sequence
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any

from forgetwatch.common.problems import Problem
from forgetwatch.config import checks as check
from forgetwatch.config.checks import ConfigError, check_values
from forgetwatch.config.options import MAX_NEW_TOKENS, NORMALIZE_MODES, PRECISIONS

#: the forgetting rates a run may stop on
STOP_METRICS = ("forgetting", "forgetting_adjusted")

__all__ = ["Monitor", "Output", "Scoring", "help_text"]

_LONGER_THAN_ANY_CONTEXT = f"at most {MAX_NEW_TOKENS}: more than any model's context, which is all a response can use"


def option(
    default: Any = MISSING,
    *,
    check: Callable[[Any], Any],
    key: str | None = None,
    factory: Callable[[], Any] | None = None,
) -> Any:
    """A setting: its default (or ``factory``), its check, and its flat key where that is not its name."""
    metadata = {"check": check, **({"key": key} if key else {})}
    return field(default=default, default_factory=factory or MISSING, metadata=metadata)


def flat_key(f: Field[Any]) -> str:
    return f.metadata.get("key", f.name)


class _Group:
    """A group checks itself when built."""

    def __post_init__(self) -> None:
        checks = {f.name: f.metadata["check"] for f in fields(self)}  # type: ignore[arg-type]
        values = {name: getattr(self, name) for name in checks}
        cleaned, problems = check_values(values, checks, type(self).__name__, {})
        if problems:
            raise ConfigError(problems)
        # normalised copies (list/dict copies, ints as floats): the caller's objects are not shared
        for name, value in cleaned.items():
            object.__setattr__(self, name, value)  # frozen: only construction sets fields


@functools.cache
def help_text(group: type) -> dict[str, str]:
    """Each field's help: the ``Attributes:`` entries of ``group``'s docstring, as plain text."""
    section = inspect.cleandoc(group.__doc__ or "").partition("Attributes:\n")[2].partition("\n\n")[0]
    entries = re.findall(r"^    (\w+): (.*(?:\n        .*)*)", section, re.MULTILINE)
    return {name: " ".join(text.split()).replace("``", "") for name, text in entries}


@dataclass(frozen=True, kw_only=True)
class Scoring(_Group):
    """How probes are scored: by the callback, ``evaluate``, ``Scorer`` and the command line.

    Attributes:
        batch_size: Probes per forward pass: a positive integer, or "auto" for the largest batch that fits.
        normalize: Multiple-choice score normalisation: None (lm-eval ``acc``) or "chars" (``acc_norm``:
            log-probability divided by the choice's length in characters).
        chat_template: Wrap each question in the tokenizer's chat template (a user turn, generation prompt).
        max_new_tokens: Generative probes: most tokens to generate (>= 1).
        stop: Generative probes: generation stops at the first of these strings (EOS always stops).
        behaviour_max_new_tokens: Behaviour probes (rows with ``check``): most tokens of a response (>= 1); they
            run to EOS, ``stop`` does not apply.
        shared_prefixes: Compute a prompt prefix many probes share (a few-shot block, a system prompt) once per
            evaluation and read it from the KV cache: the same answers, faster. Off: every probe is scored whole.
        precision: What the forwards compute in: "weights" (the weights' own dtype, autocast off: answers equal an
            offline recount such as lm-eval's) or "autocast" (as the trainer's mixed-precision forward: faster,
            but answers flip with rounding alone). Answers of another precision are not compared.
        samples: Generative and behaviour probes: answers drawn per probe (1 to 16; each costs a generation), each
            judged; a probe is right when most are (``Answers.samples_correct`` holds each). > 1 needs a temperature.
        temperature: Generation's temperature: 0 decodes greedily; 0.01 or more samples, each answer with its own
            seed.
        top_p: Sampling draws from the smallest set of tokens whose probability reaches this (0 < x <= 1).
        seed: The run's sampling seed: answer j of probe p is drawn with a seed made of (seed, p's id, j), the same
            on any batch size or number of ranks, and for the base and every later evaluation.

    Example:
        >>> Scoring(batch_size=8, normalize="chars").batch_size
        8
        >>> Scoring(samples=3, temperature=0.6, top_p=0.95).sampled
        True
    """

    batch_size: int | str = option("auto", check=check.batch_size)
    normalize: str | None = option(None, check=check.choice(tuple(m for m in NORMALIZE_MODES if m), allow_none=True))
    chat_template: bool = option(False, check=check.boolean)
    max_new_tokens: int = option(64, check=check.integer(1, MAX_NEW_TOKENS, _LONGER_THAN_ANY_CONTEXT))
    stop: Sequence[str] = option(("\n",), check=check.stop_strings)  # kept as a list
    behaviour_max_new_tokens: int = option(256, check=check.integer(1, MAX_NEW_TOKENS, _LONGER_THAN_ANY_CONTEXT))
    shared_prefixes: bool = option(True, check=check.boolean)
    precision: str = option("weights", check=check.choice(PRECISIONS))
    samples: int = option(
        1,
        check=check.integer(
            1,
            16,
            "each sample is one more generation of every response, and the seeds' agreement is counted over "
            "every combination of them",
        ),
    )
    temperature: float = option(0.0, check=check.temperature)
    top_p: float = option(1.0, check=check.rate(True, False, "0.95"))
    seed: int = option(0, check=check.integer(0))

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.samples > 1 and self.temperature == 0:
            message = (
                f"samples={self.samples} with temperature=0 draws one greedy answer {self.samples} times; "
                "give a temperature (Harmon et al. sample at 0.6, top_p 0.95), or samples=1"
            )
            raise ConfigError([Problem("Scoring", None, "samples", message)])

    @property
    def sampled(self) -> bool:
        """Whether answers are drawn (temperature above 0) rather than decoded greedily."""
        return self.temperature > 0


@dataclass(frozen=True, kw_only=True)
class Monitor(_Group):
    """How a run is watched, beside ``eval_steps`` and ``max_forgetting``: when else to evaluate, what else to
    measure, when to stop.

    Attributes:
        max_overhead: Without ``eval_steps``, the share of wall time monitoring may take, start-up included
            (0.001 <= x < 1); with ``eval_steps``, a warning says when the interval spends more.
        eval_on_evaluate: Also evaluate at every trainer evaluation (adds ``eval_forgetwatch_*`` metrics).
        eval_on_train_end: Evaluate once more when training ends.
        metric: Which rate max_forgetting applies to: "forgetting" or "forgetting_adjusted" (flat key stop_metric).
        patience: Consecutive evaluations over the threshold before stopping (>= 1).
        significance: Stop only when the Wilson 95 % lower bound of the rate is over the threshold.
        category_max_forgetting: Per-category thresholds, category -> rate (0..1); none by default.
        save_on_stop: Ask the trainer for a checkpoint before stopping.
        at_risk_share: A still-right probe is at risk once its margin (multiple choice) or its reference's
            probability (generative) falls below this share of the base's (0 < x < 1).
        at_risk_floor: A still-right multiple-choice probe is also at risk below this margin in nats (>= 0).
        noise_check: Score the base twice, in batches of another size, and report how many probes flip with no
            weight change (the noise floor); None: on for GPUs and reduced precision.
        train_kl_rows: Training rows on which KL(base || current) is measured at each evaluation
            (``forgetwatch/drift/train_kl``), a fixed seeded sample (0 to 4096; 0: off; fewer when the base's
            distribution on all of them would take longer than scoring the probes).

    Example:
        >>> Monitor(patience=3, metric="forgetting_adjusted").max_overhead
        0.05
    """

    max_overhead: float = option(
        0.05,
        check=check.rate(
            True,
            True,
            "0.05 for 5 % of wall time",
            floor=0.001,
            why="below 0.1 % the schedule would barely evaluate (a tiny share overflows its wait); "
            "for rare evaluations set eval_steps",
        ),
    )
    eval_on_evaluate: bool = option(True, check=check.boolean)
    eval_on_train_end: bool = option(True, check=check.boolean)
    metric: str = option("forgetting", check=check.choice(STOP_METRICS), key="stop_metric")
    patience: int = option(1, check=check.integer(1))
    significance: bool = option(False, check=check.boolean)
    category_max_forgetting: dict[str, float] = option(check=check.category_rates, factory=dict)
    save_on_stop: bool = option(True, check=check.boolean)
    at_risk_share: float = option(0.5, check=check.rate(True, True, "0.5"))
    at_risk_floor: float = option(0.1, check=check.non_negative)
    noise_check: bool | None = option(None, check=check.optional(check.boolean, "on for GPUs and reduced precision"))
    train_kl_rows: int = option(
        128,
        check=check.integer(
            0, 4096, "each row is one forward pass at every evaluation, and its base distribution is kept all run"
        ),
    )


@dataclass(frozen=True, kw_only=True)
class Output(_Group):
    """Where results go and how much is logged.

    Attributes:
        table_rows: W&B and TensorBoard tables: at most this many rows per evaluation's flips and in the final
            table of probes (>= 1).
        log_categories: Also log ``forgetwatch/<category>/<metric>`` keys, per group where categories have groups
            (``category_map``, or lm-eval's own, e.g. ``mmlu_stem``).
        category_map: Category -> group, for probe files: the logged per-category figures are the groups' (a
            category left out is a group of its own); history.jsonl and the report keep every category.
        min_logged_right: Log a category (or group) only with at least this many probes right at the base (>= 1;
            6 is the fewest an exact McNemar test calls significant at 5 %).
        max_logged_categories: Per-category keys for at most this many categories, the largest (>= 1).
        verbose: Print one console line per evaluation.

    Example:
        >>> Output(verbose=False).table_rows
        500
    """

    table_rows: int = option(500, check=check.integer(1))
    log_categories: bool = option(True, check=check.boolean)
    category_map: dict[str, str] = option(check=check.category_map, factory=dict)
    min_logged_right: int = option(6, check=check.integer(1))
    max_logged_categories: int = option(100, check=check.integer(1))
    verbose: bool = option(True, check=check.boolean)
