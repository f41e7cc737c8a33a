"""Both Kafka connectors against a SASL_SSL Apache Kafka (SCRAM-SHA-512, TLS with hostname
checks, StandardAuthorizer) as the application user ``app``, granted only what
docs/connectors/*.md document (READ/WRITE/DESCRIBE/CREATE on topics ``app.*``,
DESCRIBE/WRITE on TransactionalId ``eospack-*``; no DESCRIBE_CONFIGS anywhere), on a broker
whose ``transaction.max.timeout.ms`` (300000) is below 2pc-kafka's default.

The two smoke tests without the ``production_kafka`` marker run in ``make test`` (the
broker starts in ~20 s); the rest in ``make test-kafka-production``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient

from eospack.lab.services.kafka_cluster import ADMIN_USER, SECURED_TRANSACTION_MAX_TIMEOUT_MS
from eospack.lab.services.kafka_tools import Record, read_all
from eospack.lab.testing import await_query, wait_until
from integration_tests.kafka_source_parts import BatchRecorder, run_available_now
from integration_tests.ops.secured_kafka_parts import (
    WRONG_PASSWORD,
    app_topic,
    assert_names_authentication,
    committed_values,
    create_app_topic,
    error_line,
    open_transactions,
    produce,
)


@pytest.mark.timeout(180)
def test_a_wrong_password_fails_the_source_at_query_start_saying_authentication_failed(
    spark: Any, secured_kafka: Any, unique_name: str
) -> None:
    options = {
        **secured_kafka.client_options("app", password=WRONG_PASSWORD),
        "kafka.request.timeout.ms": "3000",
        "subscribe": app_topic(unique_name, "in"),
    }
    with pytest.raises(Exception) as raised:
        spark.read.format("replayable-kafka").options(**options).load().collect()
    line = error_line(raised.value, "KafkaAuthenticationError")
    assert "KafkaAuthenticationError: replayable-kafka: Kafka at" in line, line
    assert_names_authentication(line, secured_kafka)
    assert WRONG_PASSWORD not in str(raised.value)


@pytest.mark.timeout(240)
def test_the_least_privilege_grant_reads_and_writes_exactly_once(
    spark: Any, secured_kafka: Any, unique_name: str, tmp_path: Path
) -> None:
    """replayable-kafka reads and 2pc-kafka writes (ledgerTopic inside the grant) with the
    default transaction timeout, which the broker refuses and the cluster's settings may
    not be read: before the fit, every task failed with InvalidTransactionTimeoutError."""
    source, target = app_topic(unique_name, "in"), app_topic(unique_name, "out")
    create_app_topic(secured_kafka, source)
    records = [Record(i % 2, f"k{i}".encode(), f"v{i}".encode()) for i in range(20)]
    produce(secured_kafka, source, records)
    app = secured_kafka.client_options("app")
    query = (
        spark.readStream.format("replayable-kafka")
        .options(**app)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .load()
        .select("key", "value")
        .writeStream.format("2pc-kafka")
        .options(**app)
        .option("topic", target)
        .option("ledgerTopic", app_topic(unique_name, "ledger"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    await_query(query, 180)
    assert committed_values(secured_kafka, target) == sorted(r.value or b"" for r in records)
    assert [t for t in open_transactions(secured_kafka) if unique_name in t] == []


@pytest.mark.production_kafka
@pytest.mark.timeout(180)
def test_a_wrong_password_fails_the_sink_at_query_start_saying_authentication_failed(
    spark: Any, secured_kafka: Any, unique_name: str, tmp_path: Path
) -> None:
    query = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", "1")
        .load()
        .selectExpr("CAST(value AS STRING) AS value")
        .writeStream.format("2pc-kafka")
        .options(**secured_kafka.client_options("app", password=WRONG_PASSWORD))
        .option("topic", app_topic(unique_name, "out"))
        .option("ledgerTopic", app_topic(unique_name, "ledger"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    with pytest.raises(Exception) as raised:
        await_query(query, 150)
    line = error_line(raised.value, "KafkaAuthenticationError")
    assert "KafkaAuthenticationError: 2pc-kafka: Kafka at" in line, line
    assert_names_authentication(line, secured_kafka)
    assert WRONG_PASSWORD not in str(raised.value)


@pytest.mark.production_kafka
@pytest.mark.timeout(180)
def test_a_ledger_topic_outside_the_grant_fails_at_query_start_before_any_transaction(
    spark: Any, secured_kafka: Any, unique_name: str, tmp_path: Path
) -> None:
    """The default ledger topic (eospack-2pc-kafka-ledger) is outside ``app.*``: the query
    fails at its start in one line naming the ACL and the option, and no task began a
    transaction (before: tasks ran, the ledger's creation failed at the first commit, and
    their transactions stayed Ongoing on the output topic for the transaction timeout)."""
    target = app_topic(unique_name, "out")
    create_app_topic(secured_kafka, target, partitions=1)
    query = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", "5")
        .load()
        .selectExpr("CAST(value AS STRING) AS value")
        .writeStream.format("2pc-kafka")
        .options(**secured_kafka.client_options("app"))
        .option("topic", target)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    with pytest.raises(Exception) as raised:
        await_query(query, 150)
    line = error_line(raised.value, "LedgerError")
    assert line.endswith(
        "LedgerError: 2pc-kafka may not create its ledger topic eospack-2pc-kafka-ledger"
        " (TopicAuthorizationFailedError): grant User:app CREATE, READ, WRITE and DESCRIBE"
        " on topic eospack-2pc-kafka-ledger, or set the option ledgerTopic to a topic inside"
        " the user's grant (see docs/connectors/2pc-kafka.md, Security / ACLs)"
    ), line
    assert open_transactions(secured_kafka) == []
    rows = read_all(
        secured_kafka.endpoint.bootstrap_servers,
        target,
        client=secured_kafka.client_config(ADMIN_USER),
    )
    assert rows == []


@pytest.mark.production_kafka
def test_the_transaction_timeout_is_fitted_to_the_broker_when_its_settings_may_not_be_read(
    secured_kafka: Any, unique_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    from eospack.connectors.kafka.sink.data_source import cluster_facts, with_broker_timeout
    from eospack.connectors.kafka.sink.options import parse_options

    options = parse_options(
        {**secured_kafka.client_options("app"), "topic": app_topic(unique_name, "out")}
    )
    with caplog.at_level(logging.WARNING):
        facts = cluster_facts(options, fit_timeout=True)
    assert facts.transaction_max_timeout_ms == SECURED_TRANSACTION_MAX_TIMEOUT_MS
    fitted = with_broker_timeout(options, facts.transaction_max_timeout_ms)
    assert fitted.transaction_timeout_ms == SECURED_TRANSACTION_MAX_TIMEOUT_MS
    assert "DescribeConfigs refused: ClusterAuthorizationFailedError" in caplog.text
    assert f"a broker accepts a transaction timeout of {SECURED_TRANSACTION_MAX_TIMEOUT_MS} ms" in (
        caplog.text
    )


@pytest.mark.production_kafka
def test_the_ledger_topic_guard_says_when_it_cannot_check_a_topic(
    secured_kafka: Any, unique_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: the denied DescribeConfigs read as "no ledger settings", silently."""
    from eospack.connectors.kafka.sink.ledger import is_ledger_topic
    from eospack.connectors.kafka.sink.options import parse_options

    topic = app_topic(unique_name, "out")
    create_app_topic(secured_kafka, topic, partitions=1)
    options = parse_options({**secured_kafka.client_options("app"), "topic": topic})
    with caplog.at_level(logging.WARNING):
        assert not is_ledger_topic(options, topic)
    assert (
        f"2pc-kafka cannot check whether topic {topic} is another sink's ledger topic: its"
        " DescribeConfigs was refused (TopicAuthorizationFailedError)"
    ) in caplog.text
    assert is_ledger_topic(options, "eospack-2pc-kafka-ledger")


@pytest.mark.production_kafka
def test_the_broker_verifies_as_127_0_0_1_and_refuses_other_users_topics(
    secured_kafka: Any, unique_name: str
) -> None:
    """The services' own promise: TLS with hostname checks passes for 127.0.0.1, and the
    application user's grant stops at its prefix."""
    from kafka import errors as kafka_errors
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(
        bootstrap_servers=secured_kafka.endpoint.bootstrap_servers,
        **secured_kafka.client_config("app"),
    )
    try:
        assert admin._manager.config["ssl_check_hostname"] is True
        with pytest.raises(kafka_errors.TopicAuthorizationFailedError):
            admin.create_topics([NewTopic(f"other.{unique_name}", 1, 1)])
        admin.create_topics([NewTopic(app_topic(unique_name, "x"), 1, 1)])
    finally:
        admin.close()


@pytest.mark.production_kafka
def test_services_up_prints_where_the_users_settings_are_and_never_a_password(
    secured_kafka: Any, unique_name: str
) -> None:
    """``eospack services up --kafka-security sasl_ssl`` prints these lines; each user's
    settings are a properties file (mode 600) that inspect's --kafka-command-config reads."""
    from eospack.cli import kafka_command_config
    from eospack.lab.services.kafka_cluster import settings_lines

    lines = settings_lines(secured_kafka)
    for password in secured_kafka.passwords.values():
        assert all(password not in line for line in lines)
    app_file = Path(lines[1].split()[3])
    assert app_file.name == "client-app.properties"
    assert app_file.stat().st_mode & 0o777 == 0o600
    options = {
        "kafka.bootstrap.servers": secured_kafka.endpoint.bootstrap_servers,
        **kafka_command_config(str(app_file)),
    }
    assert options == secured_kafka.client_options("app")


@pytest.mark.production_kafka
@pytest.mark.timeout(180)
def test_the_secured_broker_restarts_after_a_kill_with_its_users_grants_and_data(
    secured_kafka: Any, unique_name: str
) -> None:
    topic = app_topic(unique_name, "kept")
    create_app_topic(secured_kafka, topic, partitions=1)
    produce(secured_kafka, topic, [Record(0, b"k", b"before the kill")])
    port = secured_kafka.node(1).port
    secured_kafka.kill(1)
    assert not secured_kafka.node(1).alive
    secured_kafka.start(1)
    assert secured_kafka.node(1).alive and secured_kafka.node(1).port == port
    rows = read_all(
        secured_kafka.endpoint.bootstrap_servers,
        topic,
        client=secured_kafka.client_config("app"),
    )
    assert [value for _, _, _, value in rows] == [b"before the kill"]


@pytest.mark.production_kafka
@pytest.mark.timeout(240)
def test_commit_offsets_to_group_uses_the_sources_security_and_a_missing_group_acl_never_fails(
    spark: Any, secured_kafka: Any, unique_name: str, tmp_path: Path
) -> None:
    """commitOffsetsToGroup over SASL_SSL: the admin user's group gets the end offsets; the
    application user, granted nothing on groups, reads every row once all the same."""
    topic = app_topic(unique_name, "in")
    create_app_topic(secured_kafka, topic)
    records = [Record(i % 2, f"k{i}".encode(), f"v{i}".encode()) for i in range(20)]
    produce(secured_kafka, topic, records)
    for user in ("app", ADMIN_USER):
        group = f"{unique_name}-{user}-lag"
        recorder = BatchRecorder()
        run_available_now(
            spark.readStream.format("replayable-kafka")
            .options(**secured_kafka.client_options(user))
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("commitOffsetsToGroup", group),
            tmp_path / f"checkpoint-{user}",
            recorder,
            timeout=180,
        )
        assert sorted(row[3] for row in recorder.all_rows()) == sorted(
            r.value or b"" for r in records
        )
        wanted = {} if user == "app" else {0: 10, 1: 10}
        wait_until(
            lambda g=group, w=wanted: group_offsets(secured_kafka, g) == w, 30, "group offsets"
        )


def group_offsets(secured_kafka: Any, group: str) -> dict[int, int]:
    """The group's committed offsets as the admin sees them; none while the broker still
    creates its offsets topic or loads it (retriable errors: the caller asks again) or the
    group does not exist."""
    from kafka.errors import RetriableError

    admin = secured_kafka.admin_client(ADMIN_USER)
    try:
        listed = admin.list_group_offsets({group: None}).get(group, {})
    except RetriableError:
        return {}
    finally:
        admin.close()
    return {tp.partition: om.offset for tp, om in listed.items()}
