"""Probe sets: the held-out questions whose answers forgetwatch tracks, validated before any model work."""

from forgetwatch.common.problems import MAX_REPORTED as MAX_REPORTED_ERRORS
from forgetwatch.probes.probe_set import ProbeSet, ProbesLike, as_probe_set
from forgetwatch.probes.schema import EXTRACT_MODES, Probe, ProbeError, ProbeKind

__all__ = [
    "EXTRACT_MODES",
    "MAX_REPORTED_ERRORS",
    "Probe",
    "ProbeError",
    "ProbeKind",
    "ProbeSet",
    "ProbesLike",
    "as_probe_set",
]
