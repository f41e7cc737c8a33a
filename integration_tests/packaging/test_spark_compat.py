"""eospack on every supported Spark line: what ``make test-compat`` adds to the core cases.

The lane (``.ci/compat``) runs the ``compat`` cases in one venv per Spark line and Python,
each holding the pinned pyspark installed first (as a platform's own), then eospack's wheel
with its test extras; it sets ``EOSPACK_COMPAT_PYSPARK`` to the pinned version. Here: that
pyspark is still the one installed, the installed wheel (from a working directory outside
the project) runs Kafka -> 2pc-jdbc and Kafka -> 2pc-kafka with each row once, and what the
line lacks is refused at query start in one line naming the Spark version.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pyspark
import pytest
from pyspark.errors import StreamingQueryException

from eospack.core.spark_features import ADMISSION_CONTROL
from eospack.lab.services.kafka_tools import Record, create_topic, produce_sealed
from eospack.lab.testing import await_query
from integration_tests.jdbc_fixtures import pg_leftovers
from integration_tests.kafka_sink_parts import committed_keys
from integration_tests.kafka_source_parts import read_stream, servers_of

pytestmark = [pytest.mark.integration, pytest.mark.compat]

PINNED = os.environ.get("EOSPACK_COMPAT_PYSPARK")
RESULT_PREFIX = "RESULT "
DRIVER_TIMEOUT = 420

# A user's job on the installed eospack: Kafka into 2pc-jdbc, then into 2pc-kafka.
DRIVER = """
import json, sys
import eospack, pyspark
from eospack.tools.spark import local_session
from eospack.lab.testing import await_query

servers, jdbc_url, user, password, topic, table, output, work = sys.argv[1:]
spark = local_session("eospack-compat")


def kafka_input():
    return (
        spark.readStream.format("replayable-kafka")
        .option("kafka.bootstrap.servers", servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
    )


jdbc = {"url": jdbc_url, "user": user, "dbtable": table}
if password:
    jdbc["password"] = password
query = (
    kafka_input()
    .selectExpr("CAST(CAST(key AS STRING) AS BIGINT) AS id", "CAST(value AS STRING) AS name")
    .writeStream.format("2pc-jdbc")
    .options(**jdbc)
    .option("checkpointLocation", work + "/jdbc-checkpoint")
    .trigger(availableNow=True)
    .start()
)
await_query(query, 240)
query = (
    kafka_input()
    .select("key", "value")
    .writeStream.format("2pc-kafka")
    .option("kafka.bootstrap.servers", servers)
    .option("topic", output)
    .option("ledgerTopic", output + "_ledger")
    .option("checkpointLocation", work + "/kafka-checkpoint")
    .trigger(availableNow=True)
    .start()
)
await_query(query, 240)
spark.stop()
print("RESULT " + json.dumps({"eospack": eospack.__file__, "pyspark": pyspark.__version__}))
"""


def test_the_pinned_pyspark_is_the_one_installed_beside_eospack() -> None:
    if PINNED is None:
        pytest.skip("EOSPACK_COMPAT_PYSPARK is set by make test-compat")
    assert pyspark.__version__ == PINNED
    assert importlib.metadata.version("pyspark") == PINNED


@pytest.mark.timeout(600)
def test_the_installed_wheel_keeps_the_pyspark_and_runs_kafka_into_2pc_jdbc_and_2pc_kafka(
    real_kafka, postgres, unique_name, tmp_path
) -> None:
    if PINNED is None:
        pytest.skip(
            "needs eospack installed as a wheel beside the pinned pyspark (make test-compat)"
        )
    servers = servers_of(real_kafka)
    create_topic(servers, unique_name, partitions=2)
    records = [Record(i % 2, str(i).encode(), f"v{i}".encode()) for i in range(40)]
    produce_sealed(servers, unique_name, records)
    endpoint = postgres.endpoint
    table, output = f"compat_{unique_name}", f"{unique_name}_out"
    with psycopg.connect(endpoint.url) as connection:
        connection.execute(f'CREATE TABLE "{table}" (id BIGINT PRIMARY KEY, name TEXT)')
    environment = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PYTHONPATH", "SPARK_HOME", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")
    }
    arguments = [servers, endpoint.jdbc_url, endpoint.user, endpoint.password or ""]
    arguments += [unique_name, table, output, str(tmp_path)]
    completed = subprocess.run(
        [sys.executable, "-c", DRIVER, *arguments],
        cwd=tmp_path,  # outside the project: eospack comes from the installed wheel
        env=environment,
        capture_output=True,
        text=True,
        timeout=DRIVER_TIMEOUT,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    (line,) = [x for x in completed.stdout.splitlines() if x.startswith(RESULT_PREFIX)]
    result = json.loads(line.removeprefix(RESULT_PREFIX))
    assert result["pyspark"] == PINNED
    assert Path(result["eospack"]).is_relative_to(Path(sys.prefix)), result["eospack"]
    assert importlib.metadata.version("pyspark") == PINNED
    with psycopg.connect(endpoint.url) as connection:
        rows = connection.execute(f'SELECT id, name FROM "{table}" ORDER BY id').fetchall()
    assert rows == [(i, f"v{i}") for i in range(40)]
    assert pg_leftovers(endpoint.url, table) == (0, 0)
    assert committed_keys(real_kafka, output) == sorted(str(i).encode() for i in range(40))


@pytest.mark.timeout(200)
@pytest.mark.parametrize("option", ["maxOffsetsPerTrigger", "minOffsetsPerTrigger"])
def test_a_read_limit_is_refused_at_query_start_in_one_line_where_spark_lacks_admission_control(
    spark, kafka, unique_name, tmp_path, option
) -> None:
    if ADMISSION_CONTROL.available:
        pytest.skip("this Spark has admission control (test_kafka_source.py tests the limits)")
    servers = servers_of(kafka)
    create_topic(servers, unique_name, partitions=1)
    query = (
        read_stream(spark, servers, subscribe=unique_name, **{option: "10"})
        .load()
        .writeStream.format("memory")
        .queryName(f"refused_{unique_name}")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    with pytest.raises(StreamingQueryException) as raised:
        await_query(query, 120)
    line = (
        f"{option} needs Spark 4.2+ (admission control for Python sources); this is Spark"
        f" {pyspark.__version__}"
    )
    assert f"SparkFeatureError: {line}\n" in str(raised.value)
