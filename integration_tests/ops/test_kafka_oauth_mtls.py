"""Both Kafka connectors through the secured broker's OAUTHBEARER and mTLS listeners
(issue 37): exactly-once from replayable-kafka to 2pc-kafka as user ``app`` (the same
least-privilege grant as test_kafka_secured.py), and one-line errors that name the option
when a token provider or a client certificate is wrong, on the driver and on executors.

The token providers are ``integration_tests/ops/oauth_token_parts.py``, importable on the driver
and in every Python worker, as a user's installed provider module would be.
Tokens are unsigned JWTs (``unsecured_jwt``) whose header always encodes to
``JWT_HEADER``: that text must appear in no error, plan or driver log.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest

from eospack.lab.services.kafka_cluster import unsecured_jwt
from eospack.lab.services.kafka_tools import Record
from eospack.lab.testing import await_query
from integration_tests.ops.secured_kafka_parts import (
    WRONG_PASSWORD,
    app_topic,
    committed_values,
    create_app_topic,
    error_line,
    open_transactions,
    produce,
)

pytestmark = pytest.mark.production_kafka

JWT_HEADER = unsecured_jwt("app").split(".")[0]


@pytest.fixture
def providers() -> str:
    """The module of token providers (``integration_tests/ops/oauth_token_parts.py``)."""
    return "integration_tests.ops.oauth_token_parts"


def assert_no_token(*texts: str) -> None:
    for text in texts:
        assert JWT_HEADER not in text


def run_exactly_once(
    spark: Any, options: dict[str, str], source: str, target: str, checkpoint: Path
) -> Any:
    query = (
        spark.readStream.format("replayable-kafka")
        .options(**options)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .load()
        .select("key", "value")
        .writeStream.format("2pc-kafka")
        .options(**options)
        .option("topic", target)
        .option("ledgerTopic", f"{target}-ledger")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    await_query(query, 180)
    return query


def records(count: int) -> list[Record]:
    return [Record(i % 2, f"k{i}".encode(), f"v{i}".encode()) for i in range(count)]


@pytest.mark.timeout(300)
def test_oauthbearer_reads_and_writes_exactly_once_and_no_token_shows(
    spark: Any,
    secured_kafka: Any,
    providers: str,
    unique_name: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    source, target = app_topic(unique_name, "in"), app_topic(unique_name, "out")
    create_app_topic(secured_kafka, source)
    written = records(30)
    produce(secured_kafka, source, written)
    options = secured_kafka.oauth_options(f"{providers}:app_token")
    with caplog.at_level(logging.DEBUG):
        query = run_exactly_once(spark, options, source, target, tmp_path / "checkpoint")
    assert committed_values(secured_kafka, target) == sorted(r.value or b"" for r in written)
    assert [t for t in open_transactions(secured_kafka) if unique_name in t] == []
    frame = spark.read.format("replayable-kafka").options(**options).option("subscribe", target)
    plan = frame.load()._jdf.queryExecution().toString()
    streaming_plan = query._jsq.explainInternal(True)
    assert "replayable-kafka" in plan.lower() or "PythonDataSource" in plan, plan
    assert_no_token(plan, streaming_plan, str(query.lastProgress), caplog.text)


@pytest.mark.timeout(180)
def test_a_provider_that_raises_fails_the_query_at_its_start_naming_the_option(
    spark: Any, secured_kafka: Any, providers: str, unique_name: str
) -> None:
    options = secured_kafka.oauth_options(f"{providers}:failing")
    with pytest.raises(Exception) as raised:
        spark.read.format("replayable-kafka").options(**options).option(
            "subscribe", app_topic(unique_name, "in")
        ).load()
    line = error_line(raised.value, "KafkaAuthenticationError")
    assert line.endswith(
        f"KafkaAuthenticationError: The token provider {providers}:failing (option"
        " kafka.sasl.oauth.token.provider) gave no token (RuntimeError: the identity"
        " provider is down): fix the provider; it runs on the driver and on every executor"
    ), line


@pytest.mark.timeout(180)
def test_a_provider_that_fails_only_on_executors_fails_the_task_in_one_line(
    spark: Any, secured_kafka: Any, providers: str, unique_name: str
) -> None:
    """The driver got its token; each executor asks the provider again when a task's
    options reach it, before any client connects, and fails the task in one line."""
    source = app_topic(unique_name, "in")
    create_app_topic(secured_kafka, source)
    produce(secured_kafka, source, records(4))
    options = secured_kafka.oauth_options(f"{providers}:failing_on_executors")
    frame = spark.read.format("replayable-kafka").options(**options).option("subscribe", source)
    started = time.monotonic()
    with pytest.raises(Exception) as raised:
        frame.load().collect()
    print(f"failed after {time.monotonic() - started:.1f} s")
    line = error_line(raised.value, "KafkaAuthenticationError")
    assert line.endswith(
        f"KafkaAuthenticationError: The token provider {providers}:failing_on_executors"
        " (option kafka.sasl.oauth.token.provider) gave no token (RuntimeError: no"
        " credentials on this executor): fix the provider; it runs on the driver and on"
        " every executor"
    ), line
    assert_no_token(str(raised.value))


@pytest.mark.timeout(180)
def test_a_token_the_listener_rejects_is_one_line_naming_the_provider_not_the_token(
    spark: Any, secured_kafka: Any, providers: str, unique_name: str
) -> None:
    """``sub: nobody`` has no grant, but the unsecured validator accepts any subject: a
    token for the SCRAM listener's mechanism list is what it refuses, so the OAUTHBEARER
    token goes to the SCRAM listener (PLAIN/SCRAM only) and fails there."""
    options = {
        **secured_kafka.oauth_options(f"{providers}:app_token"),
        "kafka.bootstrap.servers": secured_kafka.endpoint.bootstrap_servers,
        "kafka.request.timeout.ms": "3000",
    }
    with pytest.raises(Exception) as raised:
        spark.read.format("replayable-kafka").options(**options).option(
            "subscribe", app_topic(unique_name, "in")
        ).load().collect()
    line = error_line(raised.value, "KafkaAuthenticationError")
    assert (
        f"refused authentication: SASL OAUTHBEARER with the token of {providers}:app_token"
        " (option kafka.sasl.oauth.token.provider) over SASL_SSL failed (the listener does"
        " not enable OAUTHBEARER (it enables SCRAM-SHA-512))"
    ) in line, line
    assert_no_token(str(raised.value))


@pytest.mark.timeout(300)
def test_mtls_reads_and_writes_exactly_once(
    spark: Any, secured_kafka: Any, unique_name: str, tmp_path: Path
) -> None:
    source, target = app_topic(unique_name, "in"), app_topic(unique_name, "out")
    create_app_topic(secured_kafka, source)
    written = records(30)
    produce(secured_kafka, source, written)
    run_exactly_once(spark, secured_kafka.mtls_options(), source, target, tmp_path / "checkpoint")
    assert committed_values(secured_kafka, target) == sorted(r.value or b"" for r in written)
    assert [t for t in open_transactions(secured_kafka) if unique_name in t] == []


@pytest.mark.timeout(240)
def test_a_client_certificate_the_listener_does_not_trust_is_one_line_saying_tls_failed(
    spark: Any, secured_kafka: Any, unique_name: str, tmp_path: Path
) -> None:
    options = {
        **secured_kafka.mtls_options(secured_kafka.certificates.stranger_keystore),
        "kafka.request.timeout.ms": "3000",
    }
    servers = secured_kafka.mtls_bootstrap_servers
    expected = (
        f"Kafka at {servers} (option kafka.bootstrap.servers) refused the TLS handshake over SSL ("
    )
    with pytest.raises(Exception) as raised:
        spark.read.format("replayable-kafka").options(**options).option(
            "subscribe", app_topic(unique_name, "in")
        ).load().collect()
    line = error_line(raised.value, "KafkaAuthenticationError")
    assert f"KafkaAuthenticationError: replayable-kafka: {expected}" in line, line
    assert "check the client certificate (kafka.ssl.keystore.location" in line
    assert "did not answer" not in line
    query = (
        spark.readStream.format("rate")
        .load()
        .selectExpr("CAST(value AS STRING) AS value")
        .writeStream.format("2pc-kafka")
        .options(**options)
        .option("topic", app_topic(unique_name, "out"))
        .option("ledgerTopic", app_topic(unique_name, "ledger"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    with pytest.raises(Exception) as raised_by_sink:
        await_query(query, 150)
    line = error_line(raised_by_sink.value, "KafkaAuthenticationError")
    assert f"KafkaAuthenticationError: 2pc-kafka: {expected}" in line, line


def test_the_sink_checks_the_login_before_kafka_python_retries_it_for_30_seconds(
    secured_kafka: Any, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wrong password made the sink wait for kafka-python's bootstrap timeout (30 s: it
    retries a refused login like a lost connection) before the probe named it: the probe
    now runs first, so no admin client is built for a refused login."""
    from eospack.connectors.kafka.errors import KafkaAuthenticationError
    from eospack.connectors.kafka.sink import cluster_identity
    from eospack.connectors.kafka.sink.options import parse_options

    def no_admin_client(config: Any) -> Any:
        raise AssertionError("an admin client bootstrapped before the login was checked")

    monkeypatch.setattr(cluster_identity, "admin_client", no_admin_client)
    options = parse_options(
        {
            **secured_kafka.client_options("app", password=WRONG_PASSWORD),
            "topic": app_topic(unique_name, "out"),
        }
    )
    started = time.monotonic()
    with pytest.raises(KafkaAuthenticationError) as raised:
        cluster_identity.cluster_facts(options)
    print(f"refused after {time.monotonic() - started:.2f} s")
    assert "SASL SCRAM-SHA-512 as user 'app' over SASL_SSL failed" in str(raised.value)
    assert WRONG_PASSWORD not in str(raised.value)


@pytest.mark.timeout(240)
def test_a_login_refused_only_on_executors_fails_the_sink_task_naming_authentication(
    spark: Any, secured_kafka: Any, providers: str, unique_name: str, tmp_path: Path
) -> None:
    """The driver's token works; the task's producer is refused. kafka-python retries the
    refused login until its bootstrap timeout (30 s) and then says only "Unable to
    bootstrap"; the task then asks the probe, which names the refusal."""
    options = secured_kafka.oauth_options(f"{providers}:refused_on_executors")
    query = (
        spark.readStream.format("rate")
        .load()
        .selectExpr("CAST(value AS STRING) AS value")
        .writeStream.format("2pc-kafka")
        .options(**options)
        .option("topic", app_topic(unique_name, "out"))
        .option("ledgerTopic", app_topic(unique_name, "ledger"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    started = time.monotonic()
    with pytest.raises(Exception) as raised:
        await_query(query, 200)
    print(f"failed after {time.monotonic() - started:.1f} s")
    line = error_line(raised.value, "KafkaAuthenticationError")
    assert (
        f"KafkaAuthenticationError: 2pc-kafka: Kafka at {secured_kafka.oauth_bootstrap_servers}"
        " (option kafka.bootstrap.servers) refused authentication: SASL OAUTHBEARER with the"
        f" token of {providers}:refused_on_executors (option kafka.sasl.oauth.token.provider)"
        " over SASL_SSL failed ("
    ) in line, line


@pytest.mark.timeout(180)
def test_a_login_refused_only_on_executors_fails_the_source_task_naming_authentication(
    spark: Any, secured_kafka: Any, providers: str, unique_name: str
) -> None:
    """As for the sink: the task's consumer gives up after kafkaConsumer.pollTimeoutMs,
    which read as "no broker answered" before the probe named the refusal."""
    source = app_topic(unique_name, "in")
    create_app_topic(secured_kafka, source)
    produce(secured_kafka, source, records(4))
    options = {
        **secured_kafka.oauth_options(f"{providers}:refused_on_executors"),
        "kafkaConsumer.pollTimeoutMs": "10000",
    }
    frame = spark.read.format("replayable-kafka").options(**options).option("subscribe", source)
    with pytest.raises(Exception) as raised:
        frame.load().collect()
    line = error_line(raised.value, "KafkaAuthenticationError")
    assert (
        f"KafkaAuthenticationError: replayable-kafka: Kafka at"
        f" {secured_kafka.oauth_bootstrap_servers} (option kafka.bootstrap.servers) refused"
        " authentication: SASL OAUTHBEARER with the token of"
        f" {providers}:refused_on_executors (option kafka.sasl.oauth.token.provider) over"
        " SASL_SSL failed ("
    ) in line, line
