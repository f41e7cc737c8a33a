"""A fake Kafka cluster with only KafkaMetadata's real methods, recording every broker call,
and a stream reader planned against it."""

from __future__ import annotations

from dataclasses import dataclass, field
from unittest import mock

from eospack.connectors.kafka.source.broker_metadata import ClusterView, KafkaMetadata
from eospack.connectors.kafka.source.data_source import ReplayableKafkaStreamReader
from eospack.connectors.kafka.source.options import KafkaSourceOptions, Subscription, parse_options
from eospack.connectors.kafka.source.planning import OffsetPlanner

TopicPartitionKey = tuple[str, int]


def options(**extra: str) -> KafkaSourceOptions:
    raw = {"kafka.bootstrap.servers": "broker:9092", "subscribe": "t", **extra}
    return parse_options(raw)


@dataclass
class FakeCluster:
    """Topics as a broker holds them: id and, per partition, [earliest, latest).

    ``hidden`` partitions are left out of metadata answers (a partition missing for a
    moment); ``unlisted`` topics are left out of the next ``unlisted_answers`` answers.
    """

    topics: dict[str, tuple[str | None, dict[int, tuple[int, int]]]]
    hidden: set[TopicPartitionKey] = field(default_factory=set)
    unlisted: set[str] = field(default_factory=set)
    unlisted_answers: int = 0
    calls: list[str] = field(default_factory=list)

    def cluster_view(self, subscription: Subscription) -> ClusterView:
        self.calls.append("metadata")
        listed = set(self.topics)
        if self.unlisted_answers > 0:
            self.unlisted_answers -= 1
            listed -= self.unlisted
        wanted = sorted(t for t in subscription.topics if t in listed)
        partitions = tuple(
            (t, p) for t in wanted for p in sorted(self.topics[t][1]) if (t, p) not in self.hidden
        )
        ids = {t: self.topics[t][0] for t in wanted}
        return ClusterView(partitions, frozenset(listed), ids)

    def earliest(self, tps: list[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
        self.calls.append(f"earliest {sorted(tps)}")
        return {(t, p): self.topics[t][1][p][0] for t, p in tps}

    def latest(self, tps: list[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
        self.calls.append("latest")
        return {(t, p): self.topics[t][1][p][1] for t, p in tps}

    def check_assignment(self, subscription: Subscription, view: ClusterView | None) -> None:
        return None

    def metadata(self) -> KafkaMetadata:
        fake = mock.create_autospec(KafkaMetadata, instance=True, spec_set=True)
        for name in ("cluster_view", "earliest", "latest", "check_assignment"):
            getattr(fake, name).side_effect = getattr(self, name)
        return fake


def stream_reader(cluster: FakeCluster, **extra: str) -> ReplayableKafkaStreamReader:
    """A stream reader planning against ``cluster`` (subscribe=t unless ``extra`` says)."""
    source_options = options(**extra)
    reader = ReplayableKafkaStreamReader(source_options)
    reader._planner = OffsetPlanner(source_options, cluster.metadata())
    return reader
