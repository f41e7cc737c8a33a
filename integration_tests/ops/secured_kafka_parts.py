"""What the secured-broker tests share (``test_kafka_secured.py``,
``test_kafka_oauth_mtls.py``): topics inside the application user's grant, producing and
reading as the admin user, open transactions, and the one line of an error Spark wraps."""

from __future__ import annotations

import uuid
from typing import Any

from eospack.lab.services.kafka_cluster import ADMIN_USER, APP_TOPIC_PREFIX
from eospack.lab.services.kafka_tools import Record, produce_sealed, read_all

WRONG_PASSWORD = "not-the-password-" + uuid.uuid4().hex[:6]


def app_topic(unique_name: str, suffix: str) -> str:
    return f"{APP_TOPIC_PREFIX}{unique_name}-{suffix}"


def create_app_topic(secured_kafka: Any, topic: str, partitions: int = 2) -> None:
    from kafka.admin import NewTopic

    admin = secured_kafka.admin_client(ADMIN_USER)
    try:
        admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    finally:
        admin.close()


def produce(secured_kafka: Any, topic: str, records: list[Record]) -> None:
    produce_sealed(
        secured_kafka.endpoint.bootstrap_servers,
        topic,
        records,
        **secured_kafka.client_config(ADMIN_USER),
    )


def committed_values(secured_kafka: Any, topic: str) -> list[bytes]:
    rows = read_all(
        secured_kafka.endpoint.bootstrap_servers,
        topic,
        isolation_level="read_committed",
        client=secured_kafka.client_config(ADMIN_USER),
    )
    return sorted(value or b"" for _, _, _, value in rows)


def open_transactions(secured_kafka: Any) -> list[str]:
    admin = secured_kafka.admin_client(ADMIN_USER)
    try:
        listed = admin.list_transactions(state_filters=["Ongoing"])
    finally:
        admin.close()
    return sorted(entry.transactional_id for entries in listed.values() for entry in entries)


def error_line(error: BaseException, name: str) -> str:
    """The one line of ``error``'s text that carries ``name`` (Spark wraps it in more)."""
    lines = [line for line in str(error).splitlines() if f"{name}: " in line]
    assert lines, f"no {name} in: {str(error)[-2000:]}"
    return lines[-1]


def assert_names_authentication(line: str, secured_kafka: Any) -> None:
    servers = secured_kafka.endpoint.bootstrap_servers
    assert f"Kafka at {servers} (option kafka.bootstrap.servers) refused authentication" in line
    assert "SASL SCRAM-SHA-512 as user 'app' over SASL_SSL failed" in line
    assert "did not answer" not in line and "check the servers are up" not in line
    for password in (WRONG_PASSWORD, *secured_kafka.passwords.values()):
        assert password not in line
