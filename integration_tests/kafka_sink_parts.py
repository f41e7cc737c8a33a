"""What the component-level 2pc-kafka tests share (the sink's own parts against Apache Kafka,
without a Spark query): options on a ledger topic of the test's own, and the keys a
read_committed consumer sees."""

from __future__ import annotations

from typing import Any

from eospack.connectors.kafka.sink.options import KafkaSinkOptions, parse_options
from eospack.lab.services.kafka_tools import read_all


def sink_options(kafka: Any, topic: str, **extra: str) -> KafkaSinkOptions:
    """2pc-kafka options writing to ``topic``, with ``<topic>_ledger`` as the ledger topic
    (a crashed test's open ledger transaction then holds back no other test)."""
    return parse_options(
        {
            "kafka.bootstrap.servers": kafka.endpoint.bootstrap_servers,
            "topic": topic,
            "ledgerTopic": f"{topic}_ledger",
            **extra,
        }
    )


def committed_keys(kafka: Any, topic: str) -> list[bytes]:
    """The keys of ``topic`` as a read_committed consumer sees them, sorted (b"" for none)."""
    return sorted(
        key or b""
        for _, _, key, _ in read_all(
            kafka.endpoint.bootstrap_servers, topic, isolation_level="read_committed"
        )
    )


def known_transactional_ids(bootstrap_servers: str, prefix: str) -> set[str]:
    """Every transactional id under ``prefix`` the brokers keep, in any state
    (ListTransactions): what the sink's ids cost the cluster."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers)
    try:
        listed = admin.list_transactions()
    finally:
        admin.close()
    return {
        listing.transactional_id
        for listings in listed.values()
        for listing in listings
        if listing.transactional_id.startswith(prefix)
    }
