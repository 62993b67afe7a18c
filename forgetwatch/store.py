"""The files of a monitored run: the base snapshot and the evaluation history.

Both live in the run's forgetwatch directory and are copied into every checkpoint, so a run
resumed from a checkpoint finds the answers of its original base model (the weights it
resumes with have moved and must never stand in for the base).
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .answers import Answers, AnswersFileError
from .files import atomic_write, json_line, strict_dumps
from .history import HistoryError, read_history
from .text import first_line

logger = logging.getLogger(__name__)

SNAPSHOT = "base_answers.npz"
HISTORY = "history.jsonl"
PROBES = "probes.jsonl"  # the questions, for reports
REPLAY_STATE = "replay.json"  # in a checkpoint: where the replay draws stood
REPLAY_BASE = "replay_base.npz"  # the base's next-token distribution on the replay rows
SUBDIR = "forgetwatch"  # inside each checkpoint directory


class NotWritableError(OSError):
    """forgetwatch cannot write its files where it was told to (raised when training begins)."""


class RunStore:
    """Snapshot and history files in one directory.

    Writes made during training never raise: a failed write (disk full, permissions, a
    directory where a file should be) logs one warning, keeps what was not written in memory,
    and is retried at the next write or :meth:`flush`. :attr:`pending` counts what is still
    owed to the disk. :meth:`check_writable` is the one check that fails fast, before training.

    Example:
        >>> store = RunStore("out/forgetwatch")            # doctest: +SKIP
        >>> store.check_writable()                         # doctest: +SKIP
        >>> store.append_history({"step": 10, "report": {}})  # doctest: +SKIP
        >>> store.pending                                  # doctest: +SKIP
        0
    """

    def __init__(self, directory: str | os.PathLike[str]):
        self.dir = Path(directory)
        # the history as the file must hold it before the unwritten records; None: what the
        # file holds (read when a rewrite needs it). Once records are unwritten, the next
        # write rewrites the whole file, so a half-written line never stays in the middle.
        self._written: list[dict[str, Any]] | None = None
        self._unwritten: list[dict[str, Any]] = []
        self._snapshot: Answers | None = None  # an unwritten snapshot
        self._copies: dict[Path, None] = {}  # checkpoint folders whose copy failed

    @property
    def snapshot_path(self) -> Path:
        return self.dir / SNAPSHOT

    @property
    def history_path(self) -> Path:
        return self.dir / HISTORY

    @property
    def pending(self) -> int:
        """Writes still owed to the disk: unwritten history records, plus one for an unwritten
        snapshot, plus one per failed checkpoint copy. ``0``: everything is on disk."""
        return len(self._unwritten) + (self._snapshot is not None) + len(self._copies)

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
                "folder with output_dir=") from err

    def load_snapshot(self) -> Answers | None:
        """The snapshot, or ``None`` when there is none; raises :class:`AnswersFileError` for
        a damaged one, saying what is wrong and what to do."""
        if not self.snapshot_path.is_file():
            return None
        try:
            return Answers.load(self.snapshot_path)
        except AnswersFileError as err:
            raise AnswersFileError(
                err.reason, self.snapshot_path,
                advice="this base snapshot cannot be used: delete it to score the base model again, or "
                       f"pass base=PATH with a good copy (each checkpoint keeps one in checkpoint-N/{SUBDIR}/)",
            ) from None

    def save_snapshot(self, answers: Answers) -> bool:
        """Write the base answers; on failure keep them for a retry. Whether they are on disk."""
        self._snapshot = answers
        return self._try_snapshot()

    def save_probes(self, probes: Any) -> bool:
        """Write the probe set beside the history, for reports (a failure warns, once)."""
        return self._write_once(lambda: probes.to_jsonl(self.dir / PROBES), self.dir / PROBES,
                                "reports will show probe ids without their questions")

    def save_replay_base(self, base: Any) -> bool:
        """Keep the base's distribution on the replay rows with the run (copied into checkpoints)."""
        return self._write_once(lambda: base.save(self.dir / REPLAY_BASE), self.dir / REPLAY_BASE,
                                'a resumed run could not replay with replay_loss="kl"')

    def save_state(self, path: Path, state: dict[str, Any]) -> bool:
        """Write a small JSON state file atomically (a failure warns: a resume would then draw
        other replay rows)."""
        def write() -> None:
            with atomic_write(path) as f:
                f.write(strict_dumps(state))

        return self._write_once(write, path, "a run resumed from this checkpoint will replay other rows")

    @staticmethod
    def _write_once(write: Callable[[], None], path: Path, consequence: str) -> bool:
        """A write not retried later: whether it went; a failure warns, saying what follows."""
        try:
            write()
        except OSError as err:
            logger.warning("forgetwatch could not write %s (%s): %s; training goes on", path, first_line(err),
                           consequence)
            return False
        return True

    def load_history(self) -> list[dict[str, Any]]:
        """The records, in order (see :func:`~forgetwatch.history.read_history`); none without a file."""
        return read_history(self.history_path) if self.history_path.is_file() else []

    def save_history(self, records: list[dict[str, Any]]) -> bool:
        """Replace the whole history (at the start of a run, or after a resume). Whether it is on disk."""
        self._written, self._unwritten = [], list(records)
        return self._try_history()

    def append_history(self, record: dict[str, Any]) -> bool:
        """Add one record: one write of one whole line, flushed to disk (a crash can cut only
        this line short, and :meth:`load_history` drops such a line). Whether everything is
        on disk (see :attr:`pending`)."""
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

    def set_aside_history(self) -> Path | None:
        """Move an earlier run's history out of the way (kept, renamed) before a fresh run."""
        kept = None
        if self.history_path.is_file():
            kept = self._free_name()
            os.replace(self.history_path, kept)
        self._written, self._unwritten = [], []
        return kept

    def _free_name(self) -> Path:
        """A name, not yet taken, for an earlier run's history."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        kept = self.dir / f"history-{stamp}.jsonl"
        n = 1
        while kept.exists():
            n += 1
            kept = self.dir / f"history-{stamp}-{n}.jsonl"
        return kept

    def copy_to(self, directory: str | os.PathLike[str]) -> bool:
        """Copy snapshot and history into ``directory`` (a checkpoint's forgetwatch folder),
        unwritten records included; on failure retry at the next write. Whether everything
        is on disk."""
        target = Path(directory)
        self._copies.pop(target, None)
        self.flush()  # earlier failures first: the copy then finds the history on disk
        if not self._try_copy(target):
            self._copies[target] = None
        return self.pending == 0

    def flush(self) -> bool:
        """Retry every write still owed (one warning per failure). Whether everything is on disk.

        Example:
            >>> if not store.flush(): print(store.pending, "writes still owed")  # doctest: +SKIP
        """
        if self._snapshot is not None:
            self._try_snapshot()
        if self._unwritten:
            self._try_history()
        for target in list(self._copies):
            # a checkpoint deleted since (rotation) is not made again, without its weights
            if not target.parent.is_dir() or self._try_copy(target):
                del self._copies[target]
        return self.pending == 0

    # -- the writes ----------------------------------------------------------------------------

    def _try_snapshot(self) -> bool:
        return self._try(self._write_snapshot, self.snapshot_path, "the base snapshot is")

    def _try_history(self) -> bool:
        return self._try(self._rewrite_history, self.history_path, f"{len(self._unwritten)} history record(s) are")

    def _try_copy(self, target: Path) -> bool:
        return self._try(lambda: self._copy(target), target, "this checkpoint's forgetwatch files are")

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
        logger.warning("forgetwatch could not write %s (%s): %s kept in memory and will be written at the "
                       "next evaluation or checkpoint; training goes on", path, first_line(err), what)

    def _write_snapshot(self) -> None:
        self._snapshot.save(self.snapshot_path)
        self._snapshot = None

    def _append_line(self, record: dict[str, Any]) -> None:
        self.history_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.history_path, "a", encoding="utf-8") as f:
            f.write(json_line(record))
            f.flush()
            os.fsync(f.fileno())

    def _records(self) -> list[dict[str, Any]]:
        """The whole history: what is on disk, then what is not yet."""
        if self._written is None:
            self._written = self.load_history()
        return self._written + self._unwritten

    def _rewrite_history(self) -> None:
        records = self._records()
        with atomic_write(self.history_path) as f:
            f.writelines(json_line(r) for r in records)
        self._written, self._unwritten = records, []

    def _copy(self, target: Path) -> None:
        target.mkdir(parents=True, exist_ok=True)
        if self._snapshot is not None:
            self._snapshot.save(target / SNAPSHOT)
        elif self.snapshot_path.is_file():
            _copy_file(self.snapshot_path, target / SNAPSHOT)
        if self._unwritten:
            with atomic_write(target / HISTORY) as f:
                f.writelines(json_line(r) for r in self._records())
        elif self.history_path.is_file():
            _copy_file(self.history_path, target / HISTORY)
        for name in (PROBES, REPLAY_BASE):
            if (self.dir / name).is_file():
                _copy_file(self.dir / name, target / name)


def _copy_file(source: Path, target: Path) -> None:
    with open(source, "rb") as src, atomic_write(target, "wb") as dst:
        shutil.copyfileobj(src, dst)
