"""``eospack.supervise`` around a real query: parquet files -> 2pc-jdbc in the test's Spark
session (the crash driver's query, ``drivers/jdbc_sink_driver.py``).

A transient failure (the decision's write lost its connection) is restarted and the rows
land once; an error no restart can fix (a bad option) stops at once, with one line.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from eospack.tools.supervisor import FixedDelay, PermanentQueryError, supervise
from integration_tests.drivers import jdbc_sink_driver
from integration_tests.jdbc_pipeline import Pipeline

pytestmark = pytest.mark.integration


def start_function(spark: Any, pipeline: Pipeline, *extra: str) -> Any:
    arguments = jdbc_sink_driver.parse_arguments([*pipeline.arguments, *extra])
    return lambda: jdbc_sink_driver.start_query(spark, arguments)


@pytest.mark.timeout(300)
def test_a_transient_failure_is_restarted_and_every_row_lands_once(
    spark: Any,
    postgres: Any,
    tmp_path: Path,
    unique_name: str,
    call_faults: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    pipeline = Pipeline(postgres, tmp_path, unique_name, call_faults)
    pipeline.arm("jdbc.decide", "before", batch_id=1)
    with caplog.at_level(logging.WARNING, logger="eospack.supervisor"):
        restarts = supervise(
            start_function(spark, pipeline, "--protocol", "prepared"), FixedDelay(3, 0.5)
        )
    assert restarts == 1
    assert pipeline.fired() == ["jdbc.decide before"]
    (record,) = [r for r in caplog.records if r.name == "eospack.supervisor"]
    assert record.getMessage().startswith("restart 1 in 0.5 s (fixed-delay: 3 attempts")
    assert "injected fault: jdbc.decide before in batch 1" in record.getMessage()
    pipeline.assert_exactly_once()


@pytest.mark.timeout(300)
def test_a_bad_option_stops_at_once_without_a_restart(
    spark: Any, postgres: Any, tmp_path: Path, unique_name: str, call_faults: Path
) -> None:
    pipeline = Pipeline(postgres, tmp_path, unique_name, call_faults)
    starts: list[int] = []
    start = start_function(spark, pipeline, "--protocol", "prepared", "--write-mode", "bogus")

    def counted_start() -> Any:
        starts.append(1)
        return start()

    with pytest.raises(PermanentQueryError) as caught:
        supervise(counted_start, FixedDelay(3, 0.5))
    assert len(starts) == 1
    message = str(caught.value)
    assert "JdbcSinkOptionError" in message and "writeMode" in message and "\n" not in message
