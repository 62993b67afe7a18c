"""IFEval's verifiable instructions as a behaviour check (``"ifeval": [...]``), through the
implementation lm-eval-harness ships (``pip install 'forgetwatch[ifeval]'``), not a copy.

An entry is an instruction id, or ``{"id": ..., "kwargs": {...}}`` for one with parameters.
Every parameter must be given: IFEval draws a missing one at random, and a check that changes
between evaluations would make flips out of nothing. ``length_constraints:number_sentences``
is refused: lm-eval splits sentences with NLTK's punkt model, a pickled file downloaded on
first use; the ``max_sentences`` check does that job here. lm-eval's module tries to download
NLTK data when it is imported; forgetwatch imports it with downloads switched off.

Example:
    >>> follows([{"id": "length_constraints:number_words",
    ...           "kwargs": {"num_words": 5, "relation": "less than"}}], "Yes, it is.")  # doctest: +SKIP
    True
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Iterator, Mapping
from typing import Any

from ..text import suggestion

__all__ = ["follows", "instruction_problem"]

REFUSED = {"length_constraints:number_sentences": "it needs NLTK's punkt data (a pickle, downloaded on first use); "
                                                  "use the max_sentences check instead"}


@contextlib.contextmanager
def _no_downloads() -> Iterator[None]:
    """lm-eval's IFEval module calls ``nltk.download`` when imported: nothing is fetched here."""
    import nltk

    saved = nltk.download
    nltk.download = lambda *args, **kwargs: False
    try:
        yield
    finally:
        nltk.download = saved


@functools.cache
def registry() -> Mapping[str, type]:
    """IFEval's instruction classes by id (lm-eval-harness's registry)."""
    try:
        import langdetect

        with _no_downloads():
            from lm_eval.tasks.ifeval.instructions_registry import INSTRUCTION_DICT
    except ImportError as exc:
        raise ImportError(f"the 'ifeval' check needs lm-eval-harness's IFEval instructions ({exc}); install them "
                          "with: pip install 'forgetwatch[ifeval]'") from exc
    langdetect.DetectorFactory.seed = 0  # its language guesses are random otherwise
    return INSTRUCTION_DICT


def _parameters(cls: type) -> list[str]:
    return [n for n in inspect.signature(cls.build_description).parameters if n != "self"]


def _entries(value: Any) -> list[tuple[str, dict[str, Any]]]:
    return [(e, {}) if isinstance(e, str) else (e["id"], dict(e.get("kwargs") or {})) for e in value]


def instruction_problem(value: Any) -> str | None:
    """Why ``value`` is not a list of IFEval instructions this process can check, or ``None``."""
    if not isinstance(value, list) or not value:
        return ('must be a non-empty list of instruction ids, or {"id": ..., "kwargs": {...}} objects, '
                f"got {type(value).__name__}")
    for i, entry in enumerate(value):
        if isinstance(entry, Mapping):
            if not isinstance(entry.get("id"), str) or not isinstance(entry.get("kwargs", {}), Mapping) \
                    or set(entry) - {"id", "kwargs"}:
                return f'entry {i} must be {{"id": "<instruction id>", "kwargs": {{...}}}}, got {dict(entry)!r:.80}'
        elif not isinstance(entry, str):
            return f"entry {i} must be an instruction id (a string) or an object, got {entry!r:.40}"
    try:
        known = registry()
    except ImportError as exc:
        return str(exc)
    for i, (name, kwargs) in enumerate(_entries(value)):
        if name in REFUSED:
            return f"entry {i}: {name!r} is not supported: {REFUSED[name]}"
        if name not in known:
            return f"entry {i}: unknown IFEval instruction {name!r}{suggestion(name, known)}"
        wanted = _parameters(known[name])
        missing, extra = [p for p in wanted if kwargs.get(p) is None], sorted(set(kwargs) - set(wanted))
        if missing or extra:
            what = (f"give every parameter ({', '.join(wanted)}), or IFEval draws the missing at random"
                    if missing else f"unknown parameter(s) {', '.join(extra)}; it takes {', '.join(wanted) or 'none'}")
            return f"entry {i}: {name!r}: {what}"
        try:
            known[name](name).build_description(**kwargs)
        except Exception as exc:  # noqa: BLE001 - IFEval raises plain ValueError/TypeError on bad values
            return f"entry {i}: {name!r} refuses its kwargs: {exc}"
    return None


def follows(value: list[Any], response: str) -> bool:
    """Whether ``response`` follows every instruction of ``value`` (checked with
    :func:`instruction_problem` first). An instruction that raises on a response raises here:
    :func:`~forgetwatch.behaviour.checks.failed_checks` counts that as failing, with a warning."""
    known = registry()
    for name, kwargs in _entries(value):
        instruction = known[name](name)
        instruction.build_description(**kwargs)
        if not (response.strip() and instruction.check_following(response)):
            return False
    return True
