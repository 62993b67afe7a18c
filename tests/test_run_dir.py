"""The one reader of a run directory: what the store writes, read back whole by read_run."""

from __future__ import annotations

import io
import logging
import struct
import zipfile

import numpy as np
import pytest

from forgetwatch import load_trajectory
from forgetwatch.cli import main
from forgetwatch.common import files
from forgetwatch.probes import ProbeError, ProbeSet
from forgetwatch.results.answers import Answers, AnswersFileError
from forgetwatch.results.history import history_record
from forgetwatch.results.metrics import compare
from forgetwatch.results.trajectory import Trajectory, with_trajectory_metrics
from forgetwatch.scoring.next_tokens import BaseDistribution, KeptFileError
from forgetwatch.store import LATEST, PROBES, SNAPSHOT
from forgetwatch.store.read import Run, read_run
from forgetwatch.store.write import RunStore

PROBE_ROWS = [
    {
        "id": f"q{i}",
        "question": f"Question {i}?",
        "choices": ["yes", "no"],
        "answer": 0,
        "category": "math" if i < 3 else "law",
    }
    for i in range(6)
]
#: right (True) or wrong at the base, step 10 and step 20, per probe
COLUMNS = [
    (True, False, False),
    (True, True, False),
    (False, True, True),
    (True, False, True),
    (False, False, False),
    (True, True, True),
]


def answers(probes, column, step=None):
    """The answers of a model that is right on the probes ``column`` says, its margins as far from 0."""
    samples = [
        {
            "id": p.id,
            "category": p.category,
            "correct": row[column],
            "predicted": 0 if row[column] else 1,
            "choice_logprobs": [-0.5, -1.5] if row[column] else [-1.5, -0.5],
            "n_choices": 2,
        }
        for p, row in zip(probes, COLUMNS)
    ]
    return Answers.from_samples(probes.fingerprint(), {}, samples, meta={} if step is None else {"step": step})


@pytest.fixture
def run(tmp_path):
    """A run directory written as the callback writes it: snapshot, probes, two evaluations
    (each with its trajectory column and figures), the last one's answers. Its reports, as made."""
    probes = ProbeSet.from_records(PROBE_ROWS)
    base = answers(probes, 0)
    store = RunStore(tmp_path / "out" / "forgetwatch")
    store.save_snapshot(base)
    store.save_probes(probes)
    trajectory, reports = Trajectory.start(base), []
    for column, step in ((1, 10), (2, 20)):
        now = answers(probes, column, step)
        trajectory = trajectory.plus(step, now)
        reports.append(with_trajectory_metrics(compare(base, now), trajectory))
        store.append_history(
            history_record(
                step,
                reports[-1],
                time=float(step),
                seconds=0.5,
                trigger="schedule",
                stop="forgetting above 10%" if step == 20 else None,
                columns=trajectory.column(),
            )
        )
        store.save_latest(now)
    return store.dir, reports, trajectory


def test_a_run_is_read_whole_from_the_trainers_output_directory(run):
    directory, reports, trajectory = run
    read = read_run(directory.parent)  # the trainer's output directory: its forgetwatch/ folder is found
    assert read.dir == directory and read.name == "out" and read.steps == [10, 20]
    assert read.records[-1]["stop"] == "forgetting above 10%"
    # each evaluation's report as it was made, per category ids included
    assert [step for step, _ in read.history] == [10, 20]
    assert [r.to_dict() for _, r in read.history] == [r.to_dict() for r in reports]
    assert read.history[0][1].by_category["math"].forgotten_ids == ["q0"]
    assert read.history[0][1].by_category["law"].forgotten_ids == ["q3"]
    # the trajectory, to the bit the history stores
    assert read.trajectory.correct.tolist() == [list(row) for row in COLUMNS]
    np.testing.assert_array_equal(read.trajectory.signal, trajectory.signal)
    assert load_trajectory(directory).correct.tolist() == read.trajectory.correct.tolist()
    # the probes kept beside it, and the last evaluation's answers
    assert list(read.probes) == [r["id"] for r in PROBE_ROWS] and read.probes["q4"].category == "law"
    assert read.latest is not None and read.latest.correct.tolist() == [row[2] for row in COLUMNS]
    assert read.noise_floor is None


def test_a_run_made_from_records_is_the_run_read(run):
    """What a resume holds (the base and the records it kept) gives the same reports and trajectory."""
    directory, _, _ = run
    read = read_run(directory)
    again = Run(directory, read.base, read.records[:1])
    assert [r.to_dict() for _, r in again.history] == [r.to_dict() for _, r in read.history[:1]]
    assert again.trajectory.correct.tolist() == read.trajectory.correct[:, :2].tolist()


def test_the_latest_answers_serve_only_the_last_evaluation(run, caplog):
    directory, _, _ = run
    probes = ProbeSet.from_records(PROBE_ROWS)
    answers(probes, 1, step=10).save(directory / LATEST)  # a resumed run, not evaluated since
    assert read_run(directory).latest is None
    answers(probes.subset(["q0", "q1"]), 1, step=20).save(directory / LATEST)  # other probes
    assert read_run(directory).latest is None
    (directory / LATEST).write_bytes(b"not an npz")
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        assert read_run(directory).latest is None
    assert "answers_latest.npz" in caplog.text and "right or wrong" in caplog.text


def test_the_probes_and_latest_answers_are_read_only_when_asked_for(run):
    directory, _, _ = run
    (directory / PROBES).write_text('{"id": "q0"}\n')  # damaged: no question
    (directory / LATEST).write_bytes(b"not an npz")
    assert load_trajectory(directory).steps.tolist() == [0, 10, 20]  # neither is read for a trajectory
    run = read_run(directory)
    with pytest.raises(ProbeError, match="probes.jsonl"):
        _ = run.probes


def test_no_base_snapshot_says_what_to_give(tmp_path):
    with pytest.raises(FileNotFoundError, match="base_answers.npz: no base snapshot; give the forgetwatch directory"):
        read_run(tmp_path)


# -- someone else's run directory: sizes from the headers, no pickles, no links out ---------------


def replace_member(path, name, data):
    """The npz at ``path`` with its member ``name`` holding ``data`` instead."""
    with zipfile.ZipFile(path) as z:
        members = {m: z.read(m) for m in z.namelist()}
    members[name] = data
    with zipfile.ZipFile(path, "w") as z:
        for member, content in members.items():
            z.writestr(member, content)


def npy(shape, descr="|b1", data=b""):
    """An .npy file whose header claims ``shape`` entries of ``descr``, followed by ``data``."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": descr, "fortran_order": False, "shape": shape})
    return buffer.getvalue() + data


def report_error(directory, tmp_path, capsys):
    """``forgetwatch report`` on ``directory``: its exit code 2 and its one line of error."""
    assert main(["report", str(directory), "--out", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    return err


def test_an_array_header_claiming_10_13_entries_is_refused_before_anything_is_allocated(run, tmp_path, capsys):
    directory, _, _ = run
    replace_member(directory / SNAPSHOT, "correct.npy", npy((10**13,), data=b"\x01" * 6))
    err = report_error(directory, tmp_path, capsys)  # not 9 TiB asked for: one line, at once
    assert f"{directory / SNAPSHOT}: damaged or not a forgetwatch answers file" in err
    assert "its array 'correct' claims 10,000,000,000,000 entries of bool in 6 bytes" in err


def test_a_zip_claiming_gigabytes_is_refused_before_any_is_inflated(run, tmp_path, capsys, monkeypatch):
    directory, _, _ = run
    data = bytearray((directory / SNAPSHOT).read_bytes())
    entry = data.index(b"PK\x01\x02")  # the first member's entry in the central directory: its unpacked size
    struct.pack_into("<I", data, entry + 24, 3_000_000_000)
    (directory / SNAPSHOT).write_bytes(bytes(data))
    assert "claims 3,000,00" in report_error(directory, tmp_path, capsys)

    # a real, highly compressible member past the cap (lowered here): refused from its header, never read
    def never(*args, **kwargs):
        raise AssertionError("an array was read")

    np.savez_compressed(directory / LATEST, header=np.array("{}"), outputs_utf8=np.zeros(4 << 20, np.uint8))
    assert (directory / LATEST).stat().st_size < 64 << 10
    monkeypatch.setattr(files, "MAX_NPZ_BYTES", 1 << 20)
    monkeypatch.setattr(np.lib.format, "read_array", never)
    with pytest.raises(AnswersFileError, match=r"it claims 4,194,\d+ bytes unpacked, more than the 1,048,576"):
        Answers.load(directory / LATEST)


def test_kept_distributions_are_read_by_the_same_checks(tmp_path):
    base = BaseDistribution(
        ["r1"],
        np.array([0, 1]),
        np.array([[3]], dtype=np.int32),
        np.array([[0.0]], dtype=np.float16),
        np.array([-np.inf], dtype=np.float32),
    )
    base.save(tmp_path / "d.npz")
    replace_member(tmp_path / "d.npz", "tail.npy", npy((10**12,), "<f4", b"\0" * 4))
    with pytest.raises(KeptFileError, match=r"damaged or not a base distribution \(its array 'tail' claims"):
        BaseDistribution.load(tmp_path / "d.npz")
    replace_member(tmp_path / "d.npz", "tail.npy", npy((1,), "|O", b"\0" * 8))
    with pytest.raises(KeptFileError, match=r"holds pickled \(object\) data, which forgetwatch never loads"):
        BaseDistribution.load(tmp_path / "d.npz")


def test_links_out_of_the_run_directory_are_not_followed(run, tmp_path, capsys):
    directory, _, _ = run
    secret = tmp_path / "elsewhere.jsonl"
    secret.write_text((directory / PROBES).read_text())
    (directory / PROBES).unlink()
    (directory / PROBES).symlink_to(secret)
    err = report_error(directory, tmp_path, capsys)
    assert err == (
        f"forgetwatch: error: {directory / PROBES}: a symbolic link to {secret}, outside the run directory; "
        "forgetwatch does not follow it: copy the file into the run directory, or remove the link"
    )
    # a link inside the directory is read; so is the forgetwatch folder, unless it leads out of the run
    (directory / PROBES).unlink()
    (directory / "kept.jsonl").write_text(secret.read_text())
    (directory / PROBES).symlink_to("kept.jsonl")
    assert list(read_run(directory.parent).probes) == [r["id"] for r in PROBE_ROWS]
    outside = tmp_path / "moved"
    directory.rename(outside)
    directory.symlink_to(outside)
    assert f"{directory}: a symbolic link to {outside}, outside the run directory" in report_error(
        directory.parent, tmp_path, capsys
    )
