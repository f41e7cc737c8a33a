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

import sys
from typing import Any

import pytest

from integration_tests.demo_parts import DEMO_TIMEOUT, INTERRUPTED_TIMEOUT, run_demo

pytestmark = pytest.mark.integration


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
