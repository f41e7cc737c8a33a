"""Checkpoints on object storage: the tests' S3 endpoint (moto) as Spark's ``s3a://``.

Spark writes the checkpoint through Hadoop's S3A; eospack reads it (query id, offset and
commit logs, state) through the same Hadoop file system of the session's JVM
(``eospack.core.checkpoint_files``). Proven here:

- a replayable-kafka -> running_count -> 2pc-jdbc query and a replayable-kafka -> 2pc-kafka
  query, each with its checkpoint on s3a://, SIGKILLed after a batch's decision and
  restarted from that checkpoint, hold each row once with nothing left behind (the sink
  finds its decisions under the id derived from the query id Spark keeps on S3);
- ``eospack checkpoint inspect`` reads such a checkpoint and the sink it names;
- ``eospack savepoint create`` of an s3a:// checkpoint into an s3a:// savepoint and
  ``restore`` (no-claim and claim) into new s3a:// checkpoints: the restored query goes on
  with each count once, the no-claim savepoint unchanged, the claimed one moved.

The chaos lane kills each query at every crash point.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import psycopg
import pytest

from eospack.cli import main as eospack
from eospack.core.checkpoint_files import CheckpointFilesError
from eospack.core.fault_points import ALL_FAULT_POINTS
from eospack.lab.services.kafka_tools import Record, create_topic, produce_sealed, read_all
from eospack.lab.testing import await_query
from eospack.stateful_ops import running_count
from eospack.stateful_ops.initial_state import bootstrap_needed
from eospack.tools.checkpoint import inspect_checkpoint
from eospack.tools.savepoint import RestoredCheckpoint
from integration_tests.crash_harness import run_driver
from integration_tests.drivers import object_store_driver
from integration_tests.jdbc_fixtures import pg_ledger, pg_leftovers
from integration_tests.s3.object_store_parts import (
    configure_session,
    credential_environment,
    object_keys,
    s3a_settings,
)

pytestmark = pytest.mark.integration

DRIVER = Path(object_store_driver.__file__)
QUERY_SECONDS = 240
KEYS = 20
KEY_GROUPS = object_store_driver.KEY_GROUPS


@pytest.fixture
def s3a(spark: Any, s3: Any, hadoop_aws_jars: tuple[list[Path], str | None]) -> Any:
    """The shared session with ``s3a://`` pointed at the tests' S3 endpoint."""
    if hadoop_aws_jars[1] is not None:
        pytest.skip(f"needs S3A (hadoop-aws): {hadoop_aws_jars[1]}")
    configure_session(spark, s3.endpoint)
    return s3.endpoint


def produce_events(bootstrap: str, topic: str, count: int, rng: random.Random) -> Counter[str]:
    """``count`` events with keys ``key-00`` .. and unique values, over two partitions."""
    keys = [f"key-{rng.randrange(KEYS):02d}" for _ in range(count)]
    base = len(read_all(bootstrap, topic))
    produce_sealed(
        bootstrap,
        topic,
        [
            Record(index % 2, key.encode(), str(base + index).encode())
            for index, key in enumerate(keys)
        ],
    )
    return Counter(keys)


def count_rows(url: str, table: str) -> list[tuple[str, int, int]]:
    with psycopg.connect(url) as connection:
        rows = connection.execute(f'SELECT key, "count", version FROM "{table}"').fetchall()
    return [(key, int(count), int(version)) for key, count, version in rows]


def assert_counts_exactly_once(rows: list[tuple[str, int, int]], produced: Counter[str]) -> None:
    """running_count's facts, each batch applied once: per key the versions 1..n each once
    (a doubled batch doubles a version, a lost one leaves a gap), counts rising with the
    version, and the last count the number of events of the key."""
    by_key: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for key, count, version in rows:
        by_key[key].append((version, count))
    assert set(by_key) == set(produced)
    for key, facts in by_key.items():
        facts.sort()
        versions = [version for version, _ in facts]
        counts = [count for _, count in facts]
        assert versions == list(range(1, len(facts) + 1)), (key, facts)
        assert counts == sorted(set(counts)), (key, facts)
        assert counts[-1] == produced[key], (key, facts)


def driver_arguments(
    pipeline: str, checkpoint: str, kafka: Any, source: str, s3a: Any, jars: list[Path]
) -> list[str]:
    return [
        "--pipeline",
        pipeline,
        "--checkpoint",
        checkpoint,
        "--bootstrap-servers",
        kafka.endpoint.bootstrap_servers,
        "--source-topic",
        source,
        "--s3-endpoint",
        s3a.endpoint_url,
        "--s3-region",
        s3a.region,
        *(argument for jar in jars for argument in ("--jar", str(jar))),
    ]


def crash_then_restart(
    spark: Any,
    s3a: Any,
    jars: list[Path],
    arguments: list[str],
    fault_point: str,
) -> None:
    """Run the driver until ``fault_point`` SIGKILLs it, then finish its query from the
    same s3a:// checkpoint in the shared session."""
    run = run_driver(
        DRIVER,
        arguments,
        timeout=QUERY_SECONDS,
        fault_point=fault_point,
        environment=credential_environment(s3a),
    )
    assert run.was_killed, run.explain()
    assert s3a.secret_access_key not in run.output
    parsed = object_store_driver.parse_arguments(arguments)
    await_query(object_store_driver.start_query(spark, parsed), QUERY_SECONDS)


def check_counts_query(
    spark: Any, kafka: Any, postgres: Any, s3a: Any, jars: list[Path], name: str, fault: str
) -> None:
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    bootstrap, url = kafka.endpoint.bootstrap_servers, postgres.endpoint.url
    create_topic(bootstrap, name, 2)
    produced = produce_events(bootstrap, name, 300, random.Random(seed))
    checkpoint = f"s3a://{s3a.bucket}/{name}/checkpoint"
    arguments = driver_arguments("counts", checkpoint, kafka, name, s3a, jars)
    arguments += ["--max-offsets", "100"]  # three batches
    arguments += ["--jdbc-url", postgres.endpoint.jdbc_url, "--jdbc-user"]
    arguments += [postgres.endpoint.user, "--table", name]
    crash_then_restart(spark, s3a, jars, arguments, fault)

    assert_counts_exactly_once(count_rows(url, name), produced)
    assert {status for *_, status in pg_ledger(url, name)} == {"done"}
    assert pg_leftovers(url, name) == (0, 0)
    jdbc = {"url": postgres.endpoint.jdbc_url, "user": postgres.endpoint.user, "dbtable": name}
    report = inspect_checkpoint(checkpoint, jdbc_options=jdbc, spark=spark)
    assert report.batches and all(batch.committed for batch in report.batches)
    (sink,) = report.sinks
    assert {row["status"] for row in sink.batches} == {"done"}
    assert sink.leftovers == [] and sink.prepared_pieces == []
    assert {row[0] for row in pg_ledger(url, name)} == {sink.sink_id}


def check_events_query(
    spark: Any, kafka: Any, s3a: Any, jars: list[Path], name: str, fault: str
) -> None:
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    bootstrap = kafka.endpoint.bootstrap_servers
    source, output = f"{name}_in", f"{name}_out"
    create_topic(bootstrap, source, 2)
    create_topic(bootstrap, output, 2)
    produce_events(bootstrap, source, 300, random.Random(seed))
    sent = Counter(
        (key, value) for _, _, key, value in read_all(bootstrap, source) if value is not None
    )
    checkpoint = f"s3a://{s3a.bucket}/{name}/checkpoint"
    arguments = driver_arguments("events", checkpoint, kafka, source, s3a, jars)
    arguments += ["--max-offsets", "100"]  # three batches
    arguments += ["--topic", output]
    crash_then_restart(spark, s3a, jars, arguments, fault)

    received = Counter(
        (key, value)
        for _, _, key, value in read_all(bootstrap, output, isolation_level="read_committed")
    )
    assert received == sent
    assert set(received.values()) == {1}
    kafka_options = {
        "kafka.bootstrap.servers": bootstrap,
        "topic": output,
        "ledgerTopic": f"{output}_ledger",
    }
    report = inspect_checkpoint(checkpoint, kafka_options=kafka_options, spark=spark)
    assert report.batches and all(batch.committed for batch in report.batches)
    (sink,) = report.sinks
    assert {row["status"] for row in sink.batches} == {"done"}
    assert sink.open_transactions == [] and sink.leftovers == [] and sink.prepared_pieces == []


@pytest.mark.chaos
@pytest.mark.timeout(600)
def test_a_counts_query_with_its_checkpoint_on_s3a_survives_a_driver_sigkill_exactly_once(
    spark: Any,
    kafka: Any,
    postgres: Any,
    s3a: Any,
    hadoop_aws_jars: tuple[list[Path], str | None],
    unique_name: str,
) -> None:
    check_counts_query(
        spark, kafka, postgres, s3a, hadoop_aws_jars[0], unique_name, "after_decision@1"
    )


@pytest.mark.timeout(600)
def test_a_kafka_query_with_its_checkpoint_on_s3a_survives_a_driver_sigkill_exactly_once(
    spark: Any,
    real_kafka: Any,
    s3a: Any,
    hadoop_aws_jars: tuple[list[Path], str | None],
    unique_name: str,
) -> None:
    check_events_query(
        spark, real_kafka, s3a, hadoop_aws_jars[0], unique_name, "between_piece_commits@1"
    )


@pytest.mark.chaos
@pytest.mark.timeout(900)
@pytest.mark.parametrize("point", ALL_FAULT_POINTS)
def test_chaos_counts_query_on_s3a_killed_at_every_crash_point(
    spark: Any,
    kafka: Any,
    postgres: Any,
    s3a: Any,
    hadoop_aws_jars: tuple[list[Path], str | None],
    unique_name: str,
    point: str,
) -> None:
    check_counts_query(spark, kafka, postgres, s3a, hadoop_aws_jars[0], unique_name, f"{point}@1")


@pytest.mark.chaos
@pytest.mark.timeout(900)
@pytest.mark.parametrize("point", ALL_FAULT_POINTS)
def test_chaos_kafka_query_on_s3a_killed_at_every_crash_point(
    spark: Any,
    real_kafka: Any,
    s3a: Any,
    hadoop_aws_jars: tuple[list[Path], str | None],
    unique_name: str,
    point: str,
) -> None:
    check_events_query(spark, real_kafka, s3a, hadoop_aws_jars[0], unique_name, f"{point}@1")


def run_counts(
    spark: Any, kafka: Any, postgres: Any, topic: str, checkpoint: str, table: str
) -> None:
    """running_count -> 2pc-jdbc (append) to the end of ``topic``, taking starting offsets
    and initial state from a restored savepoint when ``checkpoint`` holds one."""
    restored = RestoredCheckpoint(checkpoint)
    events = (
        spark.readStream.format("replayable-kafka")
        .option("kafka.bootstrap.servers", kafka.endpoint.bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", restored.starting_offsets("earliest"))
        .load()
        .selectExpr("CAST(key AS STRING) AS key")
    )
    counts = running_count(
        events,
        "key",
        key_groups=KEY_GROUPS,
        output_mode="append",
        initial_state=restored.initial_state(),
    )
    query = (
        counts.writeStream.format("2pc-jdbc")
        .option("url", postgres.endpoint.jdbc_url)
        .option("user", postgres.endpoint.user)
        .option("dbtable", table)
        .option("createTableIfNotExists", "true")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    await_query(query, QUERY_SECONDS)


@pytest.mark.timeout(600)
def test_a_savepoint_on_s3a_round_trips_into_new_s3a_checkpoints_exactly_once(
    spark: Any,
    kafka: Any,
    postgres: Any,
    s3a: Any,
    unique_name: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    rng = random.Random(seed)
    bootstrap, url = kafka.endpoint.bootstrap_servers, postgres.endpoint.url
    create_topic(bootstrap, unique_name, 2)
    root = f"s3a://{s3a.bucket}/{unique_name}"
    first, savepoint = f"{root}/first", f"{root}/savepoint"
    claimed_savepoint = f"{root}/savepoint-to-claim"

    produced = produce_events(bootstrap, unique_name, 200, rng)
    run_counts(spark, kafka, postgres, unique_name, first, unique_name)
    capsys.readouterr()
    assert eospack(["checkpoint", "inspect", first, "--json"]) == 0
    inspected = json.loads(capsys.readouterr().out)
    assert inspected["path"] == first
    assert inspected["batches"] and all(batch["committed"] for batch in inspected["batches"])
    (operator,) = inspected["operators"]
    assert operator["operator_id"] == "0" and operator["partitions"] == 2
    assert operator["last_version"] == len(inspected["batches"]) and operator["bytes"] > 0

    assert eospack(["savepoint", "create", first, savepoint]) == 0
    assert eospack(["savepoint", "create", first, claimed_savepoint]) == 0
    saved = object_keys(s3a, f"{unique_name}/savepoint/")
    assert f"{unique_name}/savepoint/manifest.json" in saved
    assert eospack(["savepoint", "restore", savepoint, f"{root}/no-claim"]) == 0
    claim = ["savepoint", "restore", claimed_savepoint, f"{root}/claimed", "--mode", "claim"]
    assert eospack(claim) == 0
    assert object_keys(s3a, f"{unique_name}/savepoint-to-claim/") == {}
    assert f"{unique_name}/claimed/eospack-savepoint/manifest.json" in object_keys(
        s3a, f"{unique_name}/claimed/"
    )
    restored = RestoredCheckpoint(f"{root}/claimed")
    assert restored.manifest is not None
    assert restored.manifest.operators[0].rows == len(produced)

    produced += produce_events(bootstrap, unique_name, 150, rng)
    run_counts(spark, kafka, postgres, unique_name, f"{root}/no-claim", unique_name)

    assert_counts_exactly_once(count_rows(url, unique_name), produced)
    assert {status for *_, status in pg_ledger(url, unique_name)} == {"done"}
    assert pg_leftovers(url, unique_name) == (0, 0)
    initial_state = RestoredCheckpoint(f"{root}/no-claim").initial_state()
    assert initial_state is not None
    assert not bootstrap_needed(spark, initial_state, KEY_GROUPS)  # read through S3A
    assert object_keys(s3a, f"{unique_name}/savepoint/") == saved
    leftovers = [key for key in object_keys(s3a, f"{unique_name}/") if ".partial" in key]
    assert leftovers == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("location", "jar"),
    [
        ("gs://eospack-tests/checkpoint", "gcs-connector"),
        ("abfss://c@a.dfs.core.windows.net/x", "hadoop-azure"),
    ],
)
def test_a_file_system_missing_from_the_classpath_is_one_line_naming_its_jar(
    spark: Any, location: str, jar: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(CheckpointFilesError) as caught:
        inspect_checkpoint(location, spark=spark)
    message = str(caught.value)
    assert location in message and jar in message and "\n" not in message
    assert eospack(["checkpoint", "inspect", location]) == 1
    assert eospack(["savepoint", "restore", location, f"{location}-restored"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in lines if " with Spark" not in line]  # what inspect starts
    assert len(errors) == 2 and all(jar in line for line in errors), lines


@pytest.mark.chaos
@pytest.mark.timeout(300)
def test_the_cli_reads_an_s3a_checkpoint_with_conf_settings_and_credentials_from_the_environment(
    spark: Any,
    kafka: Any,
    postgres: Any,
    s3a: Any,
    hadoop_aws_jars: tuple[list[Path], str | None],
    unique_name: str,
    tmp_path: Path,
) -> None:
    """``eospack checkpoint inspect`` and ``savepoint create`` as a user runs them: their
    own Spark session, S3A from ``--conf`` settings, the keys only in the environment (and
    in no line they print); the savepoint written to a local directory."""
    bootstrap = kafka.endpoint.bootstrap_servers
    create_topic(bootstrap, unique_name, 2)
    produced = produce_events(bootstrap, unique_name, 50, random.Random(7))
    checkpoint = f"s3a://{s3a.bucket}/{unique_name}/checkpoint"
    run_counts(spark, kafka, postgres, unique_name, checkpoint, unique_name)
    conf = {
        "spark.driver.extraClassPath": ":".join(str(jar) for jar in hadoop_aws_jars[0]),
        **{
            f"spark.hadoop.{key}": value
            for key, value in s3a_settings(s3a.endpoint_url, s3a.region).items()
        },
    }
    arguments = [argument for item in conf.items() for argument in ("--conf", "=".join(item))]
    savepoint = tmp_path / "savepoint"
    both = (
        "import sys; from eospack.cli import main; checkpoint, savepoint, *conf = sys.argv[1:];"
        " sys.exit(main(['checkpoint', 'inspect', checkpoint, '--json', *conf])"
        " or main(['savepoint', 'create', checkpoint, savepoint, *conf]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", both, checkpoint, str(savepoint), *arguments],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, **credential_environment(s3a)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert s3a.secret_access_key not in result.stdout + result.stderr
    assert f'"path": "{checkpoint}"' in result.stdout
    manifest = json.loads((savepoint / "manifest.json").read_text())
    assert manifest["checkpoint"] == checkpoint
    assert [operator["rows"] for operator in manifest["operators"]] == [len(produced)]
