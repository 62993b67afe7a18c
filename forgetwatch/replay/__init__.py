"""Repair while training: :class:`~forgetwatch.ReplayPool` (text kept apart from the probes) and
:class:`~forgetwatch.Replay`, which trains on it (docs/replay.md)."""

from forgetwatch.replay.kept import ReplayFileError
from forgetwatch.replay.pool import ReplayPool
from forgetwatch.replay.replay import Replay
from forgetwatch.replay.rows import ReplayPoolError

__all__ = ["Replay", "ReplayFileError", "ReplayPool", "ReplayPoolError"]
