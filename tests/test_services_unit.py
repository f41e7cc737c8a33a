"""The service fixtures' process control, on a plain child process (no broker needed)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from eospack.lab.services.embedded import _ChildProcess, thread_states
from eospack.lab.testing import wait_until

BUSY_THREADS = """
import threading
def spin():
    while True:
        pass
for _ in range(4):
    threading.Thread(target=spin, daemon=True).start()
spin()
"""


@pytest.mark.timeout(60)
def test_pause_returns_only_once_every_thread_is_stopped() -> None:
    """A paused broker must answer nothing from the moment ``pause`` returns: SIGSTOP is
    asynchronous, so ``pause`` waits until no thread of the process runs (CI once saw a
    commit answered right after ``pause``)."""
    child = _ChildProcess()
    child.process = subprocess.Popen([sys.executable, "-c", BUSY_THREADS])
    try:
        wait_until(
            lambda: len(thread_states(child.process.pid)) == 5,
            timeout=30,
            description="the child's five spinning threads",
        )
        child.pause()
        states = thread_states(child.process.pid)
        assert len(states) == 5, states
        assert set(states) <= {"T", "t"}, states
        child.resume()
        assert child.process.poll() is None
    finally:
        child.process.kill()
        child.process.wait(10)
        child.stop()
