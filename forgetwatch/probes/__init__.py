"""Probe sets: the held-out questions whose answers forgetwatch tracks.

A probe file is JSONL, one object per line::

    {"id": "q1", "question": "2 + 2 =", "choices": ["3", "4"], "answer": 1, "category": "math"}
    {"id": "q2", "question": "Question: 6 * 12?\\nAnswer:", "answer": "72", "extract": "number"}

Every row is validated before anything is returned, so a bad file fails before model work.
The package: :mod:`.schema` (one row's fields and checks), :mod:`.rows` (validating rows
from any source, files read by :mod:`forgetwatch.common.rows`), :mod:`.presets` (datasets),
:mod:`.sampling`, :mod:`.probe_set` (:class:`ProbeSet`).
"""

from forgetwatch.common.problems import MAX_REPORTED as MAX_REPORTED_ERRORS
from forgetwatch.common.rows import MAX_FILE_BYTES, MAX_LINE_BYTES
from forgetwatch.probes.probe_set import ProbeSet, ProbesLike, as_probe_set
from forgetwatch.probes.schema import EXTRACT_MODES, LONG_QUESTION, PROBE_FIELDS, Probe, ProbeError, ProbeKind

__all__ = [
    "EXTRACT_MODES",
    "LONG_QUESTION",
    "MAX_FILE_BYTES",
    "MAX_LINE_BYTES",
    "MAX_REPORTED_ERRORS",
    "PROBE_FIELDS",
    "Probe",
    "ProbeError",
    "ProbeKind",
    "ProbeSet",
    "ProbesLike",
    "as_probe_set",
]
