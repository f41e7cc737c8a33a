"""Attacks on ``eospack savepoint create --stop`` (issue 41), pure logic: the requester
(``request_stop_with_savepoint``) and ``StopRequestListener`` talk through files in a local
checkpoint; the query, Spark's stop (``stop_after_batch``) and the savepoint are fakes.

The property: the requester's outcome matches the query's. It either reports that nothing
stopped, and the query was not made to stop, or the query stopped and the savepoint is
written. FIXED: a listener seeing the request late stopped the query up to a second past
the deadline (``max(1.0, remaining)``), and a query made to stop just before the deadline
ended after the requester's last check: both times the requester said "no query stopped"
and the query then stopped without a savepoint (under ``supervise``, for good).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from eospack.lab.testing import wait_until
from eospack.tools import stop_with_savepoint as stopping
from eospack.tools.stop_with_savepoint import (
    STOP_REQUEST,
    StopRequestListener,
    StopWithSavepointError,
    request_stop_with_savepoint,
)

QUERY_ID, RUN_ID = "query-1", "run-1"
TIMEOUT = 2.0
WAIT_SECONDS = 30.0


class Scene:
    """A checkpoint, a fake query in a fake session, the listener, and what happened."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.checkpoint = tmp_path / "checkpoint"
        self.checkpoint.mkdir()
        (self.checkpoint / "metadata").write_text(json.dumps({"id": QUERY_ID}) + "\n")
        self.destination = tmp_path / "savepoint"
        self.query = SimpleNamespace(id=QUERY_ID, runId=RUN_ID, name="q")
        session = SimpleNamespace(streams=SimpleNamespace(get=lambda _: self.query))
        self.listener = StopRequestListener(session)  # type: ignore[arg-type]
        self.marked: list[float] = []  # when the query was made to stop (time.time())
        self.savepoints: list[str] = []
        self.outcome: dict[str, Any] = {}
        monkeypatch.setattr(stopping, "checkpoint_of", lambda query: str(self.checkpoint))
        monkeypatch.setattr(stopping, "require_committed_boundary", lambda files: 7)
        monkeypatch.setattr(stopping, "create_savepoint", self.create_savepoint)

    def create_savepoint(self, spark: Any, checkpoint: Any, destination: Any) -> Any:
        self.savepoints.append(str(destination))
        return SimpleNamespace(batch_id=7)

    def request(self) -> threading.Thread:
        """``eospack savepoint create --stop --timeout TIMEOUT`` in a thread."""

        def requester() -> None:
            try:
                self.outcome["manifest"] = request_stop_with_savepoint(
                    None,  # type: ignore[arg-type]  # local paths need no session
                    self.checkpoint,
                    self.destination,
                    timeout=TIMEOUT,
                    poll_seconds=0.02,
                )
            except StopWithSavepointError as error:
                self.outcome["error"] = str(error)

        thread = threading.Thread(target=requester, daemon=True)
        thread.start()
        wait_until(lambda: (self.checkpoint / STOP_REQUEST).exists(), WAIT_SECONDS, "the request")
        return thread

    def deadline(self) -> float:
        request = json.loads((self.checkpoint / STOP_REQUEST).read_text())
        return float(request["deadline"])

    def query_ends(self) -> None:
        """Spark's QueryTerminatedEvent of a query that ended normally."""
        self.listener.onQueryTerminated(SimpleNamespace(id=QUERY_ID, runId=RUN_ID, exception=None))

    def assert_outcomes_agree(self) -> None:
        if self.marked:
            assert self.outcome.get("manifest") is not None, self.outcome
            assert self.savepoints == [str(self.destination)]
        else:
            assert "no query on" in self.outcome.get("error", ""), self.outcome
            assert self.savepoints == []
        assert sorted(p.name for p in self.checkpoint.iterdir()) == ["metadata"]


def test_fixed_a_listener_that_sees_the_request_late_never_stops_the_query_unseen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The query's batch ends 0.3 s before the deadline and its progress event reaches the
    listener then; the query's next batch ends 0.3 s after the deadline (a stop in it is
    possible as long as ``stop_after_batch`` was given time)."""
    scene = Scene(tmp_path, monkeypatch)

    def stop_after_batch(query: Any, timeout: float) -> None:
        called = time.time()
        batch_ends = deadline + 0.3
        if batch_ends > called + timeout:
            raise StopWithSavepointError("no batch boundary within the timeout")
        wait_until(lambda: time.time() >= batch_ends, WAIT_SECONDS, "the batch's end")
        scene.marked.append(time.time())

    monkeypatch.setattr(stopping, "stop_after_batch", stop_after_batch)
    requester = scene.request()
    deadline = scene.deadline()
    wait_until(lambda: time.time() >= deadline - 0.3, WAIT_SECONDS, "0.3 s before the deadline")
    scene.listener.onQueryProgress(SimpleNamespace(progress=scene.query))
    requester.join(WAIT_SECONDS)
    wait_until(
        lambda: scene.marked or RUN_ID not in scene.listener.honoured,
        WAIT_SECONDS,
        "the listener to stop the query or leave it",
    )
    if scene.marked:
        scene.query_ends()
    requester.join(WAIT_SECONDS)
    scene.assert_outcomes_agree()


def test_fixed_a_query_made_to_stop_before_the_deadline_that_ends_after_it_is_savepointed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The listener sees the request at once; the query's batch ends (it is made to stop)
    just before the listener's time is up, and its termination event comes after the
    requester's deadline (a slow commit, a busy listener bus)."""
    scene = Scene(tmp_path, monkeypatch)

    def stop_after_batch(query: Any, timeout: float) -> None:
        batch_ends = time.time() + timeout - 0.05
        wait_until(lambda: time.time() >= batch_ends, WAIT_SECONDS, "the batch's end")
        scene.marked.append(time.time())

    monkeypatch.setattr(stopping, "stop_after_batch", stop_after_batch)
    requester = scene.request()
    deadline = scene.deadline()
    scene.listener.onQueryProgress(SimpleNamespace(progress=scene.query))
    wait_until(lambda: scene.marked, WAIT_SECONDS, "the query made to stop")
    wait_until(lambda: time.time() > deadline + 0.2, WAIT_SECONDS, "the requester's deadline")
    scene.query_ends()
    requester.join(WAIT_SECONDS)
    assert not requester.is_alive()
    scene.assert_outcomes_agree()
