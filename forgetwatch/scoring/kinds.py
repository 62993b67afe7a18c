"""How each kind of probe is scored from what the model did: one function a kind, in one table (:data:`SCORE`); and
the scoring options that decide a probe set's answers, as stored with them."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from forgetwatch.behaviour.checks import failed_checks
from forgetwatch.config.settings import Scoring
from forgetwatch.probes import Probe, ProbeKind
from forgetwatch.probes.extract import extractor_for, is_correct, reference_for
from forgetwatch.probes.tool_calls import calls_match, parse_call


class Measured(NamedTuple):
    """What the model did for one probe: each scored continuation's summed log-probability, and its text (or None)."""

    logprobs: np.ndarray
    text: str | None


@dataclass(frozen=True)
class Rules:
    """The scorer's options that turn what was measured into answers."""

    scoring: Scoring  # its normalize="chars": a choice's log-probability per character (lm-eval acc_norm)
    extract: Callable[[str], str | None] | None  # the user's extractor for every generative probe
    refusal_detector: Callable[[str], bool] | None  # decides the behaviour checks' "refuses" (None: the default)


def multiple_choice(probe: Probe, measured: Measured, rules: Rules) -> dict[str, Any]:
    """The likeliest choice (lm-eval ``acc``, or ``acc_norm`` per character); ties go to the lowest index."""
    lps = measured.logprobs
    if probe.judge is not None:  # the probe's own rules (lm-eval's metric)
        correct, pred = probe.judge.choose(lps)
    else:
        scores = lps / np.array([float(len(c)) for c in probe.choices]) if rules.scoring.normalize == "chars" else lps
        pred = int(np.argmax(scores))  # ties go to the lowest index
        correct = pred == probe.answer
    return {
        "correct": correct,
        "predicted": pred,
        "choice_logprobs": lps,
        "gold_logprob": float(lps[probe.answer]),
        "n_choices": probe.n_choices,
    }


def generative(probe: Probe, measured: Measured, rules: Rules) -> dict[str, Any]:
    """The answer extracted from the generated text (judge, user's extractor, or ``extract``) against the reference."""
    text = measured.text
    if probe.judge is not None:  # the probe's own rules (lm-eval's filters and metric)
        correct, got = probe.judge.read(text)
    elif rules.extract is not None:  # the user's extractor: compared with the answer as written
        got = rules.extract(text)
        correct = is_correct(got, probe.answer.strip())
    else:
        got = extractor_for(probe.extract)(text)
        correct = is_correct(got, reference_for(probe.extract, probe.answer))
    sample = {"correct": correct, "predicted": got, "output": text, "n_choices": 0}
    if len(measured.logprobs):  # the reference answer's teacher-forced log-probability
        sample["gold_logprob"] = float(measured.logprobs[0])
    return sample


def behaviour(probe: Probe, measured: Measured, rules: Rules) -> dict[str, Any]:
    """The response itself, right when every check holds."""
    failed = failed_checks(probe.check, measured.text, rules.refusal_detector)
    return {"correct": not failed, "predicted": measured.text, "output": measured.text, "n_choices": 0}


def tool_call(probe: Probe, measured: Measured, rules: Rules) -> dict[str, Any]:
    """The first call in the reply, right when it names the expected tool with the expected arguments."""
    call = parse_call(measured.text)
    correct = calls_match(probe.answer, call, probe.arguments_match or "exact")
    shown = None if call is None else json.dumps(call, ensure_ascii=False, sort_keys=True)
    return {"correct": correct, "predicted": shown, "output": measured.text, "n_choices": 0}


SCORE: Mapping[ProbeKind, Callable[[Probe, Measured, Rules], dict[str, Any]]] = {
    ProbeKind.MULTIPLE_CHOICE: multiple_choice,
    ProbeKind.GENERATIVE: generative,
    ProbeKind.BEHAVIOUR: behaviour,
    ProbeKind.TOOL_CALL: tool_call,
}


def scoring_options(
    probes: Iterable[Any],
    scoring: Scoring,
    extract: Callable[[str], str | None] | None = None,
    refusal_detector: Callable[[str], bool] | None = None,
) -> dict[str, Any]:
    """The options that decide ``probes``' answers, stored with them (each kind's only if present; not precision)."""
    kinds = {p.kind for p in probes}
    s = scoring
    options: dict[str, Any] = {"normalize": s.normalize, "chat_template": s.chat_template}
    if ProbeKind.GENERATIVE in kinds:
        options.update(max_new_tokens=s.max_new_tokens, stop=list(s.stop))
        if extract is not None:
            options["extract"] = getattr(extract, "__qualname__", repr(extract))
    if kinds & {ProbeKind.BEHAVIOUR, ProbeKind.TOOL_CALL}:
        options["behaviour_max_new_tokens"] = s.behaviour_max_new_tokens
        if refusal_detector is not None:
            options["refusal_detector"] = getattr(refusal_detector, "__qualname__", repr(refusal_detector))
    if s.sampled:  # greedy answers carry no sampling options: they are what they always were
        options["sampling"] = {"samples": s.samples, "temperature": s.temperature, "top_p": s.top_p, "seed": s.seed}
    return options
