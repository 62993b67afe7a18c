"""Every read of a run's files: the run directory, the base snapshot, the history, a whole run (:class:`Run`)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from forgetwatch.common.text import first_line
from forgetwatch.probes import Probe, ProbeSet
from forgetwatch.results.answers import Answers, AnswersFileError, AnswersMismatchError
from forgetwatch.results.history import HistoryError, parse_record, report_from_record
from forgetwatch.results.report import TransitionReport
from forgetwatch.results.trajectory import Trajectory
from forgetwatch.store import HISTORY, LATEST, PROBES, SNAPSHOT, SUBDIR

logger = logging.getLogger(__name__)


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
            advice="this base snapshot cannot be used: delete it to score the base model again (a fresh run), or "
            "pass base=PATH with a good copy",
        ) from None


def scan_history(
    path: Path, probes: int | None = None, fingerprint: str | None = None
) -> tuple[list[dict[str, Any]], HistoryError | None, bool]:
    """A history file's records up to its first unreadable line, that line's error, and whether the last line
    was cut short (dropped with a warning)."""
    lines = path.read_bytes().split(b"\n")
    if cut := bool(lines[-1].strip()):  # no final newline: the write of that line never finished
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
            f"(OUTPUT_DIR/{SUBDIR} or OUTPUT_DIR/checkpoint-N/{SUBDIR}) or the trainer's output directory"
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


# -- the base a run finds on disk ----------------------------------------------------------------


def stored_base(
    given: Answers | str | os.PathLike[str] | None,
    expected: Mapping[str, Any],
    keys: Mapping[str, Any],
    *,
    run_dir: Path,
    step: int = 0,
) -> Answers | None:
    """The base answers a run was given or finds in ``run_dir`` (on resume it must), or ``None``: score them now.
    ``expected``: :meth:`Answers.mismatch`'s arguments; ``keys``: the meta entries the snapshot must have."""
    if given is not None:
        answers = given if isinstance(given, Answers) else Answers.load(given)
        if problem := answers.mismatch(**expected):
            raise AnswersMismatchError(
                f"base={'the answers given' if isinstance(given, Answers) else os.fspath(given)} was computed for "
                f"{problem}; it cannot be this run's base: score the base model on these probes (forgetwatch evaluate) "
                "or leave base unset"
            )
        return answers
    path = run_dir / SNAPSHOT
    try:
        answers = read_snapshot(run_dir)
    except ValueError as err:  # damaged: a fresh run scores the base again
        if step:
            raise
        logger.warning("forgetwatch: ignoring %s; computing a new base snapshot", err)
        return None
    problem = None if answers is None else answers.mismatch(**expected, meta=keys)
    if not step:  # a cached snapshot that does not fit: compute a new one
        if problem:
            logger.warning("forgetwatch: ignoring %s: for %s; computing a new base snapshot", path, problem)
        elif answers is not None:
            logger.info("forgetwatch: reusing the base snapshot in %s", path)
        return None if problem else answers
    if answers is None:
        raise FileNotFoundError(
            f"resuming at step {step}, but there is no base snapshot in {run_dir}; the resumed weights have moved, "
            "so they cannot stand in for the base: resume with output_dir= the run's forgetwatch folder, or pass "
            "base=PATH with the run's base_answers.npz"
        )
    if problem:
        raise AnswersMismatchError(
            f"resuming at step {step}, but {path} was made for {problem}: resume with the probes and scoring "
            "options the run began with (each 'x, not y' above: x is the run's), in the folder it wrote, or start a "
            "fresh run in another output_dir"
        )
    return answers
