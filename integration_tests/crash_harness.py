"""Run a streaming driver script in its own process and crash it on purpose.

A fault point (``fault_point``) or ``kill_when`` SIGKILLs the driver, its JVM and its
Python workers together (see ``eospack.core.processes``). The next run of the same script
with the same checkpoint is the restart.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from eospack.core.processes import DriverProcess


@dataclass(frozen=True)
class DriverRun:
    returncode: int
    output: str

    @property
    def was_killed(self) -> bool:
        return self.returncode == -signal.SIGKILL

    @property
    def succeeded(self) -> bool:
        return self.returncode == 0

    def explain(self, tail: int = 3000) -> str:
        """The output's causes (Java ``Caused by``, serialization stacks) and its last lines.

        Spark's stack traces are long; a plain tail cuts off the line that says why.
        """
        causes = [
            line.strip()
            for line in self.output.splitlines()
            if line.lstrip().startswith(("Caused by", "- object not serializable", "- field"))
            or "Error:" in line
        ]
        summary = [f"exit code {self.returncode}", *causes[:40], "--- last output ---"]
        return "\n".join([*summary, self.output[-tail:]])


def run_driver(
    script: Path | str,
    arguments: Sequence[str],
    *,
    timeout: float,
    fault_point: str | None = None,
    kill_when: Callable[[], bool] | None = None,
    environment: Mapping[str, str] | None = None,
) -> DriverRun:
    """Run ``python script arguments`` to its end, or until it is crashed.

    ``fault_point`` arms a named point of commit_protocols (``name`` or ``name@batch``).
    ``kill_when`` is polled while the driver runs; when it returns True the whole driver
    session is SIGKILLed (a crash at an arbitrary instant). A driver still running after
    ``timeout`` seconds is killed and reported as a TimeoutError with its output.
    """
    driver = DriverProcess(
        [str(script), *arguments], fault_point=fault_point, environment=environment
    )
    deadline = time.monotonic() + timeout
    try:
        while driver.poll() is None:
            if time.monotonic() > deadline:
                driver.kill()
                raise TimeoutError(
                    f"driver {script} ran over {timeout} s; output:\n{driver.output(4000)}"
                )
            if kill_when is not None and kill_when():
                driver.kill()
                break
            time.sleep(0.05)
        return DriverRun(driver.process.returncode, driver.output())
    finally:
        if driver.poll() is None:
            driver.kill()
        driver.log_path.unlink(missing_ok=True)
