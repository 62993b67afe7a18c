"""Writing files: atomically (a reader sees the old file or the new one, never half of one),
and as strict JSON (no NaN or infinity, which other JSON readers refuse)."""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import math
import os
import tempfile
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

#: What reading a damaged or hostile ``.npz`` raises: zipfile, zlib and numpy each fail with
#: their own types (numpy's NotImplementedError: pickled object arrays, which are never loaded).
NPZ_ERRORS: tuple[type[BaseException], ...] = (
    KeyError,
    ValueError,
    TypeError,
    OSError,
    EOFError,
    RecursionError,
    zipfile.BadZipFile,
    zlib.error,
    NotImplementedError,
)

_TMP = ".tmp"  # the ending of atomic_write's temporary files


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], mode: str = "w") -> Iterator[IO]:
    """Open a temporary file beside ``path``; on success move it over ``path``.

    If the block raises, ``path`` is left as it was and the temporary file is removed.

    Example:
        >>> with atomic_write("/tmp/example.json") as f:
        ...     _ = f.write("{}")
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=_TMP, dir=path.parent)
    try:
        os.chmod(tmp, _mode_for(path))
        encoding = None if "b" in mode else "utf-8"
        with os.fdopen(fd, mode, encoding=encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def leftover_temporaries(directory: str | os.PathLike[str], names: Iterable[str]) -> list[Path]:
    """The temporary files that :func:`atomic_write` calls to ``directory/<name>`` left there
    when their process was killed mid-write (``.<name>.XXXXXXXX.tmp``), for ``names`` only.

    Example:
        >>> leftover_temporaries("/nonexistent", ["history.jsonl"])
        []
    """
    directory = Path(directory)
    return sorted(p for name in names for p in directory.glob(f".{glob.escape(name)}.*{_TMP}") if p.is_file())


def _mode_for(path: Path) -> int:
    """The existing file's permissions, else what a plain ``open`` would give (mkstemp: 0600)."""
    try:
        return path.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def json_safe(value: Any, *, infinity_as_text: bool = False) -> Any:
    """``value`` with every NaN made ``None`` (``null``), recursively; tuples become lists.

    Strict JSON has no NaN or infinity, and every file forgetwatch writes is strict JSON.
    Infinities become ``None`` too, or with ``infinity_as_text`` the strings ``"inf"`` /
    ``"-inf"``, which ``float()`` reads back (for values where infinity means something,
    unlike "unknown").

    Example:
        >>> json_safe({"a": [float("nan"), 1.5], "b": (float("-inf"),)})
        {'a': [None, 1.5], 'b': [None]}
        >>> json_safe([float("-inf")], infinity_as_text=True)
        ['-inf']
    """
    if isinstance(value, float):  # numpy's float64 too
        if math.isfinite(value):
            return float(value)
        if infinity_as_text and not math.isnan(value):
            return "inf" if value > 0 else "-inf"
        return None
    if isinstance(value, dict):
        return {k: json_safe(v, infinity_as_text=infinity_as_text) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v, infinity_as_text=infinity_as_text) for v in value]
    return value


def strict_dumps(value: Any, *, sort_keys: bool = False) -> str:
    """``value`` as strict JSON text (NaN as ``null``, see :func:`json_safe`), UTF-8 kept as is.

    Example:
        >>> strict_dumps({"f": float("nan"), "id": "é"})
        '{"f": null, "id": "é"}'
    """
    return json.dumps(json_safe(value), ensure_ascii=False, allow_nan=False, sort_keys=sort_keys)


def strict_dump(value: Any, f: IO[str]) -> None:
    """Write ``value`` to ``f`` as strict JSON (see :func:`strict_dumps`)."""
    json.dump(json_safe(value), f, ensure_ascii=False, allow_nan=False)


def json_line(record: Any) -> str:
    """One strict JSON line, newline included: a record of a ``.jsonl`` file.

    Example:
        >>> json_line({"step": 1, "loss": float("inf")})
        '{"step": 1, "loss": null}\\n'
    """
    return strict_dumps(record) + "\n"


def content_hash(items: Iterable[Any]) -> Any:
    """A sha256 of ``items``, each as one JSON line (keys sorted): what a set of rows is, for
    fingerprints (``.hexdigest()[:16]``); more may be added to it before.

    Example:
        >>> content_hash([{"id": "q1"}]).hexdigest()[:16] == content_hash([{"id": "q2"}]).hexdigest()[:16]
        False
    """
    h = hashlib.sha256()
    for item in items:
        h.update(json.dumps(item, sort_keys=True, ensure_ascii=False).encode())
        h.update(b"\n")
    return h
