"""Attacks on issue 27's fixed-cost changes that need no service: the daemon's freeze after a
worker's first task, and the reader's fetch defaults.

The daemon's ``worker`` is called with pyspark's own worker replaced by a stand-in that
returns an exit code, as pyspark's ``daemon.worker`` does after a task: what is checked is
what the wrapper does around it (a full collection and a freeze), not the task.
"""

from __future__ import annotations

import socket
from typing import Any

import pytest

from eospack import python_daemon
from eospack.connectors.kafka.source.options import parse_options


class _GcRecorder:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def collect(self, *_: Any) -> int:
        self.calls.append("collect")
        return 0

    def freeze(self) -> None:
        self.calls.append("freeze")


@pytest.fixture
def daemon_with(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``python_daemon.worker`` over a stand-in task with a given exit code; gc recorded."""
    recorder = _GcRecorder()
    monkeypatch.setattr(python_daemon, "gc", recorder)
    monkeypatch.setattr(python_daemon, "_frozen", False)

    def run(exit_code: int, reuse: bool) -> list[str]:
        if reuse:
            monkeypatch.setenv("SPARK_REUSE_WORKER", "1")
        else:
            monkeypatch.delenv("SPARK_REUSE_WORKER", raising=False)
        monkeypatch.setattr(python_daemon, "_pyspark_worker", lambda *_: exit_code)
        left, right = socket.socketpair()
        try:
            assert python_daemon.worker(left, True) == exit_code
        finally:
            left.close()
            right.close()
        return recorder.calls

    return run


def test_a_reused_worker_freezes_once_after_its_first_successful_task(daemon_with: Any) -> None:
    assert daemon_with(0, reuse=True) == ["collect", "freeze"]
    assert daemon_with(0, reuse=True) == ["collect", "freeze"]  # not again


def test_a_worker_that_is_not_reused_pays_no_extra_collection(daemon_with: Any) -> None:
    """spark.python.worker.reuse=false: pyspark's daemon exits the worker after its task
    without collecting; a full collection (30-80 ms of CPU in a worker that imported pyspark,
    pyarrow and a client) before that exit buys nothing."""
    assert daemon_with(0, reuse=False) == []


@pytest.mark.parametrize("exit_code", [1, -1])
def test_a_failed_first_task_is_not_followed_by_a_collection_and_freeze(
    daemon_with: Any, exit_code: int
) -> None:
    """A task that fails (pyspark's worker exits with a nonzero code) ends the worker: the
    daemon breaks out of its loop and exits, so a collection before that is wasted CPU."""
    assert daemon_with(exit_code, reuse=True) == []


def test_a_users_fetch_max_wait_wins_over_the_five_ms_default() -> None:
    servers = {"kafka.bootstrap.servers": "localhost:9092", "subscribe": "t"}
    assert parse_options(servers).consumer_config()["fetch_max_wait_ms"] == 5
    users = parse_options({**servers, "kafka.fetch.max.wait.ms": "250"})
    assert users.consumer_config()["fetch_max_wait_ms"] == 250


@pytest.mark.parametrize("value", ["0", "-5", "ten"])
def test_a_min_records_per_partition_that_is_not_positive_is_refused(value: str) -> None:
    from eospack.connectors.kafka.errors import KafkaSourceOptionError

    raw = {"kafka.bootstrap.servers": "localhost:9092", "subscribe": "t"}
    with pytest.raises(KafkaSourceOptionError, match="minRecordsPerPartition"):
        parse_options({**raw, "minRecordsPerPartition": value})
