"""Driver processes that can be crashed on purpose: the demo's pipelines and crash tests.

A driver runs in a new session, so one SIGKILL to its process group ends the Python
driver and its JVM together (Spark's Python workers follow when the JVM's pipes close):
what a machine or container crash does to a Spark application.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from eospack.core.fault_points import FAULT_POINT_VARIABLE, KILL_GROUP_VARIABLE


class DriverProcess:
    """``python <arguments>`` in its own session with its output in a log file."""

    def __init__(
        self,
        arguments: Sequence[str],
        *,
        fault_point: str | None = None,
        environment: Mapping[str, str] | None = None,
        log_path: Path | None = None,
    ) -> None:
        env = {**os.environ, **(environment or {})}
        env.pop(FAULT_POINT_VARIABLE, None)
        if fault_point:
            env[FAULT_POINT_VARIABLE] = fault_point
            env[KILL_GROUP_VARIABLE] = "session"
        if log_path is None:
            handle, name = tempfile.mkstemp(prefix="eospack-driver-", suffix=".log")
            os.close(handle)
            log_path = Path(name)
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, *arguments],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def poll(self) -> int | None:
        return self.process.poll()

    def kill(self) -> None:
        """SIGKILL the whole driver session and wait until the driver is gone."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(30)

    def output(self, last_chars: int | None = None) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return text[-last_chars:] if last_chars else text
