"""Two streaming queries over one replayable-kafka DataFrame, started at the same moment in
a fresh driver, many times: none may fail (the issue-14 proof for Spark's envVars race,
docs/spark-python-datasource-envvars-race.md). Chaos only: each start is a new JVM."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import pytest

from eospack.lab.services.kafka_tools import Record, create_topic, produce_sealed

STARTS = int(os.environ.get("EOSPACK_CONCURRENT_STARTS", "50"))


@pytest.mark.chaos
@pytest.mark.timeout(STARTS * 120 + 60)
def test_concurrent_query_starts_in_fresh_drivers_never_fail(kafka: Any) -> None:
    bootstrap = kafka.endpoint.bootstrap_servers
    topic = f"concurrent_starts_{int(time.time())}"
    create_topic(bootstrap, topic, 2)
    records = (Record(index % 2, f"key-{index % 10}".encode(), b"x") for index in range(500))
    produce_sealed(bootstrap, topic, records)
    failures = []
    for start in range(STARTS):
        finished = subprocess.run(
            [
                sys.executable,
                "-m",
                "integration_tests.drivers.concurrent_starts_driver",
                "--bootstrap-servers",
                bootstrap,
                "--topic",
                topic,
            ],
            capture_output=True,
            text=True,
            timeout=180,
        )
        output = finished.stdout + finished.stderr
        ok = finished.returncode == 0 and "both queries processed rows" in output
        print(f"start {start + 1}/{STARTS}: {'ok' if ok else 'FAILED'}", flush=True)
        if not ok or "Illegal size" in output:
            failures.append(f"start {start + 1}: exit {finished.returncode}\n{output[-3000:]}")
    assert failures == []
