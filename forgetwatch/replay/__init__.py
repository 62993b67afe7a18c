"""Repair while training: the replay pool (text the model may be trained on, kept apart from
the probes, :mod:`.pool`), which of its rows to replay next (:mod:`.sampler`), and the
gradient replaying them adds (:mod:`.penalty`)."""

from forgetwatch.replay.base_cache import ReplayFileError
from forgetwatch.replay.pool import ReplayPool, ReplayPoolError, ReplayRow
from forgetwatch.replay.sampler import ReplaySampler, category_weights

__all__ = ["ReplayFileError", "ReplayPool", "ReplayPoolError", "ReplayRow", "ReplaySampler", "category_weights"]
