"""One probe row: its fields, its kind (``choices``: multiple choice; ``answer`` alone: generative; ``check``:
behaviour), and the checks that refuse a row that could not be scored as written, each naming its field."""

from __future__ import annotations

import copy
import json
import logging
import numbers
import re
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from forgetwatch.behaviour.checks import check_problems
from forgetwatch.common.patterns import compiled, pattern_problem
from forgetwatch.common.problems import InputError
from forgetwatch.common.rows import FieldProblem, Rows
from forgetwatch.common.strict_json import lone_surrogate
from forgetwatch.common.text import did_you_mean, shorten, suggestion, type_name
from forgetwatch.probes.extract import BUILTIN, MAX_NUMBER_DIGITS, normalize_number
from forgetwatch.probes.tool_calls import ARGUMENT_MATCHES, call_problems, tools_problems

EXTRACT_MODES = tuple(BUILTIN)
#: Characters of a question beyond any model's view: it loads, with one warning, and is cut from the left.
LONG_QUESTION = 100_000
PROBE_FIELDS = tuple("id question messages category group choices answer extract check tools arguments_match".split())
#: The roles of a multi-turn probe's turns (``messages``).
ROLES = ("system", "user", "assistant")
#: Where a probe keeps its category's group (a meta key: a run's ``probes.jsonl`` holds it).
GROUP_KEY = "category_group"
logger = logging.getLogger(__name__)


class ProbeError(InputError):
    """A malformed probe file or record set: ``errors`` holds each ``(source, line, field, message)``."""

    noun = "field"


class ProbeKind(Enum):
    """What a probe asks of the model, and so how it is scored (one entry of the scorer's table).

    Example:
        >>> ProbeKind.of({"id", "question", "choices", "answer"})
        <ProbeKind.MULTIPLE_CHOICE: 'multiple choice'>
    """

    MULTIPLE_CHOICE = "multiple choice"  # the likeliest of the choices is the answer
    GENERATIVE = "generative"  # a generated answer, compared with the reference
    BEHAVIOUR = "behaviour"  # a generated response, passed or failed by its checks
    TOOL_CALL = "tool call"  # a generated call of one of the tools, compared with the expected call

    @classmethod
    def of(cls, fields: Container[str]) -> ProbeKind:
        if "check" in fields:  # a check makes a behaviour probe, whatever else it holds
            return cls.BEHAVIOUR
        if "tools" in fields:
            return cls.TOOL_CALL
        return cls.MULTIPLE_CHOICE if "choices" in fields else cls.GENERATIVE


@dataclass(frozen=True)
class Probe:
    """One probe: a question with choices, a reference answer, or a ``check`` on the response.

    Example:
        >>> Probe(id="q1", question="2 + 2 =", choices=("3", "4"), answer=1).kind
        <ProbeKind.MULTIPLE_CHOICE: 'multiple choice'>
    """

    id: str
    question: str
    answer: int | str | Mapping[str, Any] | None = field(hash=False)
    choices: tuple[str, ...] | None = None
    category: str = "all"
    extract: str | None = None
    check: Mapping[str, Any] | None = field(default=None, hash=False)
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False)
    #: between the question and each choice (or the reference); ``None``: a space (none after a chat turn)
    delimiter: str | None = None
    #: an ``LmEvalJudge``, which decides the answer by lm-eval's rules instead of ours (``None``)
    judge: Any = field(default=None, compare=False, hash=False, repr=False)
    #: a multi-turn probe's conversation (``{"role", "content"}`` turns ending with the user's), rendered with the
    #: model's chat template; ``question`` is then its last turn
    messages: tuple[Mapping[str, str], ...] | None = field(default=None, hash=False)
    #: the rephrasing group: probes of one group ask one question in other words
    group: str | None = None
    #: a tool-call probe's tools (JSON schemas, given to the chat template) and how its arguments are matched
    tools: tuple[Mapping[str, Any], ...] | None = field(default=None, hash=False)
    arguments_match: str | None = None

    @property
    def kind(self) -> ProbeKind:
        return ProbeKind.of({k for k in ("check", "tools", "choices") if getattr(self, k) is not None})

    @property
    def category_group(self) -> str:
        """The group its category is logged in: ``meta``'s, else its innermost lm-eval group, else its category."""
        kept = self.meta.get(GROUP_KEY)
        if isinstance(kept, str) and kept:
            return kept
        lm_eval = self.meta.get("lm_eval")
        groups = lm_eval.get("groups") if isinstance(lm_eval, Mapping) else None
        if isinstance(groups, list) and groups and isinstance(groups[0], str) and groups[0]:
            return groups[0]
        return self.category

    @property
    def is_multiple_choice(self) -> bool:
        return self.kind is ProbeKind.MULTIPLE_CHOICE

    @property
    def is_behaviour(self) -> bool:
        return self.kind is ProbeKind.BEHAVIOUR

    @property
    def n_choices(self) -> int:
        return 0 if self.choices is None else len(self.choices)

    @property
    def answer_text(self) -> str:
        """The right choice, the reference, or the check (as JSON)."""
        if self.kind in (ProbeKind.BEHAVIOUR, ProbeKind.TOOL_CALL):  # the check, or the expected call
            return json.dumps(dict(self.check or self.answer), ensure_ascii=False)
        return self.choices[self.answer] if self.kind is ProbeKind.MULTIPLE_CHOICE else str(self.answer)

    def content(self) -> dict[str, Any]:
        """The fields that decide scoring, as a plain dict (what the fingerprint hashes)."""
        asked = {"question": self.question} if self.messages is None else {"messages": [dict(m) for m in self.messages]}
        row: dict[str, Any] = {"id": self.id, **asked, "category": self.category}
        if self.choices is not None:
            row["choices"] = list(self.choices)
        if self.check is not None:
            row["check"] = dict(self.check)
        else:
            row["answer"] = self.answer
        if self.tools is not None:
            row["tools"] = [copy.deepcopy(dict(t)) for t in self.tools]
        optional = {k: getattr(self, k) for k in ("arguments_match", "group", "extract", "delimiter")}
        optional["judge"] = self.judge and self.judge.describe()
        return row | {k: v for k, v in optional.items() if v is not None}


def is_int(value: Any) -> bool:
    # bool is an int subclass, but True as an answer index is almost surely a mistake.
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


# control characters (Unicode Cc); in text, tab and line breaks are allowed
_CONTROL_IN_TEXT = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_CONTROL_IN_NAME = re.compile("[\x00-\x1f\x7f-\x9f]")


def unkeepable(value: str, allow_layout: bool) -> str | None:
    """Why ``value`` cannot be kept as written (a lone surrogate, a control character but layout's), or ``None``."""
    if (found := (_CONTROL_IN_TEXT if allow_layout else _CONTROL_IN_NAME).search(value)) is None:
        return lone_surrogate(value)
    where = "" if allow_layout else " (no tabs or line breaks either)"
    return f"has a control character (U+{ord(found.group()):04X}) at character {found.start()}; remove it{where}"


def _misspelled(row: Mapping[str, Any], fld: str) -> str:
    close = did_you_mean(fld, [k for k in row if k not in PROBE_FIELDS], cutoff=0.75)
    return f" (found key '{close}': did you mean '{fld}'?)" if close else ""


def _text_problem(value: Any, need: str, allow_layout: bool = False) -> str | None:
    if not isinstance(value, str):
        hint = f'quote it: "{value}"; ' if isinstance(value, (bool, int, float)) else ""
        return f"must be a string, got {type_name(value)} {shorten(value)}; {hint}{need}"
    return f"is empty; {need}" if not value.strip() else unkeepable(value, allow_layout)


def messages_problems(value: Any) -> list[FieldProblem]:
    """What is wrong with a conversation: a non-empty list of ``{"role", "content"}`` turns ending with the user's."""
    if not isinstance(value, (list, tuple)) or not value:
        return [("messages", f'must be a non-empty list of {{"role", "content"}} turns, got {type_name(value)}')]
    problems: list[FieldProblem] = []
    for i, turn in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(turn, Mapping):
            problems.append((where, f"must be an object with 'role' and 'content', got {type_name(turn)}"))
            continue
        if extra := sorted(set(turn) - {"role", "content"}):
            problems.append((where, f"unknown key {extra[0]!r}; a turn has 'role' and 'content'"))
        if turn.get("role") not in ROLES:
            problems.append((f"{where}.role", f"must be one of {', '.join(ROLES)}, got {shorten(turn.get('role'))}"))
        if message := _text_problem(turn.get("content"), "give the turn's text", allow_layout=True):
            problems.append((f"{where}.content", message))
    if isinstance(value[-1], Mapping) and value[-1].get("role") != "user":
        problems.append((f"messages[{len(value) - 1}].role", "the last turn must be the user's: the model answers it"))
    return problems


def check_category(value: Any) -> str | None:
    return _text_problem(value, "leave it out to use the default category 'all'")


def _choice_problems(value: Any) -> list[str]:
    if not isinstance(value, (list, tuple)):
        return [f"must be a list of strings, got {type_name(value)}; for a generative probe leave 'choices' out"]
    if len(value) < 2:
        return [f"needs at least 2 choices, got {len(value)}"]
    problems = []
    for i, choice in enumerate(value):
        if not isinstance(choice, str):
            problems.append(f"choice at index {i} must be a string, got {type_name(choice)} {choice!r}")
        elif not choice.strip():
            problems.append(f"choice at index {i} is empty; every choice needs text")
        elif message := unkeepable(choice, allow_layout=True):
            problems.append(f"choice at index {i} {message}")
        elif choice in value[:i]:  # ties go to the lowest index, so the later copy could never be chosen
            problems.append(f"choice at index {i} repeats choice {value.index(choice)} ({shorten(choice)}); reword one")
    return problems


def _check_mc_answer(row: Mapping[str, Any], choices: Sequence[Any] | None) -> str | None:
    """``choices`` is None when their number is unknown."""
    if "answer" not in row:
        return "missing; give the 0-based index of the correct choice" + _misspelled(row, "answer")
    answer = row["answer"]
    span = "" if choices is None else f" (0 to {len(choices) - 1})"
    if not is_int(answer):
        hint = ""  # the index, when the answer was written as a choice's text or a quoted digit
        if isinstance(answer, str) and choices is not None and answer in choices:
            hint = f"; choice {answer!r} is at index {list(choices).index(answer)}, write that"
        elif isinstance(answer, str) and answer.strip().isdigit():
            hint = f'; write {answer.strip()} not "{answer}"'
        return f"must be an integer index into 'choices'{span}, got {type_name(answer)} {answer!r}{hint}"
    if choices is not None and not 0 <= answer < len(choices):
        return f"index {answer} is out of range; 'choices' has {len(choices)} entries, so use 0 to {len(choices) - 1}"
    return None


def _never_extracted(answer: str, mode: Any) -> str | None:
    """Why no output could ever match ``answer`` under this extract mode, or ``None``."""
    if mode == "number" and normalize_number(answer) is None:
        why = "but extract is 'number' (the output's last number is compared with it); write it, or use another mode"
        return f"{shorten(answer)} is not a number of at most {MAX_NUMBER_DIGITS} digits written out, {why}"
    if mode == "letter" and not re.fullmatch(r"\(?[A-Za-z]\)?", answer.strip()):
        why = "but extract is 'letter' (a choice letter such as 'B' is compared with it); write it, or use another mode"
        return f"{shorten(answer)} is not a single letter, {why}"
    return None


def _check_extract(value: Any) -> str | None:
    modes = ", ".join(repr(m) for m in EXTRACT_MODES)
    if not isinstance(value, str):
        return f"must be a string ({modes} or a regex), got {type_name(value)}"
    if value in EXTRACT_MODES:
        return None
    if not value.strip():
        return f"is empty; use {modes}, a regex with one capture group, or leave it out"
    if re.fullmatch(r"[A-Za-z_]+", value):
        # A bare word is a typo'd mode far more often than an intended regex.
        return f"unknown extract mode {value!r}{suggestion(value, EXTRACT_MODES)}; use {modes}, or a regex with exactly one capture group"
    if problem := pattern_problem(value):
        return f"regex {shorten(value)} {problem}; or use one of {modes}"
    groups = compiled(value).groups
    if groups != 1:
        fix = "wrap the answer part in (...)" if groups == 0 else "make the other groups non-capturing with (?:...)"
        return f"regex {value!r} has {groups} capture groups but needs exactly one (the answer); {fix}"
    return None


#: Fields a kind of probe cannot have, and why (``arguments_match``: any kind but a tool call).
_NOT_FOR = {
    ProbeKind.BEHAVIOUR: ("choices", "answer", "extract", "tools"),
    ProbeKind.MULTIPLE_CHOICE: ("extract",),
    ProbeKind.TOOL_CALL: ("choices", "extract"),
}
_WHY_NOT = {
    ProbeKind.BEHAVIOUR: "a behaviour probe (one with 'check') has no '{}': remove it, or 'check' for a question",
    ProbeKind.MULTIPLE_CHOICE: "{} applies only to generative probes; remove it from this multiple-choice row",
    ProbeKind.TOOL_CALL: "a tool-call probe (one with 'tools') is judged by its call: remove '{}'",
}


def parse_row(row: Mapping[str, Any]) -> Probe | list[FieldProblem]:
    """Validate one probe row: the Probe, or every problem found in it."""
    # None counts as absent for optional fields: Arrow-backed datasets pad missing keys with None.
    optional = ("choices", "category", "extract", "check", "group", "messages", "tools", "arguments_match")
    present = {k: v for k, v in row.items() if not (k in optional and v is None)}
    kind = ProbeKind.of(present)
    texts = {"id": "give every probe a unique string id"}
    if "messages" not in present:
        texts["question"] = "give the full prompt text (or, for a conversation, 'messages')"
    if kind is ProbeKind.GENERATIVE:
        why = "this row has no 'choices', so it is generative"
        texts["answer"] = f"give the reference answer as a string ({why})" + _misspelled(present, "choices")
    problems: list[FieldProblem] = []
    for fld, need in texts.items():
        if fld not in present:
            message = f"missing; {need}" + _misspelled(present, fld)
        elif not (message := _text_problem(present[fld], need, allow_layout=fld != "id")) and fld == "answer":
            message = _never_extracted(present[fld], present.get("extract"))
        if message:
            problems.append((fld, message))
    if "messages" in present:
        if "question" in present:
            problems.append(("messages", "give 'question' or 'messages' (a conversation), not both"))
        if kind is ProbeKind.MULTIPLE_CHOICE:
            problems.append(("messages", "a conversation is asked for a generated reply: give it no 'choices'"))
        problems += messages_problems(present["messages"])
    if "category" in present and (message := check_category(present["category"])):
        problems.append(("category", message))
    if "group" in present and (message := _text_problem(present["group"], "name the question its wordings share")):
        problems.append(("group", message))
    if kind is ProbeKind.BEHAVIOUR:
        problems += check_problems(present["check"])
    elif kind is ProbeKind.TOOL_CALL:
        problems += tools_problems(present["tools"])
        if "answer" not in present:
            problems.append(("answer", 'missing; give the expected call {"name": ..., "arguments": {...}}'))
        else:
            problems += call_problems(present["answer"], present["tools"])
        if present.get("arguments_match", "exact") not in ARGUMENT_MATCHES:
            message = f"must be one of {', '.join(ARGUMENT_MATCHES)}, got {shorten(present['arguments_match'])}"
            problems.append(("arguments_match", message))
    elif kind is ProbeKind.MULTIPLE_CHOICE:
        problems += [("choices", message) for message in _choice_problems(present["choices"])]
        # Bad entries do not change the count, so the answer's range can still be checked.
        choices = present["choices"]
        countable = choices if isinstance(choices, (list, tuple)) and len(choices) >= 2 else None
        if message := _check_mc_answer(present, countable):
            problems.append(("answer", message))
    elif "extract" in present and (message := _check_extract(present["extract"])):
        problems.append(("extract", message))
    problems += [(f, _WHY_NOT[kind].format(f)) for f in _NOT_FOR.get(kind, ()) if f in present]
    if "arguments_match" in present and kind is not ProbeKind.TOOL_CALL:
        problems.append(("arguments_match", "arguments_match goes with a tool-call probe (one with 'tools')"))
    if problems:
        return problems

    simple = ("id", "category", "extract", "group", "check", "arguments_match")
    given = {k: copy.deepcopy(present[k]) for k in simple if k in present}
    messages = tuple(dict(m) for m in present["messages"]) if "messages" in present else None
    answer = present.get("answer")
    if kind is ProbeKind.TOOL_CALL:
        answer = {"name": answer["name"], "arguments": copy.deepcopy(dict(answer.get("arguments", {})))}
    return Probe(
        **given,
        question=messages[-1]["content"] if messages else present["question"],
        messages=messages,
        answer=int(answer) if kind is ProbeKind.MULTIPLE_CHOICE else answer,
        tools=tuple(copy.deepcopy(dict(t)) for t in present["tools"]) if "tools" in present else None,
        choices=tuple(present["choices"]) if kind is ProbeKind.MULTIPLE_CHOICE else None,
        meta={k: v for k, v in present.items() if k not in PROBE_FIELDS},
    )


class RowCollector(Rows[Probe]):
    """Validates probe rows one by one: the probes, every problem with its line or record, repeated ids."""

    def __init__(self, source: str, unit: str):
        super().__init__(source, unit, parse_row, ProbeError, "no probes found; add at least one probe row")

    def finish(self) -> list[Probe]:
        members: dict[str, list[Probe]] = {}
        for probe in self.values:
            if probe.group is not None:
                members.setdefault(probe.group, []).append(probe)
        for group, probes in members.items():  # each problem on the line of the probe that shows it
            if len(probes) == 1:
                message = f"group {shorten(group)} has this probe alone; a group is one question in two or more "
                self.problem(self._first_seen[probes[0].id], "group", message + "wordings: add one, or drop 'group'")
            elif other := next((p for p in probes if p.category != probes[0].category), None):
                first = f"in category {shorten(probes[0].category)} (probe {shorten(probes[0].id)})"
                message = f"and here in {shorten(other.category)}; a question's wordings share one category"
                self.problem(self._first_seen[other.id], "group", f"group {shorten(group)} is {first} {message}")
        probes = super().finish()
        long = [len(p.question) for p in probes if len(p.question) > LONG_QUESTION]
        if long:  # one warning for them all
            why = f"(the longest {max(long)}), more than a model sees: each is cut from the left to what it can see"
            logger.warning(f"{self.source}: {len(long)} question(s) are longer than {LONG_QUESTION} characters {why}")
        return probes
