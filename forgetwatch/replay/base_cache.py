"""The base model's next-token distribution on the replay rows, kept once, for ``replay_loss="kl"``;
and the one reader of replay's kept JSON files.

At each position of each row, the ``k`` most likely next tokens with their log-probabilities,
and the log of the mass outside them: enough for KL(base ‖ current) with no second model in
memory. Computed when the base snapshot is taken and stored beside it (npz, never pickle) with
the key of what it was made from, copied into checkpoints, and on resume read back only when
every array checks out (:meth:`BaseDistribution.problem`) and the key is this run's.

The distribution itself, and the KL against it, are :mod:`forgetwatch.scoring.next_tokens`'s,
which the train-KL signal (:mod:`forgetwatch.run.train_kl`) shares: one computation for both.

Example:
    >>> ReplayFileError("replay_base.npz", "damaged").reason
    'damaged'
"""

from __future__ import annotations

import os
from typing import Any

from forgetwatch.common import strict_json
from forgetwatch.common.text import first_line
from forgetwatch.scoring.next_tokens import BaseDistribution, KeptFileError, base_distribution, kl_to_base

__all__ = ["BaseDistribution", "ReplayFileError", "base_distribution", "kl_to_base", "read_kept_json"]

#: A kept replay file (``replay.json``, ``replay_base.npz``, ``replay_scan.json``,
#: ``replay_answers.json``, a history record's replay state) that cannot serve this run: one
#: class with every kept file's error.
ReplayFileError = KeptFileError


def read_kept_json(path: str | os.PathLike[str], limit: int, form: str | None = None) -> Any:
    """The JSON in a kept replay file; a :class:`ReplayFileError` names the file and why it cannot
    be read (over ``limit`` bytes, not UTF-8, not JSON, numbers past what JSON keeps, or not an
    object of ``"format": form`` when ``form`` is given)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(limit + 1)
        if len(raw) > limit:
            raise ValueError(f"over {limit >> 20} MiB")
        value = strict_json.loads(raw.decode("utf-8"))
    except (OSError, ValueError) as err:  # JSON, strict JSON and UTF-8 errors are ValueErrors
        raise ReplayFileError(path, f"damaged: {first_line(err)}") from None
    if form is not None and (not isinstance(value, dict) or value.get("format") != form):
        raise ReplayFileError(path, f"damaged: not a {form} file")
    return value
