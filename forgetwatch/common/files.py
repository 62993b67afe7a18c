"""Files written atomically (the old or the new, never half) and as strict JSON; npz read without trusting headers."""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import math
import os
import shutil
import tempfile
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

#: What reading a damaged or hostile ``.npz`` raises (zipfile, zlib and numpy each have their own types).
NPZ_ERRORS = (RuntimeError, KeyError, ValueError, TypeError, OSError, EOFError, RecursionError)
NPZ_ERRORS += (zipfile.BadZipFile, zlib.error, NotImplementedError)

_TMP = ".tmp"  # the ending of atomic_write's temporary files

#: The most bytes an npz read here may unpack to, checked before inflating (a small zip can unpack to gigabytes).
MAX_NPZ_BYTES = 2 << 30


def read_npz(path: str | os.PathLike[str] | IO[bytes]) -> dict[str, np.ndarray]:
    """Every array of an npz file, read once the sizes its headers claim hold up; raises one of :data:`NPZ_ERRORS`."""
    with zipfile.ZipFile(path) as z:
        members = z.infolist()
        if (claimed := sum(m.file_size for m in members)) > MAX_NPZ_BYTES:
            raise ValueError(f"it claims {claimed:,} bytes unpacked, more than the {MAX_NPZ_BYTES:,} an npz may hold")
        arrays: dict[str, Any] = {}  # name -> its member, until every header has been checked
        for member in members:
            name = member.filename.removesuffix(".npy")
            if name == member.filename or name in arrays:
                raise ValueError(f"its member {member.filename[:80]!r} is not one array of its own")
            with z.open(member) as f:
                version = np.lib.format.read_magic(f)
                if version not in _HEADERS:
                    raise ValueError(f"its array {name!r} is .npy version {version}, which forgetwatch does not write")
                shape, _, dtype = _HEADERS[version](f)
                data = member.file_size - f.tell()
            if dtype.hasobject:
                raise ValueError(f"its array {name!r} holds pickled (object) data, which forgetwatch never loads")
            if dtype.itemsize == 0 or math.prod(shape) * dtype.itemsize != data:
                raise ValueError(f"its array {name!r} claims {math.prod(shape):,} entries of {dtype} in {data:,} bytes")
            arrays[name] = member
        for name, member in arrays.items():
            with z.open(member) as f:
                arrays[name] = np.lib.format.read_array(f, allow_pickle=False)
        return arrays


#: the .npy header readers of the versions numpy writes for plain arrays
_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], mode: str = "w") -> Iterator[IO]:
    """Open a temporary file beside ``path``; on success move it over ``path``, else remove it."""
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


@contextlib.contextmanager
def atomic_folder(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary folder beside ``path`` to fill; on success it takes ``path``'s place (a folder there before is
    removed), else it is removed: ``path`` is never half written. A ``FileExistsError`` when ``path`` is a file or a
    link (:func:`check_replaceable_folder`), before anything is written."""
    path = Path(path)
    check_replaceable_folder(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=_TMP, dir=path.parent))
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # as mkdir makes it (mkdtemp: 0700)
        yield tmp
        old = tmp.with_name(tmp.name + ".old")
        had = path.exists()
        if had:
            os.rename(path, old)
        try:
            os.rename(tmp, path)
        except BaseException:
            if had:
                os.rename(old, path)
            raise
        if had:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def check_replaceable_folder(path: str | os.PathLike[str]) -> None:
    """A ``FileExistsError`` when ``path`` is there but is no folder that :func:`atomic_folder` may replace: a file,
    or a link (replacing it would not write where it points)."""
    if os.path.islink(path) or (os.path.exists(path) and not os.path.isdir(path)):
        raise FileExistsError(f"{path}: exists and is not a folder (a file or a link); move it away or write elsewhere")


def leftover_temporaries(directory: str | os.PathLike[str], names: Iterable[str]) -> list[Path]:
    """What :func:`atomic_write` and :func:`atomic_folder` calls to ``directory/<name>`` left there when killed
    mid-write: temporary files, and folders (with the one being replaced)."""
    directory = Path(directory)
    found = (
        p for name in names for end in (_TMP, _TMP + ".old") for p in directory.glob(f".{glob.escape(name)}.*{end}")
    )
    return sorted(p for p in found if p.is_file() or (p.is_dir() and not p.is_symlink()))


def _mode_for(path: Path) -> int:  # the existing file's permissions, else what open() gives (mkstemp: 0600)
    try:
        return path.stat().st_mode & 0o777
    except FileNotFoundError:
        return 0o666 & ~_umask()


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def json_safe(value: Any, *, infinity_as_text: bool = False) -> Any:
    """``value`` with every NaN and infinity made ``None`` (infinities ``"inf"``/``"-inf"`` with
    ``infinity_as_text``), recursively; tuples become lists."""
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
    """``value`` as strict JSON text (NaN as ``null``), UTF-8 kept as is."""
    return json.dumps(json_safe(value), ensure_ascii=False, allow_nan=False, sort_keys=sort_keys)


def json_line(record: Any) -> str:
    return strict_dumps(record) + "\n"


def content_hash(items: Iterable[Any]) -> Any:
    """A sha256 of ``items``, each as one JSON line (keys sorted), for fingerprints."""
    h = hashlib.sha256()
    for item in items:
        h.update(json.dumps(item, sort_keys=True, ensure_ascii=False).encode())
        h.update(b"\n")
    return h
