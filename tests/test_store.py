"""RunStore: monitoring never kills training. Failed writes warn once, are kept, and retried.

The failures are real ones: a directory where a file should be stops writes for root too
(a read-only folder does not).
"""

from __future__ import annotations

import json
import logging
import math

import pytest

from forgetwatch.answers import Answers
from forgetwatch.history import read_history
from forgetwatch.store import HISTORY, SNAPSHOT, NotWritableError, RunStore


def record(step: int) -> dict:
    return {"step": step, "report": {"forgetting": step / 100, "choice_kl": math.inf, "logprob_drop": math.nan}}


def steps(path) -> list[int]:
    return [r["step"] for r in read_history(path)]


def answers() -> Answers:
    return Answers.from_samples("fp", {}, [dict(id="q1", correct=True, predicted=0,
                                                choice_logprobs=[-0.1, -2.0], n_choices=2)])


def failures(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "could not write" in r.getMessage()]


@pytest.fixture
def store(tmp_path):
    return RunStore(tmp_path / "run")


def test_history_lines_are_strict_json(store):
    store.append_history(record(1))
    line = store.history_path.read_text(encoding="utf-8")
    assert json.loads(line, parse_constant=pytest.fail)["report"] == {"forgetting": 0.01, "choice_kl": None,
                                                                       "logprob_drop": None}


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
    assert store.load_snapshot().ids == ["q1"]


def test_failed_checkpoint_copy_is_retried_with_everything(store, tmp_path, caplog):
    store.save_snapshot(answers())
    store.append_history(record(1))
    checkpoint = tmp_path / "checkpoint-10"
    checkpoint.mkdir()
    (checkpoint / "forgetwatch").write_text("a file where the folder goes")
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        assert store.copy_to(checkpoint / "forgetwatch") is False
    assert store.pending == 1 and len(failures(caplog)) == 1
    (checkpoint / "forgetwatch").unlink()
    assert store.append_history(record(2)) is True
    assert steps(checkpoint / "forgetwatch" / HISTORY) == [1, 2]
    assert (checkpoint / "forgetwatch" / SNAPSHOT).is_file()


def test_copy_includes_records_not_yet_on_disk(store, tmp_path):
    store.save_history([record(1)])
    store.history_path.unlink()
    store.history_path.mkdir()
    store.append_history(record(2))
    assert store.copy_to(tmp_path / "checkpoint-2" / "forgetwatch") is False  # the run's own file still owed
    assert store.pending == 1
    assert steps(tmp_path / "checkpoint-2" / "forgetwatch" / HISTORY) == [1, 2]


def test_copy_into_a_deleted_checkpoint_is_not_retried(store, tmp_path):
    store.append_history(record(1))
    checkpoint = tmp_path / "checkpoint-10"
    checkpoint.mkdir()
    (checkpoint / "forgetwatch").write_text("x")
    store.copy_to(checkpoint / "forgetwatch")
    (checkpoint / "forgetwatch").unlink()
    checkpoint.rmdir()  # rotated away (save_total_limit) before the retry
    assert store.flush() is True
    assert not checkpoint.exists()  # not recreated as a checkpoint without weights


def test_check_writable_fails_fast(store):
    store.check_writable()  # creates the folder; nothing else left behind
    assert list(store.dir.iterdir()) == []
    store.history_path.mkdir()
    with pytest.raises(NotWritableError, match=f"cannot write its files in {store.dir}.*output_dir="):
        store.check_writable()
    assert issubclass(NotWritableError, OSError)
