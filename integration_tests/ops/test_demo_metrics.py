"""``eospack demo --metrics``: the demo serves its pipelines' metrics and, at the end, says
what a scrape of its endpoint shows; the figures are checked against what the demo did.

Run as a user runs it (``python -m eospack.cli demo``, its own process), small: 3,000 events,
one SIGKILL of count_1, on the session's broker and PostgreSQL (one JVM and one server less
on a 2-core machine). The pipelines are separate driver processes, killed and restarted:
what the endpoint shows at the end survived that (docs/metrics.md).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from integration_tests.demo_parts import DEMO_TIMEOUT, INTERRUPTED_TIMEOUT, run_demo

pytestmark = pytest.mark.integration


@pytest.mark.timeout(DEMO_TIMEOUT + INTERRUPTED_TIMEOUT + 30)
def test_the_demos_scrape_shows_no_lag_commits_of_each_sink_and_nothing_waiting(
    kafka: Any, postgres: Any, tmp_path: Path
) -> None:
    plot = tmp_path / "demo.png"
    command = [sys.executable, "-m", "eospack.cli", "demo", "--metrics", "0"]
    command += ["--plot", str(plot)]
    command += ["--bootstrap-servers", kafka.endpoint.bootstrap_servers]
    command += ["--jdbc-url", postgres.endpoint.jdbc_url, "--jdbc-user", postgres.endpoint.user]
    command += ["--events", "3000", "--crashes", "1", "--produce-seconds", "5"]
    environment = {**os.environ, "EOSPACK_DEMO_JDBC_PASSWORD": postgres.endpoint.password or ""}
    returncode, output, stderr = run_demo(command, environment)
    explain = f"{output[-4000:]}\n{stderr[-4000:]}"
    assert returncode == 0, explain
    assert "VERIFIED: both counters equal what was produced, exactly once" in output, explain
    assert re.search(r"metrics served at http://127\.0\.0\.1:\d+/metrics", output), explain

    lag = re.findall(
        r"metrics: source lag of demo_\w+_(count_\d): (\d+) records at most over (\d+)", output
    )
    assert sorted(lag) == [("count_1", "0", "4"), ("count_2", "0", "4")], explain
    sinks = re.findall(
        r"metrics: sink \w+: (\d+) batches committed, commit latency histogram of (\d+)"
        r" commits \(mean [\d.]+ ms\), pieces waiting (\d+|-),",
        output,
    )
    assert len(sinks) == 4, explain  # two pipelines, each a current and a history table
    for batches, commits, waiting in sinks:
        assert int(batches) > 0 and int(commits) == int(batches), explain
        assert waiting == "0", explain
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", explain  # counts, lag, latency
    assert re.search(r"plotted the source lag of 2 pipelines and \d+ commit latency", output)
