"""Repair while training: the replay pool (text the model may be trained on, kept apart from
the probes). :mod:`.pool` holds :class:`ReplayPool`."""

from .pool import ReplayPool, ReplayPoolError, ReplayRow

__all__ = ["ReplayPool", "ReplayPoolError", "ReplayRow"]
