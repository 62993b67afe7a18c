"""Repair while training: the replay pool (text the model may be trained on, kept apart from the
probes, :mod:`.pool`) and :class:`~forgetwatch.replay.replay.Replay`, which trains on it."""

from forgetwatch.replay.kept import ReplayFileError
from forgetwatch.replay.pool import ReplayPool, ReplayPoolError, ReplayRow
from forgetwatch.replay.replay import Replay
from forgetwatch.replay.sampler import ReplaySampler, category_weights

__all__ = [
    "Replay",
    "ReplayFileError",
    "ReplayPool",
    "ReplayPoolError",
    "ReplayRow",
    "ReplaySampler",
    "category_weights",
]
