"""eospack.metrics against real queries, scraped over HTTP: values, not just names.

replayable-kafka into 2pc-jdbc (SQLite): at the quiet point after 40 records the lag is 0,
the sink's committed-batch counter and latency histograms count exactly the batches in
Spark's commit log, and the rows and records counters equal the rows written; then the
query, restarted and held back by minOffsetsPerTrigger, shows 15 new records per partition
as the lag of each partition (the broker's end offset minus the consumed one), and Kafka's
own ``kafka-consumer-groups --describe`` shows the same lag for the query's
``commitOffsetsToGroup`` group. A sessionize query shows its keys, the keys its timeouts
expired and the late row Spark dropped.
"""

from __future__ import annotations

import os
import sqlite3
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import eospack
import eospack.metrics
from eospack.core.metrics import METRICS_DIR_VARIABLE
from eospack.lab.services.kafka_tools import (
    consumer_group_lag_by_kafka_tool,
    create_topic,
    produce_sealed,
)
from eospack.lab.testing import wait_until
from eospack.stateful_ops import sessionize
from integration_tests.kafka_source_parts import make_records, read_stream, servers_of
from integration_tests.metrics_parts import (
    into_sqlite,
    scrape,
    timed_events,
    value,
    write_events,
)

pytestmark = pytest.mark.integration


def sink_rows(database: Path, table: str) -> int:
    try:
        with sqlite3.connect(database) as connection:
            return int(connection.execute(f'SELECT COUNT(*) FROM "{table}"').fetchone()[0])
    except sqlite3.OperationalError:
        return 0


@pytest.mark.timeout(300)
def test_scraped_lag_and_sink_counters_equal_what_the_queries_did(
    spark: Any, kafka: Any, unique_name: str, tmp_path: Path
) -> None:
    servers, topic, database = servers_of(kafka), unique_name, tmp_path / "sink.db"
    group = f"{unique_name}-lag"
    create_topic(servers, topic, partitions=2)
    produce_sealed(servers, topic, make_records(2, 20))
    checkpoint = tmp_path / "checkpoint"
    endpoint = eospack.metrics.serve(spark, port=0, directory=str(tmp_path / "metrics"))

    def start(**limits: str) -> Any:
        stream = (
            read_stream(
                spark,
                servers,
                subscribe=topic,
                startingOffsets="earliest",
                commitOffsetsToGroup=group,
            )
            .option("queryName", unique_name)
            .options(**limits)
            .load()
        )
        return (
            into_sqlite(stream, database, unique_name, checkpoint)
            .trigger(processingTime="200 milliseconds")
            .start()
        )

    def lag(partition: int) -> float | None:
        return value(
            scrape(endpoint.url),
            "eospack_kafka_source_lag_records",
            query=unique_name,
            topic=topic,
            partition=partition,
        )

    planning = "eospack_kafka_source_planning_seconds_count"
    try:
        query = start(maxOffsetsPerTrigger="10")
        try:
            wait_until(lambda: sink_rows(database, unique_name) == 40, 120, "40 rows")
            wait_until(lambda: lag(0) == 0 and lag(1) == 0, 30, "no lag")
        finally:
            query.stop()
        batches = len([p for p in (checkpoint / "commits").iterdir() if p.name.isdigit()])
        assert batches >= 4
        samples = scrape(endpoint.url)
        sink = {"sink": "2pc-jdbc"}
        sink_ids = {
            dict(labels)["sink_id"]
            for name, labels in samples
            if name == "eospack_sink_batches_committed_total"
        }
        assert len(sink_ids) == 1
        sink["sink_id"] = sink_ids.pop()
        committed = "eospack_sink_batches_committed_total"
        assert value(samples, committed, **sink, mode="exactly_once") == batches
        rows = "eospack_sink_rows_committed_total"
        assert value(samples, rows, **sink, mode="exactly_once") == 40
        assert value(samples, "eospack_sink_commit_seconds_count", **sink) == batches
        assert value(samples, "eospack_sink_decision_seconds_count", **sink) == batches
        assert value(samples, "eospack_sink_pieces_committed_total", **sink) >= batches
        records = "eospack_kafka_source_records_total"
        assert value(samples, records, query=unique_name) == 40
        # Executor side (written shortly after each task): the read tasks' key and value
        # bytes, and one fetch time per task.
        read_bytes = sum(len(r.key) + len(r.value) for r in make_records(2, 20))
        wait_until(
            lambda: (
                value(
                    scrape(endpoint.url), "eospack_kafka_source_read_bytes_total", query=unique_name
                )
                == read_bytes
            ),
            10,
            f"{read_bytes} bytes read",
        )
        samples = scrape(endpoint.url)
        fetches = value(samples, "eospack_kafka_source_fetch_seconds_count", query=unique_name)
        assert fetches is not None and fetches >= batches
        rolled_back = "eospack_sink_recovery_rolled_back_pieces_total"
        assert value(samples, rolled_back, **sink) is None
        assert value(samples, "eospack_sink_fenced_batches_total", **sink) is None
        assert value(samples, "eospack_sink_pieces_waiting", **sink) == 0

        # Held back by minOffsetsPerTrigger (after the first trigger, which always runs):
        # new records wait, and the lag is the broker's end offset minus the consumed one.
        planned_before = value(samples, planning, query=unique_name) or 0
        held = start(minOffsetsPerTrigger="1000", maxTriggerDelay="1h")
        try:
            wait_until(
                lambda: (
                    (value(scrape(endpoint.url), planning, query=unique_name) or 0) > planned_before
                ),
                90,
                "the held query's first trigger",
            )
            produce_sealed(servers, topic, make_records(2, 15, "w"))
            wait_until(lambda: lag(0) == 15 and lag(1) == 15, 60, "a lag of 15 per partition")
            if kafka.endpoint.kind == "kafka":  # Kafka's own lag tool reads the group
                wait_until(
                    lambda: consumer_group_lag_by_kafka_tool(servers, group) == {0: 15, 1: 15},
                    60,
                    "kafka-consumer-groups --describe to show the lag of the metric",
                    2.0,
                )
        finally:
            held.stop()
        assert sink_rows(database, unique_name) == 40
    finally:
        endpoint.close()


@pytest.mark.timeout(120)
def test_the_spark_conf_port_serves_the_metrics_from_register_and_a_bad_one_fails_in_one_line(
    spark: Any,
) -> None:
    """``spark.eospack.metrics.port``: ``eospack.register`` serves the endpoint there (once
    per process: a second call returns the same endpoint), on the address
    ``spark.eospack.metrics.address`` names (another loopback address here: the default one
    refuses); a value that is no port fails in one line naming the conf."""
    from eospack.tools import metrics as tools_metrics

    try:
        spark.conf.set(tools_metrics.PORT_CONF, "metrics")
        with pytest.raises(tools_metrics.MetricsConfError) as caught:
            eospack.register(spark)
        assert str(caught.value) == (
            "spark.eospack.metrics.port='metrics' is not a port: set it to a number from 1 to"
            " 65535 (0: a free one), or unset it"
        )
        spark.conf.set(tools_metrics.PORT_CONF, "0")
        spark.conf.set(tools_metrics.ADDRESS_CONF, "127.0.0.2")
        eospack.register(spark)
        eospack.register(spark)
        (endpoint,) = tools_metrics._SERVED_FROM_CONF.values()
        assert endpoint.url == f"http://127.0.0.2:{endpoint.port}/metrics"
        with urllib.request.urlopen(endpoint.url, timeout=10) as response:
            assert response.status == 200
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(f"http://127.0.0.1:{endpoint.port}/metrics", timeout=10)
        assert os.environ[METRICS_DIR_VARIABLE] == endpoint.directory
    finally:
        spark.conf.unset(tools_metrics.PORT_CONF)
        spark.conf.unset(tools_metrics.ADDRESS_CONF)
        for endpoint in tools_metrics._SERVED_FROM_CONF.values():
            endpoint.close()
        tools_metrics._SERVED_FROM_CONF.clear()
    assert METRICS_DIR_VARIABLE not in os.environ


@pytest.mark.timeout(240)
def test_a_stateful_operators_keys_expiries_and_late_rows_are_scraped(
    spark: Any, unique_name: str, tmp_path: Path
) -> None:
    """sessionize with a 10 s gap in one key group: keys a, b, c, then d 100 s later (the
    watermark passes the first three sessions: one timeout fires and expires 3 keys,
    leaving 1), then a late row (dropped by Spark, counted from its progress)."""
    events = tmp_path / "events"
    events.mkdir()
    endpoint = eospack.metrics.serve(spark, port=0, directory=str(tmp_path / "metrics"))
    try:
        sessions = sessionize(timed_events(spark, events), "k", "ts", "10 seconds", key_groups=1)
        query = (
            sessions.writeStream.format("memory")
            .queryName(unique_name)
            .outputMode("append")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(processingTime="200 milliseconds")
            .start()
        )
        operator = {"query": str(query.id), "operator": "sessionize"}

        def scraped(name: str, **labels: Any) -> float | None:
            return value(scrape(endpoint.url), name, **{**operator, **labels})

        try:
            write_events(events, 0, [("a", 1000), ("b", 1001), ("c", 1002)])
            wait_until(lambda: scraped("eospack_state_keys") == 3, 60, "3 keys in state")
            write_events(events, 1, [("d", 1100)])
            wait_until(
                lambda: scraped("eospack_state_keys_expired_total") == 3, 60, "3 keys expired"
            )
            assert scraped("eospack_state_timeouts_fired_total") == 1
            wait_until(lambda: scraped("eospack_state_keys") == 1, 30, "1 key left")
            state_bytes = scraped("eospack_state_bytes")
            assert state_bytes is not None and state_bytes > 0
            write_events(events, 2, [("e", 1005)])
            late = "eospack_state_late_rows_dropped_total"
            wait_until(
                lambda: value(scrape(endpoint.url), late, query=str(query.id)) == 1,
                60,
                "the late row counted",
            )
            assert scraped("eospack_state_keys") == 1
            assert sorted(
                row["k"] for row in spark.sql(f"SELECT k FROM {unique_name}").collect()
            ) == ["a", "b", "c"]
        finally:
            query.stop()
    finally:
        endpoint.close()
