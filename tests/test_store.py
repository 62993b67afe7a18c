"""RunStore: monitoring never kills training. Failed writes warn once, are kept, and retried.
One watch per directory, and a fresh run sets an earlier run's files aside, all of them.

The failures are real ones: a directory where a file should be stops writes for root too
(a read-only folder does not).
"""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import shutil
import socket
import subprocess
import sys

import pytest

from forgetwatch.results.answers import Answers
from forgetwatch.store import FILES, HISTORY, LOCK, MERGED, SNAPSHOT
from forgetwatch.store.read import read_history, read_snapshot
from forgetwatch.store.write import NotWritableError, RunStore


def record(step: int) -> dict:
    return {
        "step": step,
        "report": {
            "n": 100,
            "forgotten": step,
            "gained": 0,
            "kept": 100 - step,
            "never": 0,
            "forgetting": step / 100,
            "choice_kl": math.inf,
            "logprob_drop": math.nan,
        },
    }


def steps(path) -> list[int]:
    return [r["step"] for r in read_history(path)]


def answers() -> Answers:
    return Answers.from_samples(
        "fp", {}, [dict(id="q1", correct=True, predicted=0, choice_logprobs=[-0.1, -2.0], n_choices=2)]
    )


def failures(caplog) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "could not write" in r.getMessage()
    ]


@pytest.fixture
def store(tmp_path):
    return RunStore(tmp_path / "run")


def test_history_lines_are_strict_json(store):
    store.append_history(record(1))
    line = store.history_path.read_text(encoding="utf-8")
    assert json.loads(line, parse_constant=pytest.fail)["report"] == {
        "n": 100,
        "forgotten": 1,
        "gained": 0,
        "kept": 99,
        "never": 0,
        "forgetting": 0.01,
        "choice_kl": None,
        "logprob_drop": None,
    }


def test_failed_history_writes_are_kept_and_retried(store, caplog):
    store.save_history([record(1)])
    store.history_path.unlink()
    store.history_path.mkdir()  # a directory where the history file was
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        assert store.append_history(record(2)) is False  # no exception: training goes on
        assert store.pending == 1
        assert store.append_history(record(3)) is False
        assert store.pending == 2
    messages = failures(caplog)
    assert len(messages) == 2  # one warning per failure
    assert str(store.history_path) in messages[0] and "Is a directory" in messages[0]
    assert "kept in memory" in messages[0] and "training goes on" in messages[0]

    store.history_path.rmdir()  # the user fixes it
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        assert store.append_history(record(4)) is True
    assert failures(caplog) == []
    assert store.pending == 0
    assert steps(store.history_path) == [1, 2, 3, 4]  # everything, in order, earlier records too
    store.append_history(record(5))  # back to appending lines
    assert steps(store.history_path) == [1, 2, 3, 4, 5]


def test_retry_without_knowing_earlier_records_keeps_the_file(tmp_path):
    # a store that did not write the file's first records (a second process, or a reader
    # turned writer) reads them back before rewriting it
    RunStore(tmp_path).append_history(record(1))
    store = RunStore(tmp_path)
    history = store.history_path
    history.rename(tmp_path / "moved")
    history.mkdir()
    assert store.append_history(record(2)) is False
    history.rmdir()
    (tmp_path / "moved").rename(history)
    assert store.flush() is True
    assert steps(history) == [1, 2]


def test_failed_save_history_is_retried(store):
    store.dir.mkdir()
    store.history_path.mkdir()
    assert store.save_history([record(1), record(2)]) is False
    assert store.pending == 2
    store.history_path.rmdir()
    assert store.flush() is True
    assert steps(store.history_path) == [1, 2]


def test_failed_snapshot_save_is_kept_and_retried(store, caplog):
    store.dir.mkdir()
    store.snapshot_path.mkdir()
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        assert store.save_snapshot(answers()) is False
    assert store.pending == 1 and len(failures(caplog)) == 1
    assert "base snapshot" in failures(caplog)[0]
    store.snapshot_path.rmdir()
    assert store.append_history(record(1)) is True  # the next write retries it
    assert store.pending == 0
    assert read_snapshot(store.dir).ids == ["q1"]


def test_check_writable_fails_fast(store):
    store.check_writable()  # creates the folder; nothing else left behind
    assert list(store.dir.iterdir()) == []
    store.history_path.mkdir()
    with pytest.raises(NotWritableError, match=f"cannot write its files in {store.dir}.*output_dir="):
        store.check_writable()
    assert issubclass(NotWritableError, OSError)


# -- the run directory's own files ------------------------------------------------------------


class Probes:
    """What the store needs of a probe set: a way to write it."""

    def to_jsonl(self, path):
        path.write_text('{"id": "q1", "question": "?", "choices": ["a", "b"], "answer": 0}\n')


def test_leftover_temporary_files_are_removed_only_ours(store):
    from forgetwatch.common.files import atomic_write

    store.dir.mkdir()
    ours = [store.dir / ".history.jsonl.abc123xy.tmp", store.dir / ".base_answers.npz.k2j3h4g5.tmp"]
    theirs = [
        store.dir / ".model.safetensors.abc123xy.tmp",
        store.dir / "history.jsonl.tmp",
        store.dir / "history.jsonl",
    ]
    for path in ours + theirs:
        path.write_text("x")
    folders = [store.dir / ".merged.q1w2e3r4.tmp", store.dir / ".merged.a1s2d3f4.tmp.old"]  # a save cut short
    for folder in folders:
        (folder / "model.safetensors").parent.mkdir()
        (folder / "model.safetensors").write_text("x")
    (store.dir / ".model.q1w2e3r4.tmp").mkdir()  # not a name of ours
    theirs.append(store.dir / ".model.q1w2e3r4.tmp")
    ours += folders
    assert sorted(store.remove_leftovers()) == sorted(ours)
    assert all(p.exists() for p in theirs) and not any(p.exists() for p in ours)
    with pytest.raises(RuntimeError), atomic_write(store.dir / "probes.jsonl") as f:
        f.write("cut short")
        raise RuntimeError  # a failing write cleans up after itself: nothing left to remove
    assert store.remove_leftovers() == []


def test_a_run_directory_deleted_during_training_is_written_again_from_memory(store, caplog):
    from forgetwatch.store import PROBES

    store.save_snapshot(answers())
    store.save_probes(Probes())
    store.save_history([])
    store.append_history(record(1))
    shutil.rmtree(store.dir)
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        assert store.append_history(record(2)) is True
        shutil.rmtree(store.dir)
        assert store.flush() is True
    lost = [r.getMessage() for r in caplog.records if "disappeared" in r.getMessage()]
    assert len(lost) == 1 and str(store.dir) in lost[0]  # said once
    assert "base_answers.npz, probes.jsonl, history.jsonl" in lost[0]
    assert steps(store.dir / HISTORY) == [1, 2]  # earlier records too, not a history begun anew
    assert Answers.load(store.dir / SNAPSHOT).ids == ["q1"] and (store.dir / PROBES).is_file()


def test_a_resume_cuts_the_history_at_its_step_in_one_write_and_keeps_a_damaged_one(store, caplog):
    store.save_history([record(1), record(2), record(3)])
    assert [r["step"] for r in store.resume_history(2)] == [1, 2]  # step 3: the killed run's abandoned future
    assert steps(store.history_path) == [1, 2]
    assert store.append_history(record(3)) and steps(store.history_path) == [1, 2, 3]
    assert [r["step"] for r in store.resume_history(5)] == [1, 2, 3]  # nothing to cut: left as it is

    from forgetwatch.common.files import json_line

    damaged = (json_line(record(1)) + "{garbage\n" + json_line(record(3))).encode()
    store.history_path.write_bytes(damaged)
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        assert [r["step"] for r in store.resume_history(3)] == [1]
    aside = store.dir / "history.jsonl.damaged-1"
    assert aside.read_bytes() == damaged and "line 2" in caplog.text and str(aside) in caplog.text
    assert steps(store.history_path) == [1]
    store.history_path.write_bytes(damaged)
    store.resume_history(3)
    assert (store.dir / "history.jsonl.damaged-2").read_bytes() == damaged == aside.read_bytes()
    store.history_path.unlink()
    assert store.resume_history(3) == [] and steps(store.history_path) == []


def write_run(folder, mark: str) -> dict[str, bytes]:
    """Every file forgetwatch writes in a run directory, each with bytes of its own (the merged model a folder);
    the bytes by name."""
    folder.mkdir(parents=True, exist_ok=True)
    names = (*FILES, f"{HISTORY}.damaged-1")
    files = {name: f"{mark}:{name}".encode() for name in names if name != MERGED}
    for name, data in files.items():
        (folder / name).write_bytes(data)
    (folder / MERGED).mkdir()
    (folder / MERGED / "model.safetensors").write_bytes(mark.encode())
    files[f"{MERGED}/model.safetensors"] = mark.encode()
    return files


def held(folder) -> dict[str, bytes]:
    """The run's files in ``folder``, those of the merged model's folder too."""
    paths = [*folder.iterdir(), *(folder / MERGED).glob("*")]
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in paths if p.is_file()}


def test_a_fresh_run_sets_every_file_of_an_earlier_run_aside_together(store):
    store.dir.mkdir()
    assert store.set_aside() is None  # nothing to set aside
    (store.dir / "notes.txt").write_text("the user's")
    first = write_run(store.dir, "first")
    assert store.set_aside() == store.dir / "previous-1"
    assert held(store.dir / "previous-1") == first  # all of them, byte for byte, together
    assert held(store.dir) == {"notes.txt": b"the user's"}  # nothing else is touched
    second = write_run(store.dir, "second")
    assert store.set_aside() == store.dir / "previous-2" and held(store.dir / "previous-2") == second
    assert held(store.dir / "previous-1") == first


def test_the_newest_set_aside_has_the_largest_number_also_after_one_was_deleted(store):
    for mark in ("first", "second"):
        write_run(store.dir, mark)
        store.set_aside()
    shutil.rmtree(store.dir / "previous-1")  # deleted by hand
    third = write_run(store.dir, "third")
    assert store.set_aside() == store.dir / "previous-3" and held(store.dir / "previous-3") == third
    assert sorted(p.name for p in store.dir.iterdir()) == ["previous-2", "previous-3"]


def lock_of(pid: int, host: str | None = None) -> str:
    return json.dumps({"pid": pid, "host": host or socket.gethostname()})


def test_one_watch_per_directory_and_a_gone_ones_lock_is_taken_over(store, caplog):
    store.check_writable()
    store.claim()
    lock = store.dir / LOCK
    assert json.loads(lock.read_text()) == {"pid": os.getpid(), "host": socket.gethostname()}
    store.release()
    assert not lock.exists()
    other = RunStore(store.dir)
    other.claim()
    del other
    gc.collect()
    assert not lock.exists()  # a store collected frees its directory

    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock.write_text(lock_of(int(ended.stdout)))
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        store.claim()
    assert f"taking over {lock}, left by process {int(ended.stdout)}, which has ended" in caplog.text
    store.release()

    for theirs, says in [
        (lock_of(os.getppid()), f"a watch of process {os.getppid()} on {socket.gethostname()} writes in"),
        (lock_of(1234, "another-host"), "a watch of process 1234 on another-host writes in"),
        ("", "cannot be read"),
    ]:
        lock.write_text(theirs)
        with pytest.raises(NotWritableError, match=says) as refused:
            RunStore(store.dir).claim()
        assert lock.read_text() == theirs
        if theirs:
            assert f"if that run has ended, delete {lock}" in str(refused.value)


@pytest.mark.parametrize("fresh", [True, False])
def test_a_later_store_of_this_process_takes_the_directory_over(store, caplog, fresh):
    store.check_writable()
    store.claim()
    store.save_snapshot(answers())
    store.append_history(record(1))
    earlier = held(store.dir)
    later = RunStore(store.dir)
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        later.claim()  # a loop that raised cannot be told from a live one here: the later one wins
        assert "another watch of this process wrote in" in caplog.text
        if fresh:  # the earlier one goes on among its files, set aside
            folder = later.set_aside()
            assert store.dir == folder and store.append_history(record(2)) and steps(folder / HISTORY) == [1, 2]
        else:  # resumed by the later one: the earlier one writes nothing more
            assert store.append_history(record(2)) is False and store.flush() is False
            assert held(store.dir) == earlier
            assert "this watch writes nothing more there" in caplog.text
    store.release()  # the earlier one's end leaves the later one's lock
    assert (later.dir / LOCK).exists()
    later.release()
    assert not (later.dir / LOCK).exists()
