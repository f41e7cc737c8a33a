"""The consumer's private parts the source relies on, behind small functions: kafka-python
has no public call for the metadata a consumer already holds, for the leader it last knew
of a partition, for the raw bytes of a fetched partition, or for decoding a fetch another
way. ``tests/test_kafka_private_api_canary.py`` fails when an installed kafka-python lacks
one of the names used here."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the source's planner imports this module and must not pay for kafka-python
    from kafka import KafkaConsumer, TopicPartition


def cluster_metadata(consumer: KafkaConsumer) -> Any:
    """The consumer's ``ClusterMetadata`` (topics, partitions, topic ids, leaders) as its
    last metadata answer left it."""
    return consumer._client.cluster


def known_leader(consumer: KafkaConsumer, partition: TopicPartition) -> int | None:
    """The node the consumer last knew to lead ``partition`` (None or negative: none)."""
    leader: int | None = consumer._client.cluster.leader_for_partition(partition)
    return leader


def decode_fetches_with(consumer: KafkaConsumer, partition_records: Callable[..., Any]) -> None:
    """Make the consumer's fetcher build ``partition_records(...)`` instead of its own
    ``Fetcher.PartitionRecords`` for each fetched partition (same arguments, same contract:
    ``take``, ``next_fetch_offset``, ``leader_epoch``)."""
    consumer._fetcher.PartitionRecords = partition_records


def fetched_bytes(records: Any) -> bytes | None:
    """The raw record data of one fetched partition (a ``MemoryRecords``), None when the
    fetch carried none."""
    raw: bytes | None = records._buffer
    return raw
