"""Bad input reported one way: every problem found, each naming its source, line and key, raised together."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from forgetwatch.common.text import first_line, shorten

MAX_REPORTED = 20  # most problems one error lists; the rest are counted in a last line


class Problem(NamedTuple):
    """One problem: where it is (``source``, ``line``, ``key``) and what is wrong."""

    source: str
    line: int | None
    key: str | None
    message: str

    def render(self, unit: str, noun: str) -> str:
        where = self.source if self.line is None else f"{self.source}: {unit} {self.line}"
        if self.key is not None:
            where += f": {noun} {shorten(self.key)}"
        return f"{where}: {self.message}"


class InputError(ValueError):
    """Bad input, one line per problem: ``errors`` holds the :class:`Problem` tuples (none for a message that names
    its place itself), ``unit`` what ``line`` counts."""

    noun = "key"

    def __init__(self, errors: str | Sequence[Problem | tuple], unit: str = "line"):
        self.errors = [] if isinstance(errors, str) else [Problem(*e) for e in errors]
        self.unit = unit
        super().__init__(
            errors if isinstance(errors, str) else "\n".join(p.render(unit, self.noun) for p in self.errors)
        )


@contextlib.contextmanager
def as_input_error(*types: type[BaseException], prefix: str = "") -> Iterator[None]:
    """The block's (or decorated function's) exceptions of ``types`` raised as an InputError of their first line."""
    try:
        yield
    except types as err:
        raise InputError(prefix + first_line(err)) from err


class Problems:
    """Collects one source's problems (:data:`MAX_REPORTED` kept, all counted), then raises them together."""

    def __init__(self, source: str, unit: str = "line"):
        self.source, self.unit = source, unit
        self.kept: list[Problem] = []
        self.count = 0

    def add(self, line: int | None, key: str | None, message: str) -> None:
        self.extend([Problem(self.source, line, key, message)])

    def extend(self, problems: Sequence[Problem]) -> None:
        for p in problems:
            self.count += 1
            if len(self.kept) < MAX_REPORTED:
                self.kept.append(p)

    def raise_if_any(self, error: type[InputError]) -> None:
        if not self.count:
            return
        shown = list(self.kept)
        if self.count > len(shown):
            more = f"... and {self.count - len(shown)} more problem(s) not shown; fix the ones above and load again"
            shown.append(Problem(self.source, None, None, more))
        raise error(shown, self.unit)
