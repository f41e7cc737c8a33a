"""Where ``stop_after_batch`` may mark a query terminated (``_parked_at``), on fakes of the
JVM's lock and query thread, and the CLI's stop request refusals and withdrawal on a
checkpoint nobody runs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from eospack.tools.stop_with_savepoint import (
    STOP_REQUEST,
    StopWithSavepointError,
    _parked_at,
    request_stop_with_savepoint,
)


@dataclass
class Frame:
    """The fakes keep the JVM's method names."""

    method: str

    def getMethodName(self) -> str:
        return self.method


@dataclass
class ThreadState:
    name: str

    def toString(self) -> str:
        return self.name


@dataclass
class Thread:
    state: str
    methods: tuple[str, ...]

    def getState(self) -> ThreadState:
        return ThreadState(self.state)

    def getStackTrace(self) -> list[Frame]:
        return [Frame(method) for method in self.methods]


@dataclass
class Lock:
    queued: bool

    def hasQueuedThread(self, thread: Thread) -> bool:
        return self.queued


LOOP = ("lambda", "execute", "executeOneBatch", "runActivatedStream", "runStream", "run")


@pytest.mark.parametrize(
    ("queued", "state", "methods", "place"),
    [
        # waiting for the lock to plan: it passed its trigger's check, let the batch through
        (
            True,
            "WAITING",
            ("park", "lock", "withProgressLocked", "constructNextBatch", *LOOP),
            "planning",
        ),
        # waiting for the lock to commit its batch: its job is done, nothing can cut it
        (True, "WAITING", ("park", "lock", "withProgressLocked", "runBatch", *LOOP), "safe"),
        # waiting for the lock to signal after a trigger
        (True, "WAITING", ("park", "lock", "withProgressLocked", *LOOP), "safe"),
        # sleeping until the next trigger: it will find the query stopped
        (False, "TIMED_WAITING", ("sleep", "waitTillTime", "execute", "runStream"), "safe"),
        # sleeping inside a batch (its job, a source): not parked
        (False, "TIMED_WAITING", ("sleep", "runJob", "runBatch", *LOOP), "moving"),
        (False, "TIMED_WAITING", ("sleep", "populateStartOffsets", "runStream"), "moving"),
        (False, "RUNNABLE", LOOP, "moving"),
        (False, "WAITING", ("park", "awaitReady", "runJob", "runBatch", *LOOP), "moving"),
    ],
)
def test_the_query_is_marked_terminated_only_where_no_batch_can_be_cut(
    queued: bool, state: str, methods: tuple[str, ...], place: str
) -> None:
    assert _parked_at(Lock(queued), Thread(state, methods)) == place


def test_a_stop_request_nobody_honours_is_one_line_and_withdrawn(tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "metadata").write_text(json.dumps({"id": "q"}) + "\n")
    with pytest.raises(StopWithSavepointError) as refused:
        request_stop_with_savepoint(
            None,  # type: ignore[arg-type]  # local paths need no session
            checkpoint,
            tmp_path / "savepoint",
            timeout=0.3,
            poll_seconds=0.05,
        )
    assert "no query on" in str(refused.value) and "\n" not in str(refused.value)
    assert not (checkpoint / STOP_REQUEST).exists()
    assert not (tmp_path / "savepoint").exists()


def test_a_stop_request_is_refused_for_no_checkpoint_an_existing_target_or_no_time(
    tmp_path: Path,
) -> None:
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    with pytest.raises(StopWithSavepointError, match="is not a streaming checkpoint"):
        request_stop_with_savepoint(None, checkpoint, tmp_path / "sp", timeout=1)  # type: ignore[arg-type]
    (checkpoint / "metadata").write_text(json.dumps({"id": "q"}) + "\n")
    (tmp_path / "sp").mkdir()
    with pytest.raises(StopWithSavepointError, match="exists: give a new directory"):
        request_stop_with_savepoint(None, checkpoint, tmp_path / "sp", timeout=1)  # type: ignore[arg-type]
    with pytest.raises(StopWithSavepointError, match="positive number of seconds"):
        request_stop_with_savepoint(None, checkpoint, tmp_path / "new", timeout=0)  # type: ignore[arg-type]
    assert not (checkpoint / STOP_REQUEST).exists()
