"""IFEval's verifiable instructions as a behaviour check, through lm-eval-harness's implementation; every parameter
is checked at load (:data:`ARGUMENTS`), so IFEval never draws one at random or reads it as a regex."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any
from unittest import mock

from forgetwatch.behaviour.values import count, got, rule, strings, text
from forgetwatch.common.text import shorten, suggestion

REFUSED = {
    "length_constraints:number_sentences": "it needs NLTK's punkt data (a pickle, downloaded on first use); "
    "use the max_sentences check instead"
}
#: Instructions that read NLTK data: refused at load where it is not installed.
NEEDS_NLTK_DATA = {"change_case:capital_word_frequency": "tokenizers/punkt_tab"}
#: lm-eval's comparison relations (its ``_COMPARISON_RELATION``; a test holds them equal).
RELATIONS = ("less than", "at least")
#: What makes a string a regular expression rather than text (``.`` only widens a match).
_PATTERN_SYNTAX = set("\\()[]{}|*+?^$")
#: What ends the first word of a paragraph for ``nth_paragraph_first_word``.
_WORD_ENDS = set(".,?!'\"")
_DRAWN = " (IFEval draws a random one otherwise)"


@functools.cache
def registry() -> Mapping[str, type]:
    """IFEval's instruction classes by id (lm-eval-harness's registry)."""
    try:
        import langdetect
        import nltk

        # lm-eval's IFEval module calls nltk.download when imported: nothing is fetched
        with mock.patch.object(nltk, "download", lambda *args, **kwargs: False):
            from lm_eval.tasks.ifeval.instructions_registry import INSTRUCTION_DICT
    except ImportError as exc:
        raise ImportError(
            f"the 'ifeval' check needs lm-eval-harness's IFEval instructions ({exc}); install them "
            "with: pip install 'forgetwatch[ifeval]'"
        ) from exc
    langdetect.DetectorFactory.seed = 0  # its language guesses are random otherwise
    return INSTRUCTION_DICT


def _plain(value: Any) -> str | None:
    """Text IFEval searches for with ``re``: a pattern character could make it backtrack without end."""
    if problem := text(value):
        return problem
    if used := sorted(_PATTERN_SYNTAX & set(value)):
        return f"{shorten(value)} holds {' '.join(used)}: IFEval searches for it as a regex; give plain text"
    return None


_plain_list = strings(_plain, " (IFEval reads a lone string letter by letter, and draws random words for none)")


_relation = rule(lambda v: isinstance(v, str) and v in RELATIONS, " or ".join(map(repr, RELATIONS)))
_letter = rule(
    lambda v: isinstance(v, str) and len(v) == 1 and "a" <= v.lower() <= "z",
    "one letter a-z (IFEval counts a random letter otherwise)",
)


def _language(value: Any) -> str | None:
    from lm_eval.tasks.ifeval.instructions_util import LANGUAGE_CODES

    if isinstance(value, str) and value in LANGUAGE_CODES:
        return None
    return f"must be one of IFEval's language codes ({', '.join(LANGUAGE_CODES)}), {got(value)}"


def _first_word(value: Any) -> str | None:
    if problem := text(value):
        return problem
    if any(ch.isspace() or ch in _WORD_ENDS for ch in value):
        ends = "IFEval compares a paragraph's first word (up to a space or . , ? ! ' \") with it: none could pass"
        return f"{shorten(value)} is not one word: {ends}"
    return None


#: Each IFEval parameter's rule: the values lm-eval uses as given (a test checks every parameter has one).
ARGUMENTS: dict[str, Callable[[Any], str | None]] = {
    **dict.fromkeys(
        "num_words num_placeholders num_bullets num_highlights num_sections num_paragraphs frequency let_frequency "
        "capital_frequency".split(),
        count(0, _DRAWN),
    ),
    "nth_paragraph": count(1, _DRAWN),  # and at most num_paragraphs: checked in instruction_problem
    **dict.fromkeys(["relation", "let_relation", "capital_relation"], _relation),
    **dict.fromkeys(["keywords", "forbidden_words"], _plain_list),
    **dict.fromkeys(["keyword", "section_spliter", "postscript_marker"], _plain),
    **dict.fromkeys(["end_phrase", "prompt_to_repeat"], text),
    "letter": _letter,
    "language": _language,
    "first_word": _first_word,
}


@functools.cache
def _has_nltk_data(path: str) -> bool:
    import nltk

    try:
        return bool(nltk.data.find(path))
    except LookupError:
        return False


def _parameters(cls: type) -> list[str]:
    return [n for n in inspect.signature(cls.build_description).parameters if n != "self"]


def _entries(value: Any) -> list[tuple[str, dict[str, Any]]]:
    return [(e, {}) if isinstance(e, str) else (e["id"], dict(e.get("kwargs") or {})) for e in value]


def instruction_problem(value: Any) -> tuple[str, str] | None:
    """Why ``value`` is not a list of IFEval instructions this process can check, as ``(where, message)``."""
    if not isinstance(value, list) or not value:
        return "", f'must be a non-empty list of instruction ids or {{"id", "kwargs"}} objects, {got(value)}'
    for i, entry in enumerate(value):
        if isinstance(entry, Mapping):
            if not isinstance(entry.get("id"), str) or set(entry) - {"id", "kwargs"}:
                return f"[{i}]", f'must be {{"id": "<instruction id>", "kwargs": {{...}}}}, got {shorten(entry)}'
            if not isinstance(entry.get("kwargs", {}), Mapping):
                return f"[{i}].kwargs", f"must be an object of the instruction's parameters, {got(entry['kwargs'])}"
        elif not isinstance(entry, str):
            return f"[{i}]", f"must be an instruction id (a string) or an object, {got(entry)}"
    try:
        known = registry()
    except ImportError as exc:
        return "", str(exc)
    for i, (name, kwargs) in enumerate(_entries(value)):
        if name in REFUSED:
            return f"[{i}]", f"{name!r} is not supported: {REFUSED[name]}"
        if name not in known:
            return f"[{i}]", f"unknown IFEval instruction {shorten(name)}{suggestion(name, known)}"
        if name in NEEDS_NLTK_DATA and not _has_nltk_data(NEEDS_NLTK_DATA[name]):
            data = NEEDS_NLTK_DATA[name].rsplit("/", 1)[-1]
            install = f"every response would fail it); install it with: python -m nltk.downloader {data}"
            return f"[{i}]", f"{name!r} needs NLTK's {data} data, not installed here ({install}"
        wanted = _parameters(known[name])
        takes = ", ".join(wanted) or "none"
        if any(kwargs.get(p) is None for p in wanted):
            return f"[{i}].kwargs", f"{name!r}: give every parameter ({takes}), or IFEval draws the missing at random"
        if extra := sorted(set(kwargs) - set(wanted)):
            return f"[{i}].kwargs", f"{name!r}: unknown parameter(s) {', '.join(map(shorten, extra))}; it takes {takes}"
        for arg in wanted:
            check = ARGUMENTS.get(arg)
            if check is None:  # a parameter of a newer lm-eval: whether it is used as given is unknown
                why = "no rule for this parameter of this lm-eval version, so cannot tell if IFEval uses it as given"
                return f"[{i}].kwargs.{arg}", f"{name!r}: forgetwatch has {why}"
            if problem := check(kwargs[arg]):
                return f"[{i}].kwargs.{arg}", problem
        if "nth_paragraph" in kwargs and kwargs["nth_paragraph"] > kwargs["num_paragraphs"]:
            past = f"{kwargs['nth_paragraph']} is past num_paragraphs {kwargs['num_paragraphs']}"
            return f"[{i}].kwargs.nth_paragraph", f"{past} (IFEval draws a random one then)"
        try:
            known[name](name).build_description(**kwargs)
        except Exception as exc:  # noqa: BLE001 - IFEval raises plain ValueError/TypeError on bad values
            return f"[{i}].kwargs", f"{name!r} refuses its kwargs: {exc}"
    return None


def follows(value: list[Any], response: str) -> bool:
    """Whether ``response`` follows every instruction of ``value``; an instruction that raises raises here."""
    known = registry()
    for name, kwargs in _entries(value):
        instruction = known[name](name)
        instruction.build_description(**kwargs)
        if not (response.strip() and instruction.check_following(response)):
            return False
    return True
