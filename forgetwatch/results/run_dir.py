"""A run directory: the names of its files, and the one reader of them.

A monitored run keeps its files in its forgetwatch directory (the callback's ``output_dir``,
by default ``OUTPUT_DIR/forgetwatch``), and a copy of them in each checkpoint's
``forgetwatch/`` folder (:mod:`forgetwatch.results.store` writes both):

- ``base_answers.npz``: the base model's answers (the snapshot);
- ``history.jsonl``: one record per evaluation (:mod:`forgetwatch.results.history`), each with its
  trajectory column;
- ``probes.jsonl``: the probe set, for the report's questions;
- ``answers_latest.npz``: the last evaluation's answers (run directory only);
- a repair method's own files (replay's: ``replay.json`` and the like), named by the method;
- ``train_kl.npz``: the training rows the train-KL signal measures and the base's distribution
  on them (:mod:`forgetwatch.run.train_kl`);
- ``manifest.json``: in a checkpoint, written last; the copy is whole (:func:`~forgetwatch.results.store.copy_problem`);
- ``watch.lock``: while a watch writes there, its process (pid and host): one watch per directory;
- ``previous-<n>/``: an earlier run's files, all of them, set aside when a fresh run began here.

:func:`read_run` reads a run: the report, :func:`load_trajectory` and a resume all see the
same :class:`Run`, each evaluation's report built once from its record.

Example:
    >>> run = read_run("out")                                            # doctest: +SKIP
    >>> run.steps, run.history[-1][1].forgetting, run.trajectory         # doctest: +SKIP
    ([10, 20], 0.031, Trajectory(120 probes, steps [0, 10, 20]))
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from forgetwatch.common.text import first_line
from forgetwatch.probes import Probe, ProbeSet
from forgetwatch.results.answers import Answers, AnswersFileError
from forgetwatch.results.history import read_history, report_from_record
from forgetwatch.results.report import TransitionReport
from forgetwatch.results.trajectory import Trajectory

logger = logging.getLogger(__name__)

__all__ = ["Run", "load_trajectory", "read_records", "read_run", "read_snapshot", "run_directory"]

SNAPSHOT = "base_answers.npz"
HISTORY = "history.jsonl"
PROBES = "probes.jsonl"  # the questions, for reports
TRAIN_KL = "train_kl.npz"  # the train-KL signal's rows and the base's next-token distribution on them
MANIFEST = "manifest.json"  # in a checkpoint, written last: each file's size and sha256
LATEST = "answers_latest.npz"  # the last evaluation's answers, for the report (not kept in checkpoints)
SUBDIR = "forgetwatch"  # inside the trainer's output directory and each checkpoint directory
LOCK = "watch.lock"  # while a watch writes in the run directory: its pid and host
PREVIOUS = "previous"  # previous-<n>/: an earlier run's files, set aside by a fresh run


def run_directory(path: str | os.PathLike[str]) -> Path:
    """``path``, or its ``forgetwatch/`` folder when ``path`` is a trainer's output directory.

    Example:
        >>> run_directory("/nonexistent/out")
        PosixPath('/nonexistent/out')
    """
    path = Path(path)
    if (path / SNAPSHOT).is_file() or not (path / SUBDIR / SNAPSHOT).is_file():
        return path
    return _inside(path, SUBDIR)


def _inside(directory: Path, name: str) -> Path:
    """``directory / name``; a ``ValueError`` naming it when it is a symbolic link that leads out
    of ``directory``: someone else's run directory may point its files at any file of yours."""
    path = directory / name
    if path.is_symlink() and not path.resolve().is_relative_to(directory.resolve()):
        raise ValueError(
            f"{path}: a symbolic link to {os.readlink(path)}, outside the run directory; forgetwatch does not "
            "follow it: copy the file into the run directory, or remove the link"
        )
    return path


def read_snapshot(directory: str | os.PathLike[str]) -> Answers | None:
    """The base snapshot in a forgetwatch folder, to train with; ``None`` when there is none.

    Raises :class:`~forgetwatch.results.answers.AnswersFileError` for a damaged one, saying what is
    wrong and what to do.

    Example:
        >>> read_snapshot("/nonexistent") is None
        True
    """
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


def read_records(directory: str | os.PathLike[str], base: Answers | None = None) -> list[dict[str, Any]]:
    """The history records in a forgetwatch folder (none without a history file), read by
    :func:`~forgetwatch.results.history.read_history`; with ``base``, their columns checked against
    its probes (their number and fingerprint).

    Example:
        >>> read_records("/nonexistent")
        []
    """
    path = Path(directory) / HISTORY
    if not path.is_file():
        return []
    if base is None:
        return read_history(path)
    return read_history(path, probes=len(base), fingerprint=base.probe_fingerprint)


@dataclass
class Run:
    """A monitored run as its forgetwatch directory holds it (see :func:`read_run`).

    ``history`` (each record's :class:`~forgetwatch.results.report.TransitionReport`, per category
    with its ids, as ``ForgetWatchCallback.history`` holds them) and ``trajectory`` are made
    from ``base`` and ``records`` once, when the run is made; ``probes`` and ``latest`` are
    read from ``dir`` when first asked for.

    Attributes:
        dir: the forgetwatch directory.
        base: the base snapshot.
        records: the history records, as the file holds them (every field; the file's truth).
        name: what the run is called: the folder holding ``forgetwatch/``, or the folder itself.
        history: ``(step, TransitionReport)`` per record.
        trajectory: the base's column, then each record's.

    Example:
        >>> base = Answers(ids=["q1"], correct=[True], predicted=[0], choice_logprobs=[[0.0, -1.0]],
        ...                gold_logprob=[0.0], n_choices=[2], categories=["math"], outputs=[None],
        ...                probe_fingerprint="fp")
        >>> record = {"step": 10, "report": {"n": 1, "forgotten": 1, "gained": 0, "kept": 0, "never": 0,
        ...                                  "forgotten_ids": ["q1"]}}
        >>> run = Run(Path("out/forgetwatch"), base, [record])
        >>> run.name, run.steps, run.history[0][1].forgotten_ids, run.trajectory.correct.tolist()
        ('out', [10], ['q1'], [[True, False]])
    """

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
        """The evaluations' steps."""
        return [r["step"] for r in self.records]

    @property
    def noise_floor(self) -> float | None:
        """The share of probes that flipped when the base was scored again, where it was measured."""
        return self.base.meta.get("noise_floor")

    @cached_property
    def probes(self) -> dict[str, Probe]:
        """The run's probes by id, from its ``probes.jsonl``; none where it kept no copy."""
        path = self.dir / PROBES
        return {p.id: p for p in ProbeSet.from_jsonl(path)} if path.is_file() else {}

    @cached_property
    def latest(self) -> Answers | None:
        """The last evaluation's answers (``answers_latest.npz``), when the run kept them for
        the last record's step (a run resumed from an earlier checkpoint has not written its
        own yet); a damaged file is a warning, and none."""
        path = self.dir / LATEST
        try:
            latest = Answers.load(path) if path.is_file() else None
        except AnswersFileError as err:
            logger.warning("forgetwatch: %s; the report says right or wrong for the answer now", first_line(err))
            return None
        if (
            latest is None
            or not self.records
            or latest.meta.get("step") != self.records[-1]["step"]
            or latest.ids != self.base.ids
        ):
            return None
        return latest


def read_run(run_dir: str | os.PathLike[str]) -> Run:
    """A monitored run, from its forgetwatch directory (the callback's ``output_dir``, or a
    checkpoint's ``forgetwatch/`` copy) or the trainer's output directory holding one: what
    :func:`load_trajectory` and ``forgetwatch report`` read.

    Raises ``FileNotFoundError`` without a base snapshot,
    :class:`~forgetwatch.results.history.HistoryError` (file, line, field) for a damaged record,
    columns of another probe set or size included (no history yet is no records), and a
    ``ValueError`` for a file that is a symbolic link out of the directory (never followed).

    Example:
        >>> run = read_run("out")                                        # doctest: +SKIP
        >>> run.dir, run.steps, run.trajectory                           # doctest: +SKIP
        (PosixPath('out/forgetwatch'), [10, 20], Trajectory(120 probes, steps [0, 10, 20]))
    """
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
    return Run(path, base, read_records(path, base))


def load_trajectory(run_dir: str | os.PathLike[str]) -> Trajectory:
    """The trajectory of a monitored run from its forgetwatch directory (the callback's
    ``output_dir``, or a checkpoint's ``forgetwatch/`` copy); see :func:`read_run`.

    Example:
        >>> t = load_trajectory("out/forgetwatch")                 # doctest: +SKIP
        >>> t.steps[:3], t.forgetting_events().max()                # doctest: +SKIP
    """
    return read_run(run_dir).trajectory
