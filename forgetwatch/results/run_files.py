"""A run's files, in one place: their names, every write (:class:`RunStore`) and every read (:func:`read_run`).
Each checkpoint gets a whole copy (``manifest.json`` last); writes made during training never raise."""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import json
import logging
import os
import shutil
import socket
import tempfile
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from forgetwatch.common import strict_json
from forgetwatch.common.files import atomic_write, json_line, leftover_temporaries, strict_dumps
from forgetwatch.common.text import first_line, shorten
from forgetwatch.probes import Probe, ProbeSet
from forgetwatch.results.answers import Answers, AnswersFileError, AnswersMismatchError
from forgetwatch.results.history import HistoryError, parse_record, report_from_record
from forgetwatch.results.report import TransitionReport
from forgetwatch.results.trajectory import Trajectory

logger = logging.getLogger(__name__)

SNAPSHOT = "base_answers.npz"
HISTORY = "history.jsonl"  # one record per evaluation, each with its trajectory column
PROBES = "probes.jsonl"  # the questions, for reports
TRAIN_KL = "train_kl.npz"
MANIFEST = "manifest.json"  # in a checkpoint, written last: each file's size and sha256
LATEST = "answers_latest.npz"  # the last evaluation's answers, for the report (not kept in checkpoints)
SUBDIR = "forgetwatch"  # inside the trainer's output directory and each checkpoint directory
LOCK = "watch.lock"  # while a watch writes in the run directory: its pid and host
PREVIOUS = "previous"  # previous-<n>/: an earlier run's files, set aside by a fresh run (the newest: the largest n)
SWEEP = "sweep.json"  # when training ended: the merge sweep's table (the report page shows it), and beside it
SWEEP_TABLE = "sweep.csv"  # ... the same as CSV
MERGED = "merged"  # ... and the model at the chosen alpha (a folder)
#: Every file the monitor itself writes (a repair method names its own; nothing else there is touched).
FILES = (SNAPSHOT, HISTORY, PROBES, TRAIN_KL, MANIFEST)
#: What a run writes besides, not kept in checkpoints: set aside with the rest by a fresh run.
BESIDES = (LATEST, SWEEP, SWEEP_TABLE, MERGED)
_MANIFEST_FORMAT = "forgetwatch.checkpoint"
_COPY = "this checkpoint's forgetwatch files are"
_WHAT = {
    SNAPSHOT: "the base snapshot is",
    PROBES: "the probe set (the report's questions) is",
    TRAIN_KL: "the base's distribution on the training rows (train KL) is",
}
#: this process's stores that wrote a run directory's lock, by the lock's real path
_HOLDERS: weakref.WeakValueDictionary[str, RunStore] = weakref.WeakValueDictionary()


# -- reading -------------------------------------------------------------------------------------


def run_directory(path: str | os.PathLike[str]) -> Path:
    """``path``, or its ``forgetwatch/`` folder when ``path`` is a trainer's output directory."""
    path = Path(path)
    if (path / SNAPSHOT).is_file() or not (path / SUBDIR / SNAPSHOT).is_file():
        return path
    return _inside(path, SUBDIR)


def _inside(directory: Path, name: str) -> Path:
    """``directory / name``, refused when it is a symbolic link out of ``directory``."""
    path = directory / name
    if path.is_symlink() and not path.resolve().is_relative_to(directory.resolve()):
        raise ValueError(
            f"{path}: a symbolic link to {os.readlink(path)}, outside the run directory; forgetwatch does not "
            "follow it: copy the file into the run directory, or remove the link"
        )
    return path


def read_snapshot(directory: str | os.PathLike[str]) -> Answers | None:
    """The base snapshot in a forgetwatch folder (``None``: none); an ``AnswersFileError`` when damaged."""
    path = Path(directory) / SNAPSHOT
    if not path.is_file():
        return None
    try:
        return Answers.load(path)
    except AnswersFileError as err:
        raise AnswersFileError(
            err.reason,
            path,
            advice="this base snapshot cannot be used: delete it to score the base model again, or "
            f"pass base=PATH with a good copy (each checkpoint keeps one in checkpoint-N/{SUBDIR}/)",
        ) from None


def scan_history(
    path: Path, probes: int | None = None, fingerprint: str | None = None
) -> tuple[list[dict[str, Any]], HistoryError | None, bool]:
    """A history file's records up to its first unreadable line, that line's error, and whether the last line
    was cut short (dropped with a warning)."""
    lines = path.read_bytes().split(b"\n")
    cut = bool(lines[-1].strip())  # no final newline: the write of that line never finished
    if cut:
        logger.warning(
            "%s, line %d: dropping an incomplete last line (a write cut short, e.g. by a crash)", path, len(lines)
        )
    records: list[dict[str, Any]] = []
    for number, line in enumerate(lines[:-1], start=1):
        if not line.strip():
            continue
        try:
            record = parse_record(line, probes, fingerprint)
            if records and record["step"] <= records[-1]["step"]:
                # never written so: a resume cuts the history at its checkpoint and rewrites it
                raise HistoryError(
                    f"{record['step']} after step {records[-1]['step']}: steps must increase "
                    "(lines repeated, or two runs writing one history?)",
                    "step",
                )
        except HistoryError as err:
            return records, HistoryError(err.reason, err.field, path, number), cut
        records.append(record)
    return records, None, cut


def read_history(
    path: str | os.PathLike[str], *, probes: int | None = None, fingerprint: str | None = None
) -> list[dict[str, Any]]:
    """The records of a ``history.jsonl``: a last line cut short by a crash is dropped with a warning, any other
    line that is not a record raises a :class:`HistoryError` naming the file, line and field."""
    records, problem, _ = scan_history(Path(path), probes, fingerprint)
    if problem is not None:
        raise problem
    return records


def recover_history(
    paths: Sequence[Path], step: int, *, probes: int | None = None, fingerprint: str | None = None
) -> tuple[list[dict[str, Any]], Path | None, list[Path]]:
    """The records a run resumed at ``step`` goes on with, from the first whole copy in ``paths`` (else the longest
    one agreeing with the first), their copy, and the copies holding an unreadable line; each problem warns."""
    scans = [(path, *scan_history(path, probes, fingerprint)) for path in paths if path.is_file()]
    if not scans:
        logger.warning(
            "forgetwatch: resuming at step %d, but there is no history in %s: the evaluations before "
            "step %d are lost (the trajectory, the patience count and the report start again here; the "
            "base snapshot is intact, so the figures stay right)",
            step,
            " or ".join(str(p) for p in paths),
            step,
        )
        return [], None, []
    kept = [[r for r in records if r["step"] <= step] for _, records, _, _ in scans]
    # copies of this run agree with the first where both hold records: the same steps, made at the same times
    ours = [
        i
        for i in range(len(scans))
        if all((a["step"], a.get("time")) == (b["step"], b.get("time")) for a, b in zip(kept[0], kept[i]))
    ]
    whole = [i for i, (_, _, problem, cut) in enumerate(scans) if i in ours and problem is None and not cut]
    best = whole[0] if whole else max(ours, key=lambda i: (len(kept[i]), -i))
    source = scans[best][0]
    damaged = [(path, problem) for path, _, problem, _ in scans if problem is not None]
    for _, problem in damaged:
        logger.warning(
            "forgetwatch: %s; resuming with the %d record(s) up to step %d of %s",
            problem,
            len(kept[best]),
            step,
            source,
        )
    return kept[best], source, [path for path, _ in damaged]


@dataclass
class Run:
    """A monitored run as its forgetwatch directory ``dir`` holds it (see :func:`read_run`): ``history``
    (``(step, TransitionReport)`` per record) and ``trajectory`` are made once; ``probes``, ``latest`` when asked."""

    dir: Path
    base: Answers
    records: list[dict[str, Any]]
    name: str = ""
    history: list[tuple[int, TransitionReport]] = field(init=False, repr=False)
    trajectory: Trajectory = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.name = self.name or (self.dir.parent.name if self.dir.name == SUBDIR else self.dir.name)
        category_of = dict(zip(self.base.ids, self.base.categories))
        self.history = [(r["step"], report_from_record(r, category_of)) for r in self.records]
        self.trajectory = Trajectory.from_history(self.base, self.records)

    @property
    def steps(self) -> list[int]:
        return [r["step"] for r in self.records]

    @property
    def noise_floor(self) -> float | None:
        return self.base.meta.get("noise_floor")

    @cached_property
    def probes(self) -> dict[str, Probe]:
        path = self.dir / PROBES
        return {p.id: p for p in ProbeSet.from_jsonl(path)} if path.is_file() else {}

    @cached_property
    def latest(self) -> Answers | None:
        """The last evaluation's answers, when kept for the last record's step (damaged: a warning, none)."""
        path = self.dir / LATEST
        try:
            latest = Answers.load(path) if path.is_file() else None
        except AnswersFileError as err:
            logger.warning("forgetwatch: %s; the report says right or wrong for the answer now", first_line(err))
            return None
        fits = latest is not None and latest.meta.get("step") in self.steps[-1:] and latest.ids == self.base.ids
        return latest if fits else None


def read_run(run_dir: str | os.PathLike[str]) -> Run:
    """A monitored run, from its forgetwatch directory (or a checkpoint's copy) or the trainer's output directory;
    ``FileNotFoundError`` without a base snapshot, :class:`HistoryError` for a damaged record."""
    path = run_directory(run_dir)
    for name in (SNAPSHOT, HISTORY, PROBES, LATEST):  # every file a run is read from
        _inside(path, name)
    if not (path / SNAPSHOT).is_file():
        raise FileNotFoundError(
            f"{path / SNAPSHOT}: no base snapshot; give the forgetwatch directory of a run "
            f"(OUTPUT_DIR/{SUBDIR} or OUTPUT_DIR/checkpoint-N/{SUBDIR}) or the trainer's output "
            "directory"
        )
    base = Answers.load(path / SNAPSHOT)
    history = path / HISTORY
    records = read_history(history, probes=len(base), fingerprint=base.probe_fingerprint) if history.is_file() else []
    return Run(path, base, records)


def load_trajectory(run_dir: str | os.PathLike[str]) -> Trajectory:
    """The trajectory of a monitored run, from its forgetwatch directory (see :func:`read_run`).

    Example:
        >>> t = load_trajectory("out/forgetwatch")                 # doctest: +SKIP
        >>> t.steps[:3], t.forgetting_events().max()                # doctest: +SKIP
    """
    return read_run(run_dir).trajectory


def copy_problem(directory: str | os.PathLike[str]) -> str | None:
    """Why a checkpoint's forgetwatch folder is not a whole copy (its manifest's sizes and sha256), or ``None``."""
    directory = Path(directory)
    path = directory / MANIFEST
    if not path.is_file():
        return f"no {MANIFEST}: its copy never finished (cut short, e.g. by kill -9) or an older forgetwatch wrote it"
    try:
        manifest = strict_json.loads(path.read_bytes().decode("utf-8"))
        files = manifest["files"]
        if manifest.get("format") != _MANIFEST_FORMAT or not isinstance(files, dict):
            raise ValueError("not a forgetwatch manifest")
    except (OSError, ValueError, TypeError, KeyError) as err:
        return f"{MANIFEST} cannot be read ({first_line(err)})"
    for name, listed in files.items():
        if name in (MANIFEST, "", "..") or Path(name).name != name:  # JSON keys: always text
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


# -- the base a run finds on disk ----------------------------------------------------------------


def stored_base(
    given: Answers | str | os.PathLike[str] | None,
    expected: Mapping[str, Any],
    keys: Mapping[str, str],
    *,
    run_dir: Path,
    resume_dirs: Sequence[Path] = (),
    step: int = 0,
) -> Answers | None:
    """The base answers a run was given or finds on disk (on resume it must), or ``None``: score them now.
    ``expected``: :meth:`Answers.mismatch`'s arguments; ``keys``: the model's, checked on a cached snapshot only."""
    if given is not None:
        answers = given if isinstance(given, Answers) else Answers.load(given)
        if problem := answers.mismatch(**expected):
            raise AnswersMismatchError(
                f"base={'the answers given' if isinstance(given, Answers) else os.fspath(given)} was computed for "
                f"{problem}; it cannot be this run's base: score the base model on these probes (forgetwatch "
                "evaluate) or leave base unset"
            )
        return answers
    found: list[tuple[Path, Answers]] = []
    rejected, other = [], []  # snapshots that cannot serve: damaged, or of other probes or options
    for directory in resume_dirs or [run_dir]:
        try:
            answers = read_snapshot(directory)
        except ValueError as err:  # damaged: say so, and look further
            rejected.append(str(err))
            continue
        # a cached snapshot must be of this very model; on resume, loading a model again may change its configuration
        # harmlessly: it is only preferred
        problem = None if answers is None else answers.mismatch(**expected, meta=None if resume_dirs else keys)
        if problem:
            rejected.append(f"{directory / SNAPSHOT}: for {problem}")
            other.append(rejected[-1])
        elif answers is not None:
            found.append((directory, answers))
    if not resume_dirs:  # a cached snapshot that does not fit: compute a new one
        if rejected:
            logger.warning("forgetwatch: ignoring %s; computing a new base snapshot", rejected[0])
        elif found:
            logger.info("forgetwatch: reusing the base snapshot in %s", run_dir / SNAPSHOT)
        return found[0][1] if found else None
    if not found and other:  # the run's own base, made with settings this resume does not have
        raise AnswersMismatchError(
            f"resuming at step {step}, but the run's base snapshot was made otherwise: {other[0]}; resume with the "
            "probes and scoring options the run began with (each 'x, not y' above: x is the run's), or start a "
            "fresh run in another output_dir"
        )
    if not found:
        why = f" ({'; '.join(rejected)})" if rejected else ""
        raise FileNotFoundError(
            f"resuming at step {step}, but no base snapshot for these probes and scoring options was found in "
            f"{', '.join(map(str, resume_dirs))}{why}; the resumed weights have moved, so they cannot stand in for "
            "the base: pass base=PATH with the original run's base_answers.npz"
        )
    for _, answers in found:
        if answers.meta.get("model_key") == keys["model_key"]:
            return answers
    logger.warning(
        "forgetwatch: resuming with the base snapshot in %s, made for a model of another configuration than this one",
        found[0][0],
    )
    return found[0][1]


# -- writing -------------------------------------------------------------------------------------


class NotWritableError(OSError):
    """forgetwatch cannot write its files where it was told to (raised before training)."""


class RunStore:
    """The run's files in one directory, and their copies into checkpoints. A failed write during training warns
    once, is kept in memory and retried (:attr:`pending`); only the checks before training raise."""

    def __init__(self, directory: str | os.PathLike[str], own_files: Iterable[str] = ()):
        self.dir = Path(directory)
        self.files = (*FILES, *own_files)  # every file of the run's: the monitor's, and a repair method's
        # the history's records on disk (None: read when needed) and those not: once some are unwritten, the history
        # is owed and rewritten whole, so no half-written line stays inside
        self._written: list[dict[str, Any]] | None = None
        self._unwritten: list[dict[str, Any]] = []
        self._kept: dict[str, Callable[[Path], Any]] = {}  # each file of the run, as the function writing it whole
        self._owed: set[str] = set()  # of those, the ones not on disk
        self._copies: dict[Path, dict[str, Any]] = {}  # checkpoint folders whose copy failed: their extra files
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
        return len(self._unwritten) + len(self._owed - {HISTORY}) + len(self._copies)

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
                f"forgetwatch cannot write its files in {self.dir} ({err}); it writes the base snapshot and "
                "history there during training: free space or fix the permissions, or choose another "
                "folder with output_dir="
            ) from err

    def claim(self) -> None:
        """Take the run directory for this run alone (``watch.lock``): a live watch of another process keeps it
        (:class:`NotWritableError`), an ended one's is taken over; in this process a later store takes it over."""
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
        if self._lock is not None:
            self._lock()

    def set_aside(self) -> Path | None:
        """Before a fresh run: move an earlier run's files into a new ``previous-<n>`` (via ``previous.partial``,
        which the next run completes if this is cut short); the folder, if anything moved."""
        partial = self.dir / f"{PREVIOUS}.partial"
        names = [n for n in (*self.files, *BESIDES) if os.path.lexists(self.dir / n)]
        names += sorted(p.name for p in self.dir.glob(f"{HISTORY}.damaged-*"))
        with self._moving(
            f"an earlier run's files in {self.dir}", "move them yourself, or choose another folder with output_dir="
        ):
            if partial.is_dir() and any(os.path.lexists(partial / n) for n in names):
                os.replace(partial, self._free_name(PREVIOUS))  # two runs' files: kept apart
            if not names and not partial.is_dir():
                return None
            partial.mkdir(exist_ok=True)
            for name in names:
                os.replace(self.dir / name, partial / name)
            aside = self._free_name(PREVIOUS)
            os.replace(partial, aside)
        logger.info("forgetwatch: %s held an earlier run's files; moved them, all of them, to %s", self.dir, aside)
        if self._earlier is not None:  # the watch that wrote them goes on writing there
            self._earlier.dir, self._earlier._superseded = aside, False
        return aside

    def remove_leftovers(self, folders: Iterable[Path] = ()) -> list[Path]:
        """Remove forgetwatch's own temporary files left by writes cut short, here and in ``folders``."""
        removed = []
        for folder in dict.fromkeys([self.dir, *folders]):
            for path in leftover_temporaries(folder, (*self.files, *BESIDES, LOCK)):
                try:
                    shutil.rmtree(path) if path.is_dir() else path.unlink()
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
        """Write the base answers (``copy_of``: a file holding them, linked here); whether they are on disk."""
        if copy_of is not None:
            self._kept[SNAPSHOT] = answers.save
            with contextlib.suppress(OSError):  # else written below
                os.link(copy_of, self.snapshot_path)  # the same bytes: nothing to copy
                return True
        return self.keep(SNAPSHOT, answers.save)

    def save_probes(self, probes: Any) -> bool:
        return self.keep(PROBES, probes.to_jsonl)

    def keep(self, name: str, write: Callable[[Path], Any]) -> bool:
        """Write a file made once for the run with ``write(path)``, kept for checkpoints; whether it is on disk."""
        if self._gone():
            return False
        self._kept[name] = write
        self._owed.add(name)
        return self._try(self.dir / name, self._what(name), self._write, name)

    def save_latest(self, answers: Answers) -> bool:
        """The last evaluation's answers (not copied into checkpoints); a failure warns."""
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

    # -- the history ---------------------------------------------------------------------------

    def save_history(self, records: list[dict[str, Any]]) -> bool:
        """Replace the whole history; whether it is on disk."""
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

    def set_aside_damaged(self, records: int) -> Path | None:
        """Move a history file holding unreadable records to ``history.jsonl.damaged-<n>``, before a resume rewrites
        it with the ``records`` it could read."""
        if not self.history_path.is_file():
            return None
        aside = self._free_name(f"{HISTORY}.damaged")
        with self._moving(f"{self.history_path}, which holds records it cannot read,", "move it yourself, then resume"):
            os.replace(self.history_path, aside)
        logger.warning(
            "forgetwatch: moved %s to %s: it holds records that could not be read (see above), kept "
            "there; the run's history goes on with the %d record(s) resumed",
            self.history_path,
            aside,
            records,
        )
        self._written = []
        return aside

    # -- checkpoints ---------------------------------------------------------------------------

    def copy_to(self, directory: str | os.PathLike[str], extra: dict[str, Any] | None = None) -> bool:
        """Copy every file of the run, with ``extra`` (name → JSON value), into ``directory``, then the manifest that
        makes the copy whole; a failure is retried at the next write. Whether everything is on disk."""
        if self._gone():
            return False
        target = Path(directory)
        self._copies.pop(target, None)
        self.flush()  # earlier failures first: the copy then finds the history on disk
        if not self._try(target, _COPY, self._copy, target, extra or {}):
            self._copies[target] = extra or {}
        return self.pending == 0

    def flush(self) -> bool:
        """Retry every write still owed; whether everything is on disk."""
        if self._gone():
            return False
        self._find_lost()
        for name in sorted(self._owed):
            self._try(self.dir / name, self._what(name), self._write, name)
        for target, extra in list(self._copies.items()):
            # a checkpoint deleted since (rotation) is not made again, without its weights
            if not target.parent.is_dir() or self._try(target, _COPY, self._copy, target, extra):
                del self._copies[target]
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

    @contextlib.contextmanager
    def _moving(self, what: str, fix: str) -> Iterator[None]:
        try:
            yield
        except OSError as err:
            raise NotWritableError(
                f"forgetwatch cannot move {what} out of the way ({err}); it will not overwrite anything: {fix}"
            ) from err

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
            "forgetwatch: %s disappeared from %s during training (deleted?); forgetwatch writes "
            "what it lost again from memory, here and into every later checkpoint; training goes on",
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

    def _try(self, path: Path, what: str, write: Callable[..., None], *args: Any) -> bool:
        try:
            write(*args)
        except (OSError, HistoryError) as err:  # HistoryError: a damaged file, read to be rewritten
            logger.warning(
                "forgetwatch could not write %s (%s): %s kept in memory and will be written at the "
                "next evaluation or checkpoint; training goes on",
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

    def _copy(self, target: Path, extra: dict[str, Any]) -> None:
        target.mkdir(parents=True, exist_ok=True)
        (target / MANIFEST).unlink(missing_ok=True)  # not whole again until the new manifest is written
        for name, write in self._kept.items():
            source = self.dir / name
            if name in self._owed or not source.is_file():
                write(target / name)  # from memory: the run directory lost it, or never had it
            else:  # copying bytes is cheaper than writing them again
                with open(source, "rb") as src, atomic_write(target / name, "wb") as dst:
                    shutil.copyfileobj(src, dst)
        for name, value in extra.items():
            with atomic_write(target / name) as f:
                f.write(strict_dumps(value))
        names = [*self._kept, *extra]
        for name in set(self.files) - set(names) - {MANIFEST}:
            (target / name).unlink(missing_ok=True)  # an earlier copy's, not part of this one
        manifest = {"format": _MANIFEST_FORMAT, "files": {name: _digest(target / name) for name in names}}
        with atomic_write(target / MANIFEST) as f:
            f.write(strict_dumps(manifest))


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
    except ProcessLookupError:
        return False
    except OSError:  # someone else's
        return True
    return True


def _unlock(path: Path, text: str) -> None:
    with contextlib.suppress(OSError):  # gone already, or its folder with it
        if path.read_text(encoding="utf-8") == text:
            path.unlink()


def _digest(path: Path) -> dict[str, Any]:
    with open(path, "rb") as f:
        return {"bytes": os.fstat(f.fileno()).st_size, "sha256": hashlib.file_digest(f, "sha256").hexdigest()}
