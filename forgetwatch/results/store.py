"""Writing the files of a monitored run: the base snapshot, the evaluation history, and their
copies in checkpoints (their names, and reading them back: :mod:`forgetwatch.results.run_dir`).

They live in the run's forgetwatch directory and are copied into every checkpoint, so a run
resumed from a checkpoint finds the answers of its original base model (the weights it
resumes with have moved and must never stand in for the base).

A checkpoint's copy is whole or not used: its files are written first, then ``manifest.json``
(each file's size and sha256); :func:`copy_problem` says why a folder cannot be used (no
manifest: the copy was cut short, e.g. by kill -9; a file missing or other than the one
copied), and a resume then falls back to the run directory. The files written once per run
(snapshot, probes, a repair method's) are kept in memory too: a run directory deleted during
training gets them back, and later checkpoints still hold them.

One watch writes in a run directory at a time (:meth:`RunStore.claim`, ``watch.lock``), and a
fresh run never writes over an earlier run's files: it moves all of them into one
``previous-<n>/`` folder first (:meth:`RunStore.set_aside`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
import socket
import tempfile
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from forgetwatch.common import strict_json
from forgetwatch.common.files import atomic_write, json_line, leftover_temporaries, strict_dumps
from forgetwatch.common.text import first_line, shorten
from forgetwatch.results.answers import Answers
from forgetwatch.results.history import HistoryError
from forgetwatch.results.run_dir import (
    HISTORY,
    LATEST,
    LOCK,
    MANIFEST,
    PREVIOUS,
    PROBES,
    SNAPSHOT,
    SUBDIR,
    TRAIN_KL,
    read_records,
)

logger = logging.getLogger(__name__)

# the names of a run directory's files are run_dir's, named from here too
__all__ = [
    "FILES",
    "HISTORY",
    "LATEST",
    "LOCK",
    "MANIFEST",
    "PREVIOUS",
    "PROBES",
    "SNAPSHOT",
    "SUBDIR",
    "TRAIN_KL",
    "NotWritableError",
    "RunStore",
    "copy_problem",
]

#: Every file the monitor itself writes in its folders (a repair method names its own; nothing else there is touched).
FILES = (SNAPSHOT, HISTORY, PROBES, TRAIN_KL, MANIFEST)
_MANIFEST_FORMAT = "forgetwatch.checkpoint"
#: What a write-once file that could not be written costs, for the warning.
_WHAT = {
    SNAPSHOT: "the base snapshot is",
    PROBES: "the probe set (the report's questions) is",
    TRAIN_KL: "the base's distribution on the training rows (train KL) is",
}
#: The stores of this process that wrote a run directory's lock, by the lock's real path
_HOLDERS: weakref.WeakValueDictionary[str, RunStore] = weakref.WeakValueDictionary()


class NotWritableError(OSError):
    """forgetwatch cannot write its files where it was told to (raised when training begins)."""


class RunStore:
    """Snapshot and history files in one directory, and their copies into checkpoints.

    Writes made during training never raise: a failed write (disk full, permissions, a
    directory where a file should be) logs one warning, keeps what was not written in memory,
    and is retried at the next write or :meth:`flush`. :attr:`pending` counts what is still
    owed to the disk. :meth:`check_writable` is the one check that fails fast, before training.

    Example:
        >>> store = RunStore("out/forgetwatch")            # doctest: +SKIP
        >>> store.check_writable()                         # doctest: +SKIP
        >>> store.append_history({"step": 10, "report": {...}})  # doctest: +SKIP
        >>> store.pending                                  # doctest: +SKIP
        0
    """

    def __init__(self, directory: str | os.PathLike[str], own_files: Iterable[str] = ()):
        self.dir = Path(directory)
        self.files = (*FILES, *own_files)  # every file of the run's: the monitor's, and a repair method's
        # the history as the file must hold it before the unwritten records; None: what the
        # file holds (read when a rewrite needs it). Once records are unwritten, the next
        # write rewrites the whole file, so a half-written line never stays in the middle.
        self._written: list[dict[str, Any]] | None = None
        self._unwritten: list[dict[str, Any]] = []
        # the files written once per run, each as the function that writes it to a path: kept,
        # so a run directory that loses them gets them back, and checkpoints still hold them
        self._kept: dict[str, Callable[[Path], Any]] = {}
        self._owed: set[str] = set()  # of those, the ones not on disk
        self._copies: dict[Path, dict[str, Any]] = {}  # checkpoint folders whose copy failed: their extra files
        self._lost_said = False
        self._lock: weakref.finalize | None = None  # removes the lock: at release(), collection or exit
        self._earlier: RunStore | None = None  # the store of this process this one took the directory from
        self._superseded = False  # another store of this process took the directory: nothing more is written
        self._superseded_said = False

    @property
    def snapshot_path(self) -> Path:
        return self.dir / SNAPSHOT

    @property
    def history_path(self) -> Path:
        return self.dir / HISTORY

    @property
    def pending(self) -> int:
        """Writes still owed to the disk: unwritten history records, plus one per unwritten
        snapshot, probe set or replay base, plus one per failed checkpoint copy. ``0``:
        everything is on disk."""
        return len(self._unwritten) + len(self._owed) + len(self._copies)

    def check_writable(self) -> None:
        """Raise :class:`NotWritableError` unless files can be written here: call it when
        training begins, the one time monitoring may stop a run.

        Example:
            >>> RunStore("/proc/forgetwatch").check_writable()  # doctest: +SKIP
            Traceback (most recent call last):
            NotWritableError: forgetwatch cannot write its files in /proc/forgetwatch ...
        """
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            for path in (self.snapshot_path, self.history_path):
                if path.exists() and not path.is_file():
                    raise IsADirectoryError(errno.EISDIR, "not a file", str(path))
            with tempfile.TemporaryFile(dir=self.dir) as probe:
                probe.write(b"forgetwatch")
                probe.flush()
                os.fsync(probe.fileno())
        except OSError as err:
            raise NotWritableError(
                f"forgetwatch cannot write its files in {self.dir} ({err}); it writes the base snapshot and "
                "history there during training: free space or fix the permissions, or choose another "
                "folder with output_dir="
            ) from err

    def claim(self) -> None:
        """Take the run directory for this run alone, before anything is read or written there:
        ``watch.lock`` names this process (pid, host). A live watch of another process keeps it
        (refused); the lock of a process that has ended (killed, crashed) is taken over with a
        warning. In this process, whose watch of a loop that raised cannot be told from a live
        one, the later watch takes the directory over, with a warning: the earlier one writes
        nothing more there, or, when this run sets its files aside (:meth:`set_aside`), goes on
        writing among them. :meth:`release` frees the directory, and so do this store's
        collection and the end of the process.

        Raises:
            NotWritableError: a live watch of another process holds the directory.

        Example:
            >>> store.claim()      # doctest: +SKIP
            >>> store.release()    # doctest: +SKIP
        """
        if self._lock is not None and self._lock.alive:
            return
        path = self.dir / LOCK
        key = os.path.realpath(path)
        text = json.dumps({"pid": os.getpid(), "host": socket.gethostname()})
        try:
            with open(path, "x", encoding="utf-8") as f:  # exclusive: of two starters, one wins
                f.write(text)
        except FileExistsError:
            left_by = _left_by(path)  # raises when a live watch of another process holds it
            if left_by is not None:
                logger.warning("forgetwatch: taking over %s, left by %s", path, left_by)
            with atomic_write(path) as f:
                f.write(text)
        earlier = _HOLDERS.get(key)
        if earlier is not None and earlier._lock is not None and earlier._lock.alive:
            earlier._lock.detach()  # the lock is this store's now
            earlier._superseded, self._earlier = True, earlier
            logger.warning(
                "forgetwatch: another watch of this process wrote in %s and has not finished (its loop raised, "
                "or goes on): this one takes the folder over; that one writes nothing more there, or, if this "
                "run is a fresh one, goes on in the folder its files are moved to",
                self.dir,
            )
        _HOLDERS[key] = self
        self._lock = weakref.finalize(self, _unlock, path, text)

    def release(self) -> None:
        """The run is over: another watch may use the directory (the lock this store wrote is removed)."""
        if self._lock is not None:
            self._lock()

    def set_aside(self) -> Path | None:
        """Before a fresh run: move every file an earlier run left in the run directory (its
        snapshot, history, probes, a repair method's and train-KL files, last answers, damaged histories)
        into one new folder, ``previous-<n>``, so that none is overwritten or mixed with this
        run's; a cached snapshot is read from there. Each file is moved whole, into a
        ``previous.partial`` folder renamed at the end: one cut short (kill -9) is completed by
        the next fresh run. The folder, if there was anything to move.

        Raises:
            NotWritableError: the files cannot be moved (when training begins, before any work).

        Example:
            >>> store.set_aside()       # doctest: +SKIP
            PosixPath('out/forgetwatch/previous-1')
        """
        partial = self.dir / f"{PREVIOUS}.partial"
        names = [n for n in (*self.files, LATEST) if os.path.lexists(self.dir / n)]
        names += sorted(p.name for p in self.dir.glob(f"{HISTORY}.damaged-*"))
        try:
            if partial.is_dir() and any(os.path.lexists(partial / n) for n in names):
                os.replace(partial, self._free_name(PREVIOUS, "", first="-1"))  # two runs' files: kept apart
            if not names and not partial.is_dir():
                return None
            partial.mkdir(exist_ok=True)
            for name in names:
                os.replace(self.dir / name, partial / name)
            aside = self._free_name(PREVIOUS, "", first="-1")
            os.replace(partial, aside)
        except OSError as err:
            raise NotWritableError(
                f"forgetwatch cannot move an earlier run's files in {self.dir} out of the way ({err}); it will "
                "not overwrite them: move them yourself, or choose another folder with output_dir="
            ) from err
        logger.info("forgetwatch: %s held an earlier run's files; moved them, all of them, to %s", self.dir, aside)
        if self._earlier is not None:  # the watch that wrote them goes on writing there
            self._earlier.dir, self._earlier._superseded = aside, False
        return aside

    def _gone(self) -> bool:
        """Whether another watch of this process took the directory over: nothing more is written
        (said once)."""
        if self._superseded and not self._superseded_said:
            self._superseded_said = True
            logger.warning(
                "forgetwatch: another watch of this process took %s over; this watch writes nothing more "
                "there (its evaluations stay in its history)",
                self.dir,
            )
        return self._superseded

    def remove_leftovers(self, folders: Iterable[Path] = ()) -> list[Path]:
        """Remove the temporary files that writes cut short (kill -9) left in the run directory
        and in ``folders`` (checkpoints' forgetwatch folders): only forgetwatch's own, by name.
        Call it when training begins; the paths removed.

        Example:
            >>> store.remove_leftovers(Path("out").glob("checkpoint-*/forgetwatch"))  # doctest: +SKIP
            []
        """
        removed = []
        for folder in dict.fromkeys([self.dir, *folders]):
            for path in leftover_temporaries(folder, (*self.files, LATEST, LOCK)):
                try:
                    path.unlink()
                except OSError as err:
                    logger.warning(
                        "forgetwatch could not remove %s, left by a write cut short (%s)", path, first_line(err)
                    )
                else:
                    removed.append(path)
        if removed:
            logger.info(
                "forgetwatch: removed %d temporary file(s) left by writes cut short: %s",
                len(removed),
                ", ".join(map(str, removed)),
            )
        return removed

    # -- the files written once ----------------------------------------------------------------

    def save_snapshot(self, answers: Answers, *, copy_of: Path | None = None) -> bool:
        """Write the base answers (``copy_of``: a snapshot file holding them, a cached one
        reused: the run directory gets that very file) and keep them for checkpoints; on failure
        retried. Whether they are on disk."""
        if copy_of is not None:
            self._kept[SNAPSHOT] = answers.save
            with contextlib.suppress(OSError):  # else written below
                os.link(copy_of, self.snapshot_path)  # the same bytes: nothing to copy
                return True
        return self._save_once(SNAPSHOT, answers.save)

    def save_probes(self, probes: Any) -> bool:
        """Write the probe set beside the history, for reports (a failure warns, and is retried)."""
        return self._save_once(PROBES, probes.to_jsonl)

    def keep(self, name: str, write: Callable[[Path], Any]) -> bool:
        """Write a file made once for the run (one of :attr:`files`) with ``write(path)`` and
        keep it for checkpoints; on failure it warns and is retried. Whether it is on disk."""
        return self._save_once(name, write)

    def save_latest(self, answers: Answers) -> bool:
        """The last evaluation's answers (with its step in ``meta``), so the report shows what the
        model answers now: replaced at each evaluation, not copied into checkpoints (a resumed
        run writes its own at its first evaluation). A failure warns; the report then says only
        right or wrong."""
        if self._gone():
            return False
        try:
            answers.save(self.dir / LATEST)
        except OSError as err:
            logger.warning(
                "forgetwatch could not write %s (%s): the report will say right or wrong for the answer "
                "now until an evaluation writes it; training goes on",
                self.dir / LATEST,
                first_line(err),
            )
            return False
        return True

    def _save_once(self, name: str, write: Callable[[Path], Any]) -> bool:
        if self._gone():
            return False
        self._kept[name] = write
        self._owed.add(name)
        return self._try_once(name)

    # -- the history ---------------------------------------------------------------------------

    def save_history(self, records: list[dict[str, Any]]) -> bool:
        """Replace the whole history (at the start of a run, or after a resume). Whether it is on disk."""
        if self._gone():
            return False
        self._written, self._unwritten = [], list(records)
        return self._try_history()

    def append_history(self, record: dict[str, Any]) -> bool:
        """Add one record: one write of one whole line, flushed to disk (a crash can cut only
        this line short, and reading it back drops such a line). Whether everything is
        on disk (see :attr:`pending`)."""
        if self._gone():
            return False
        self._find_lost()  # a history file deleted meanwhile is written again whole, not begun anew
        if self._unwritten:  # the file is behind: retried below by one rewrite, this record included
            self._unwritten.append(record)
        else:
            try:
                self._append_line(record)
            except OSError as err:
                self._unwritten.append(record)
                self._warn(self.history_path, err, "this history record is")
                return False
            if self._written is not None:
                self._written.append(record)
        return self.flush()

    def set_aside_damaged(self, records: int) -> Path | None:
        """Before a resume rewrites the history with the ``records`` it could read: move the
        run's history file aside (``history.jsonl.damaged-<n>``) since it holds records that
        could not be read, which are never overwritten. Its new path, if there was a file.

        Raises:
            NotWritableError: it cannot be moved (when training begins, before any work).
        """
        if not self.history_path.is_file():
            return None
        aside = self._free_name(f"{HISTORY}.damaged", "", first="-1")
        try:
            os.replace(self.history_path, aside)
        except OSError as err:
            raise NotWritableError(
                f"forgetwatch cannot move {self.history_path}, which holds records it cannot "
                f"read, out of the way ({err}); it will not overwrite it: move it yourself, "
                "then resume"
            ) from err
        logger.warning(
            "forgetwatch: moved %s to %s: it holds records that could not be read (see above), kept "
            "there; the run's history goes on with the %d record(s) resumed",
            self.history_path,
            aside,
            records,
        )
        self._written = []
        return aside

    def _free_name(self, stem: str, suffix: str, first: str = "") -> Path:
        """``stem + first + suffix`` in the run directory, or with ``-2``, ``-3``, ... if taken."""
        path, n = self.dir / f"{stem}{first}{suffix}", 1
        while path.exists():
            n += 1
            path = self.dir / f"{stem}-{n}{suffix}"
        return path

    # -- checkpoints ---------------------------------------------------------------------------

    def copy_to(self, directory: str | os.PathLike[str], extra: dict[str, Any] | None = None) -> bool:
        """Copy every file of the run into ``directory`` (a checkpoint's forgetwatch folder):
        snapshot, history (unwritten records included), probes, replay base, and ``extra``
        (file name → JSON value, e.g. the replay state at this step); then the manifest that
        makes the copy whole (see :func:`copy_problem`). On failure retried at the next write.
        Whether everything is on disk.

        Example:
            >>> store.copy_to("out/checkpoint-20/forgetwatch", extra={"replay.json": {"drawn": 40}})  # doctest: +SKIP
            True
        """
        if self._gone():
            return False
        target = Path(directory)
        self._copies.pop(target, None)
        self.flush()  # earlier failures first: the copy then finds the history on disk
        if not self._try_copy(target, extra or {}):
            self._copies[target] = extra or {}
        return self.pending == 0

    def flush(self) -> bool:
        """Retry every write still owed (one warning per failure). Whether everything is on disk.

        Example:
            >>> if not store.flush(): print(store.pending, "writes still owed")  # doctest: +SKIP
        """
        if self._gone():
            return False
        self._find_lost()
        for name in sorted(self._owed):
            self._try_once(name)
        if self._unwritten:
            self._try_history()
        for target, extra in list(self._copies.items()):
            # a checkpoint deleted since (rotation) is not made again, without its weights
            if not target.parent.is_dir() or self._try_copy(target, extra):
                del self._copies[target]
        return self.pending == 0

    # -- the writes ----------------------------------------------------------------------------

    def _find_lost(self) -> None:
        """Files written here that are gone (the run directory deleted or emptied during
        training): owed again, from memory, said once."""
        lost = [name for name in self._kept if name not in self._owed and not (self.dir / name).exists()]
        if self._written and not self.history_path.exists():
            self._written, self._unwritten = [], self._written + self._unwritten
            lost.append(HISTORY)
        if not lost:
            return
        self._owed.update(name for name in lost if name != HISTORY)
        if not self._lost_said:
            self._lost_said = True
            logger.warning(
                "forgetwatch: %s disappeared from %s during training (deleted?); forgetwatch writes "
                "what it lost again from memory, here and into every later checkpoint; training goes on",
                ", ".join(lost),
                self.dir,
            )

    def _try_once(self, name: str) -> bool:
        def write() -> None:
            self._kept[name](self.dir / name)
            self._owed.discard(name)

        return self._try(write, self.dir / name, _WHAT.get(name, f"{name} is"))

    def _try_history(self) -> bool:
        return self._try(self._rewrite_history, self.history_path, f"{len(self._unwritten)} history record(s) are")

    def _try_copy(self, target: Path, extra: dict[str, Any]) -> bool:
        return self._try(lambda: self._copy(target, extra), target, "this checkpoint's forgetwatch files are")

    def _try(self, write: Callable[[], None], path: Path, what: str) -> bool:
        """Whether ``write`` succeeded; a failure is logged, once, and not raised."""
        try:
            write()
        except (OSError, HistoryError) as err:  # HistoryError: a damaged file, read to be rewritten
            self._warn(path, err, what)
            return False
        return True

    @staticmethod
    def _warn(path: Path, err: BaseException, what: str) -> None:
        logger.warning(
            "forgetwatch could not write %s (%s): %s kept in memory and will be written at the "
            "next evaluation or checkpoint; training goes on",
            path,
            first_line(err),
            what,
        )

    def _append_line(self, record: dict[str, Any]) -> None:
        self.history_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.history_path, "a", encoding="utf-8") as f:
            f.write(json_line(record))
            f.flush()
            os.fsync(f.fileno())

    def _records(self) -> list[dict[str, Any]]:
        """The whole history: what is on disk, then what is not yet."""
        if self._written is None:
            self._written = read_records(self.dir)
        return self._written + self._unwritten

    def _rewrite_history(self) -> None:
        records = self._records()
        with atomic_write(self.history_path) as f:
            f.writelines(json_line(r) for r in records)
        self._written, self._unwritten = records, []

    def _copy(self, target: Path, extra: dict[str, Any]) -> None:
        target.mkdir(parents=True, exist_ok=True)
        (target / MANIFEST).unlink(missing_ok=True)  # not whole again until the new manifest is written
        names = []
        for name, write in self._kept.items():
            source = self.dir / name
            if name in self._owed or not source.is_file():
                write(target / name)  # from memory: the run directory lost it, or never had it
            else:
                _copy_file(source, target / name)
            names.append(name)
        if self._unwritten or not self.history_path.is_file():
            with atomic_write(target / HISTORY) as f:
                f.writelines(json_line(r) for r in self._records())
        else:  # the file holds every record: copying bytes is cheaper than writing JSON again
            _copy_file(self.history_path, target / HISTORY)
        names.append(HISTORY)
        for name, value in extra.items():
            with atomic_write(target / name) as f:
                f.write(strict_dumps(value))
            names.append(name)
        for name in set(self.files) - set(names) - {MANIFEST}:
            (target / name).unlink(missing_ok=True)  # an earlier copy's, not part of this one
        manifest = {"format": _MANIFEST_FORMAT, "files": {name: _digest(target / name) for name in names}}
        with atomic_write(target / MANIFEST) as f:
            f.write(strict_dumps(manifest))


def copy_problem(directory: str | os.PathLike[str]) -> str | None:
    """Why a checkpoint's forgetwatch folder is not a whole copy, or ``None`` when it is: its
    manifest is there and every file it names has the size and sha256 it lists.

    Example:
        >>> copy_problem("/nonexistent/forgetwatch")
        'no manifest.json: its copy never finished (cut short, e.g. by kill -9) or an older forgetwatch wrote it'
    """
    directory = Path(directory)
    path = directory / MANIFEST
    if not path.is_file():
        return f"no {MANIFEST}: its copy never finished (cut short, e.g. by kill -9) or an older forgetwatch wrote it"
    try:
        manifest = strict_json.loads(path.read_bytes().decode("utf-8"))
        files = manifest["files"]
        if manifest.get("format") != _MANIFEST_FORMAT or not isinstance(files, dict):
            raise ValueError("not a forgetwatch manifest")
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as err:
        return f"{MANIFEST} cannot be read ({first_line(err)})"
    for name, listed in files.items():
        if not isinstance(name, str) or name == MANIFEST or Path(name).name != name or name in ("", ".", ".."):
            return f"{MANIFEST} lists {shorten(name)}, not a file's name"
        file = directory / name
        if not file.is_file():
            return f"{name} is missing"
        try:
            found = _digest(file)
        except OSError as err:
            return f"{name} cannot be read ({first_line(err)})"
        if listed != found:
            return (
                f"{name} is not the file copied there ({found['bytes']} bytes, sha256 {found['sha256'][:12]}...; "
                f"{MANIFEST} lists {shorten(listed)})"
            )
    return None


def _left_by(path: Path) -> str | None:
    """Who left the lock at ``path``, a process that has ended; ``None``: this process. Raises
    :class:`NotWritableError` when a live watch of another process holds it."""
    try:
        holder = json.loads(path.read_text(encoding="utf-8"))
        pid, host = int(holder["pid"]), str(holder["host"])
    except (OSError, ValueError, TypeError, KeyError) as err:
        raise NotWritableError(
            f"forgetwatch: {path} cannot be read ({first_line(err)}): another watch may be starting in "
            f"{path.parent} right now; if no run uses that folder, delete {path}"
        ) from None
    if host == socket.gethostname() and pid == os.getpid():
        return None
    if host == socket.gethostname() and not _alive(pid):
        return f"process {pid}, which has ended"
    raise NotWritableError(
        f"forgetwatch: a watch of process {pid} on {host} writes in {path.parent}; two watches in one folder "
        f"would mix their files: give this run another output_dir, or, if that run has ended, delete {path}"
    ) from None


def _alive(pid: int) -> bool:
    """Whether process ``pid`` of this host runs (where that cannot be asked, it is taken to)."""
    if os.name != "posix":  # os.kill would end it there
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # someone else's
        return True
    return True


def _unlock(path: Path, text: str) -> None:
    """Remove the lock at ``path`` if it is still the one written (``text``), not a taker-over's."""
    with contextlib.suppress(OSError):  # gone already, or its folder with it
        if path.read_text(encoding="utf-8") == text:
            path.unlink()


def _digest(path: Path) -> dict[str, Any]:
    """A file's size and sha256, as a manifest lists them."""
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
            size += len(chunk)
    return {"bytes": size, "sha256": h.hexdigest()}


def _copy_file(source: Path, target: Path) -> None:
    with open(source, "rb") as src, atomic_write(target, "wb") as dst:
        shutil.copyfileobj(src, dst)
