"""Validating probe rows one by one, from any source: the probes, every problem (capped, all
counted) with its line or record, ids that repeat, and one warning for questions too long to see."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ..problems import Problems
from ..strict_json import value_problem
from .schema import LONG_QUESTION, Probe, ProbeError, parse_row, type_name

logger = logging.getLogger(__name__)


class RowCollector:
    """Validates rows one by one, remembering probes, first-seen ids and the problems found.

    Example:
        >>> rows = RowCollector("<records>", "record")
        >>> rows.row(1, {"id": "q1", "question": "2+2=", "answer": "4"})
        >>> [p.id for p in rows.finish()]
        ['q1']
    """

    def __init__(self, source: str, unit: str):
        self.source = source
        self.unit = unit
        self.probes: list[Probe] = []
        self.problems = Problems(source, unit)
        self.first_seen: dict[str, int] = {}

    def error(self, where: int | None, fld: str | None, message: str) -> None:
        self.problems.add(where, fld, message)

    def row(self, where: int, row: Any, *, read_strictly: bool = False) -> None:
        """Validate one row; ``read_strictly``: it comes from :func:`forgetwatch.strict_json.loads`,
        which has already checked that it can be kept as strict JSON."""
        if not isinstance(row, Mapping):
            kind = "a JSON object ({...})" if self.unit == "line" else "a mapping (dict)"
            self.error(where, None, f"expected {kind}, got {type_name(row)}")
            return
        # first, whether the row can be kept as strict JSON at all (rows built in code may hold
        # anything): its fields are read only then, so no check meets a NaN or a 5,000-digit int
        unkeepable = None if read_strictly else value_problem(row)
        parsed = [(unkeepable[0] or None, unkeepable[1])] if unkeepable else parse_row(row)
        # Track ids of invalid rows too, so a duplicate is reported now rather than after a fix.
        pid = row.get("id")
        duplicate = isinstance(pid, str) and pid in self.first_seen
        if duplicate:
            self.error(where, "id", f"duplicate id {pid!r} (first used on {self.unit} "
                                    f"{self.first_seen[pid]}); ids must be unique")
        elif isinstance(pid, str):
            self.first_seen[pid] = where
        if isinstance(parsed, list):
            for fld, message in parsed:
                self.error(where, fld, message)
        elif not duplicate:
            self.probes.append(parsed)

    def finish(self) -> list[Probe]:
        """The valid probes; a :class:`ProbeError` listing every problem if there was any."""
        self.problems.raise_if_any(ProbeError)
        if not self.probes:
            raise ProbeError([(self.source, None, None, "no probes found; add at least one probe row")], self.unit)
        long = [len(p.question) for p in self.probes if len(p.question) > LONG_QUESTION]
        if long:
            logger.warning("%s: %d question(s) are longer than %d characters (the longest %d): more than a "
                           "model sees; each is cut from the left to what the model can see before it is "
                           "tokenized", self.source, len(long), LONG_QUESTION, max(long))
        return self.probes
