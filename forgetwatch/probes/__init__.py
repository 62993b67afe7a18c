"""Probe sets: the held-out questions whose answers forgetwatch tracks, validated before any model work."""

from forgetwatch.probes.probe_set import ProbeSet, ProbesLike, as_probe_set
from forgetwatch.probes.schema import EXTRACT_MODES, Probe, ProbeError, ProbeKind

__all__ = [
    "EXTRACT_MODES",
    "Probe",
    "ProbeError",
    "ProbeKind",
    "ProbeSet",
    "ProbesLike",
    "as_probe_set",
]
