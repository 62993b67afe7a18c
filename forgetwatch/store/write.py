"""Every write of a run's files (:class:`RunStore`): the lock, the set-aside of an earlier run, atomic writes
retried when they fail, the history cut at a resumed step."""

from __future__ import annotations

import contextlib
import errno
import glob
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

from forgetwatch.common.files import atomic_write, json_line, leftover_temporaries
from forgetwatch.common.text import first_line
from forgetwatch.results.answers import Answers
from forgetwatch.results.history import HistoryError
from forgetwatch.store import DAMAGED, FILES, HISTORY, LATEST, LOCK, PREVIOUS, PROBES, SNAPSHOT, TRAIN_KL
from forgetwatch.store.read import read_history, scan_history

logger = logging.getLogger(__name__)

#: what each file is, as a warning names it
_WHAT = {
    SNAPSHOT: "the base snapshot is",
    PROBES: "the probe set (the report's questions) is",
    TRAIN_KL: "the base's distribution on the training rows (train KL) is",
}
#: this process's stores that wrote a run directory's lock, by the lock's real path
_HOLDERS: weakref.WeakValueDictionary[str, RunStore] = weakref.WeakValueDictionary()


class NotWritableError(OSError):
    """forgetwatch cannot write its files where it was told to (raised before training)."""


class RunStore:
    """The run's files in one directory. A failed write during training warns, is kept in memory and retried at the
    next write (:attr:`pending`); only the checks before training raise."""

    def __init__(self, directory: str | os.PathLike[str], own_files: Iterable[str] = ()):
        self.dir = Path(directory)
        self.files = (*FILES, *own_files)  # every file of the run's: the monitor's, and a repair method's
        # the history's records on disk (None: not read yet) and not: once some are unwritten, it is rewritten whole
        self._written: list[dict[str, Any]] | None = None
        self._unwritten: list[dict[str, Any]] = []
        self._kept: dict[str, Callable[[Path], Any]] = {}  # each file of the run, as the function writing it whole
        self._owed: set[str] = set()  # of those, the ones not on disk
        self._said: set[str] = set()  # the warnings given once, by their text
        self._lock: weakref.finalize | None = None  # removes the lock: at release(), collection or exit
        self._earlier: RunStore | None = None  # the store of this process this one took the directory from
        self._superseded = False  # another store of this process took the directory: nothing more is written

    @property
    def snapshot_path(self) -> Path:
        return self.dir / SNAPSHOT

    @property
    def history_path(self) -> Path:
        return self.dir / HISTORY

    @property
    def pending(self) -> int:
        return len(self._unwritten) + len(self._owed - {HISTORY})

    def check_writable(self) -> None:
        """Raise :class:`NotWritableError` unless files can be written here."""
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
                f"forgetwatch cannot write its files in {self.dir} ({err}); it writes the base snapshot and history "
                "there during training: free space or fix the permissions, or choose another folder with output_dir="
            ) from err

    def claim(self) -> None:
        """Take the run directory for this run alone (``watch.lock``, made exclusively): a live watch of another
        process keeps it (:class:`NotWritableError`); an ended one's, or one of this process, is taken over."""
        if self._lock is not None and self._lock.alive:
            return
        path = self.dir / LOCK
        text = json.dumps({"pid": os.getpid(), "host": socket.gethostname()})
        try:
            with open(path, "x", encoding="utf-8") as f:  # exclusive: of two starters, one wins
                f.write(text)
        except FileExistsError:
            if left_by := _left_by(path):  # raises when a live watch of another process holds it
                logger.warning("forgetwatch: taking over %s, left by %s", path, left_by)
            with atomic_write(path) as f:
                f.write(text)
        key = os.path.realpath(path)
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
        if self._lock is not None:
            self._lock()

    def adopt(self, origin: Path) -> list[str]:
        """Copy a resumed run's files here, atomically, from ``origin``, the run directory its checkpoint was saved
        from, when this one is another with no snapshot (ms-swift resumes into a new ``v1-...``); the names copied."""
        if origin.resolve() == self.dir.resolve() or self.snapshot_path.exists() or not (origin / SNAPSHOT).is_file():
            return []
        copied = [name for name in self.files if (origin / name).is_file() and not (self.dir / name).exists()]
        for name in copied:
            with atomic_write(self.dir / name, "wb") as f:
                f.write((origin / name).read_bytes())
        return copied

    def set_aside(self) -> Path | None:
        """Before a fresh run: move an earlier run's files into a new ``previous-<n>``; the folder, if any moved (a
        move cut short leaves the rest for the next fresh run: split in two folders, none lost)."""
        names = [n for n in self.files if os.path.lexists(self.dir / n)]
        names += sorted(p.name for p in self.dir.glob(f"{glob.escape(DAMAGED)}-*"))
        if not names:
            return None
        aside = self._free_name(PREVIOUS)
        try:
            aside.mkdir()
            for name in names:
                os.replace(self.dir / name, aside / name)
        except OSError as err:
            raise NotWritableError(
                f"forgetwatch cannot move an earlier run's files in {self.dir} out of the way ({err}); it will not "
                "overwrite anything: move them yourself, or choose another folder with output_dir="
            ) from err
        logger.info("forgetwatch: %s held an earlier run's files; moved them, all of them, to %s", self.dir, aside)
        if self._earlier is not None:  # the watch that wrote them goes on writing there
            self._earlier.dir, self._earlier._superseded = aside, False
        return aside

    def remove_leftovers(self) -> list[Path]:
        """Remove forgetwatch's own temporary files left here by writes cut short (kill -9)."""
        removed = []
        for path in leftover_temporaries(self.dir, (*self.files, LOCK)):
            with contextlib.suppress(OSError):  # not ours to fail on: a leftover stays
                shutil.rmtree(path) if path.is_dir() else path.unlink()
                removed.append(path)
        if removed:
            logger.info("forgetwatch: removed %d temporary file(s) left by writes cut short", len(removed))
        return removed

    # -- the files written once ----------------------------------------------------------------

    def save_snapshot(self, answers: Answers, *, copy_of: Path | None = None) -> bool:
        """Write the base answers (``copy_of``: a file holding them, linked here); whether they are on disk."""
        if copy_of is not None:
            self._kept[SNAPSHOT] = answers.save
            if copy_of == self.snapshot_path:  # read from here: on disk already
                return True
            with contextlib.suppress(OSError):  # else written below
                os.link(copy_of, self.snapshot_path)  # the same bytes: nothing to copy
                return True
        return self.keep(SNAPSHOT, answers.save)

    def save_probes(self, probes: Any) -> bool:
        return self.keep(PROBES, probes.to_jsonl)

    def keep(self, name: str, write: Callable[[Path], Any]) -> bool:
        """Write a file made once for the run with ``write(path)``, again if lost; whether it is on disk."""
        if self._gone():
            return False
        self._kept[name] = write
        self._owed.add(name)
        return self._try(self.dir / name, self._what(name), self._write, name)

    def save_latest(self, answers: Answers) -> bool:
        """Write the last evaluation's answers; a failure warns."""
        if self._gone():
            return False
        return self._try(self.dir / LATEST, "the last evaluation's answers (for the report) are", answers.save)

    # -- the history ---------------------------------------------------------------------------

    def save_history(self, records: list[dict[str, Any]]) -> bool:
        """Replace the whole history (one atomic write); whether it is on disk."""
        self._written, self._unwritten = [], list(records)
        return self.keep(HISTORY, self._write_history)

    def append_history(self, record: dict[str, Any]) -> bool:
        """Add one record in one write of one line, flushed (a crash can cut only it short); whether all is on disk."""
        if self._gone():
            return False
        self._find_lost()  # a history file deleted meanwhile is written again whole, not begun anew
        self._kept.setdefault(HISTORY, self._write_history)
        if HISTORY in self._owed:  # the file is behind: rewritten whole below, this record included
            self._unwritten.append(record)
        elif not self._try(self.history_path, "this history record is", self._append, record):
            self._unwritten.append(record)
            self._owed.add(HISTORY)
            return False
        return self.flush()

    def resume_history(self, step: int, **checks: Any) -> list[dict[str, Any]]:
        """The records up to ``step`` a resumed run goes on with (later ones: a killed run's abandoned future), the file
        cut to them atomically; those from an unreadable line on are dropped, with a warning, the file kept aside."""
        if not self.history_path.is_file():
            self.save_history([])
            return []
        records, problem, cut = scan_history(self.history_path, **checks)
        kept = [r for r in records if r["step"] <= step]
        if problem is not None:
            aside = self._free_name(DAMAGED)
            try:
                shutil.copy2(self.history_path, aside)
            except OSError as err:
                raise NotWritableError(f"forgetwatch cannot keep {self.history_path} as {aside} ({err})") from err
            logger.warning(
                "forgetwatch: %s; resuming with the %d record(s) up to step %d before it (the file is kept as %s)",
                problem,
                len(kept),
                step,
                aside,
            )
        if len(kept) < len(records) or problem is not None or cut:
            self.save_history(kept)
        else:
            self._written, self._unwritten = kept, []
        return kept

    def flush(self) -> bool:
        """Retry every write still owed; whether everything is on disk."""
        if self._gone():
            return False
        self._find_lost()
        for name in sorted(self._owed):
            self._try(self.dir / name, self._what(name), self._write, name)
        return self.pending == 0

    # -- inside --------------------------------------------------------------------------------

    def _gone(self) -> bool:
        if self._superseded:
            self._warn_once(
                "forgetwatch: another watch of this process took %s over; this watch writes nothing more "
                "there (its evaluations stay in its history)",
                self.dir,
            )
        return self._superseded

    def _warn_once(self, message: str, *args: Any) -> None:
        if message not in self._said:
            self._said.add(message)
            logger.warning(message, *args)

    def _free_name(self, stem: str) -> Path:
        """``stem-<n>``, n one above any there: numbered in the order they were made, also after one was deleted."""
        taken = [p.name.removeprefix(f"{stem}-") for p in self.dir.glob(f"{glob.escape(stem)}-*")]
        return self.dir / f"{stem}-{max((int(n) for n in taken if n.isdigit()), default=0) + 1}"

    def _find_lost(self) -> None:
        # files written here that are gone (the run directory deleted during training): owed again, said once
        lost = [name for name in self._kept if name not in self._owed and not (self.dir / name).exists()]
        if not lost:
            return
        self._owed.update(lost)
        if HISTORY in lost:
            self._written, self._unwritten = [], (self._written or []) + self._unwritten
        self._warn_once(
            "forgetwatch: %s disappeared from %s during training (deleted?); forgetwatch writes what it lost "
            "again from memory; training goes on",
            ", ".join(lost),
            self.dir,
        )

    def _what(self, name: str) -> str:
        return f"{len(self._unwritten)} history record(s) are" if name == HISTORY else _WHAT.get(name, f"{name} is")

    def _write(self, name: str) -> None:
        self._kept[name](self.dir / name)
        self._owed.discard(name)
        if name == HISTORY:
            self._written, self._unwritten = self._records(), []

    def _try(self, path: Path, what: str, write: Callable[..., Any], *args: Any) -> bool:
        try:
            write(*args) if args else write(path)
        except (OSError, HistoryError) as err:  # HistoryError: a damaged file, read to be rewritten
            logger.warning(
                "forgetwatch could not write %s (%s): %s kept in memory and will be written at the "
                "next evaluation; training goes on",
                path,
                first_line(err),
                what,
            )
            return False
        return True

    def _append(self, record: dict[str, Any]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.history_path, "a", encoding="utf-8") as f:
            f.write(json_line(record))
            f.flush()
            os.fsync(f.fileno())
        if self._written is not None:
            self._written.append(record)

    def _write_history(self, path: Path) -> None:
        with atomic_write(path) as f:
            f.writelines(json_line(r) for r in self._records())

    def _records(self) -> list[dict[str, Any]]:
        if self._written is None:
            self._written = read_history(self.history_path) if self.history_path.is_file() else []
        return self._written + self._unwritten


def _left_by(path: Path) -> str | None:
    """Who left the lock at ``path``, an ended process (``None``: this one); a live one raises."""
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
    if os.name != "posix":  # os.kill would end it there
        return True
    try:
        os.kill(pid, 0)
    except OSError as err:  # PermissionError: someone else's, alive
        return not isinstance(err, ProcessLookupError)
    return True


def _unlock(path: Path, text: str) -> None:
    with contextlib.suppress(OSError):  # gone already, or its folder with it
        if path.read_text(encoding="utf-8") == text:
            path.unlink()
