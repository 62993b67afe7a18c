"""Probe rows from any source, validated by the one row collector
(:class:`forgetwatch.common.rows.Rows`) with the probe schema, and one warning for questions too long
to see."""

from __future__ import annotations

import logging

from forgetwatch.common.rows import Rows
from forgetwatch.probes.schema import LONG_QUESTION, Probe, ProbeError, parse_row

logger = logging.getLogger(__name__)


class RowCollector(Rows[Probe]):
    """Validates probe rows one by one: the probes, every problem (capped, all counted) with its
    line or record, and ids that repeat.

    Example:
        >>> rows = RowCollector("<records>", "record")
        >>> rows.add(1, {"id": "q1", "question": "2+2=", "answer": "4"})
        >>> [p.id for p in rows.finish()]
        ['q1']
    """

    def __init__(self, source: str, unit: str):
        super().__init__(source, unit, parse_row, ProbeError, "no probes found; add at least one probe row")

    def finish(self) -> list[Probe]:
        """The valid probes; a :class:`ProbeError` listing every problem if there was any."""
        probes = super().finish()
        long = [len(p.question) for p in probes if len(p.question) > LONG_QUESTION]
        if long:
            logger.warning(
                "%s: %d question(s) are longer than %d characters (the longest %d): more than a "
                "model sees; each is cut from the left to what the model can see before it is "
                "tokenized",
                self.source,
                len(long),
                LONG_QUESTION,
                max(long),
            )
        return probes
