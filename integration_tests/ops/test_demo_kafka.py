"""``eospack demo --sink kafka``: the demo's 2pc-kafka variant runs to VERIFIED.

The demo is run as a user runs it, as a command (``python -m eospack.cli demo``) in its own
process, small: 3,000 events, one crash of count_1, 5 s of production. It uses the
session's broker (``--bootstrap-servers``) instead of starting a second one: same embedded
Apache Kafka, one JVM less on a 2-core machine. What the demo checks (per key nothing lost
or duplicated, no count going backwards, no open transaction or unfinished ledger slot)
is its own code, unit-tested in ``tests/test_demo_verify.py``; the 2pc-kafka sink's crash
points are ``test_kafka_sink``'s. This test shows that the pieces work together.

In the chaos lane (release checks): like the JDBC demo (test_fresh_install), it costs two
fresh Spark drivers' first batches and a restart, over a minute of both cores, and default
CI has the JDBC demo and the sink's own crash tests.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from typing import Any

import pytest

pytestmark = pytest.mark.integration

DEMO_TIMEOUT = 480
"""Seconds for the whole demo process: 2 to 2.5 min on an idle 2-core machine (two Spark
drivers starting, a SIGKILL and a restart), with room for a loaded CI runner."""
INTERRUPTED_TIMEOUT = 60
"""How long an interrupted demo may take to stop its pipelines before it is killed."""


def run_demo(command: list[str]) -> tuple[int, str, str]:
    """Run the demo; past ``DEMO_TIMEOUT`` interrupt it (Ctrl-C) so that it stops its
    pipeline drivers, which run in sessions of their own and would outlive a SIGKILL."""
    demo = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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


@pytest.mark.chaos
@pytest.mark.timeout(DEMO_TIMEOUT + INTERRUPTED_TIMEOUT + 30)
def test_demo_with_the_kafka_sink_counts_exactly_once_across_a_crash(real_kafka: Any) -> None:
    command = [
        sys.executable,
        "-m",
        "eospack.cli",
        "demo",
        "--sink",
        "kafka",
        "--bootstrap-servers",
        real_kafka.endpoint.bootstrap_servers,
        "--events",
        "3000",
        "--crashes",
        "1",
        "--produce-seconds",
        "5",
    ]
    returncode, output, stderr = run_demo(command)
    explain = f"{output[-4000:]}\n{stderr[-4000:]}"
    assert returncode == 0, explain
    assert "sink 2pc-kafka exactly-once" in output, explain
    assert "SIGKILL count_1 (crash 1/1)" in output, explain
    assert "VERIFIED: both counters equal what was produced, exactly once" in output, explain
    table = {line.split("  ")[0].strip(): line.split()[-2:] for line in output.splitlines()}
    assert table["counted"] == ["3000", "3000"], explain
    assert table["lost"] == ["0", "0"], explain
    assert table["duplicated"] == ["0", "0"], explain
    assert table["history regressions"] == ["0", "0"], explain
    assert table["leftover prepared/staged"] == ["0", "0"], explain
    assert table["crashes"] == ["1", "0"], explain
