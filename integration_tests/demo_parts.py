"""Running ``eospack demo`` as a user does, in its own process, bounded in time."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Mapping

import pytest

DEMO_TIMEOUT = 480
"""Seconds for the whole demo process: 2 to 2.5 min on an idle 2-core machine (two Spark
drivers starting, a SIGKILL and a restart), with room for a loaded CI runner."""
INTERRUPTED_TIMEOUT = 60
"""How long an interrupted demo may take to stop its pipelines before it is killed."""


def run_demo(
    command: list[str], environment: Mapping[str, str] | None = None
) -> tuple[int, str, str]:
    """Run the demo; past ``DEMO_TIMEOUT`` interrupt it (Ctrl-C) so that it stops its
    pipeline drivers, which run in sessions of their own and would outlive a SIGKILL."""
    demo = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment
    )
    try:
        stdout, stderr = demo.communicate(timeout=DEMO_TIMEOUT)
    except subprocess.TimeoutExpired:
        demo.send_signal(signal.SIGINT)
        try:
            stdout, stderr = demo.communicate(timeout=INTERRUPTED_TIMEOUT)
        except subprocess.TimeoutExpired:
            demo.kill()
            stdout, stderr = demo.communicate()
        pytest.fail(f"the demo ran over {DEMO_TIMEOUT} s:\n{stdout[-4000:]}\n{stderr[-4000:]}")
    return demo.returncode, stdout, stderr
