"""The driver's broker metadata calls for replayable-kafka: partitions, topic ids, offsets.

Every call goes through ``broker_call`` (the call-fault rig) and is bounded by the metadata
timeout; kafka-python is imported only when a call is made.

Broker failures (issue 37): a call whose connection drops (a node SIGKILLed or restarted,
its partitions' leadership moving to another node) is made again with a fresh consumer,
which bootstraps from any address of the list and asks the partitions' new leaders, with a
backoff of 0.1 s doubling to 1 s, until ``kafka.request.timeout.ms`` has passed since the
call began; then, or as soon as a request itself times out, the call fails with
``KafkaBrokerUnreachableError`` naming the last error. A call therefore rides through a
leader change and gives up within twice ``kafka.request.timeout.ms`` (a last attempt may
start just before the deadline and wait its own timeout).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..client.authentication import raise_if_refused
from ..client.broker_calls import broker_call
from ..client.consumers import cluster_metadata
from ..errors import KafkaBrokerUnreachableError, KafkaSourceOptionError
from .offset_format import topic_id_text
from .offset_ranges import PartitionOffsets
from .options import (
    KafkaSourceOptions,
    Subscription,
    TopicPartitionKey,
)

if TYPE_CHECKING:
    from kafka import KafkaConsumer


_FIRST_RETRY_BACKOFF_SECONDS = 0.1
_LAST_RETRY_BACKOFF_SECONDS = 1.0


@dataclass(frozen=True)
class ClusterView:
    """One metadata answer: the topic-partitions the subscription covers, every topic the
    cluster has, and topic ids (None where the broker gives none)."""

    partitions: tuple[TopicPartitionKey, ...]
    topics: frozenset[str]
    topic_ids: Mapping[str, str | None]


@dataclass(frozen=True)
class ClusterSnapshot:
    """A cluster view and the latest offset of each of its partitions, taken together."""

    view: ClusterView
    latest: Mapping[TopicPartitionKey, int]


class KafkaMetadata:
    """The driver's view of the cluster: partitions and earliest/latest/timestamp offsets.

    One kafka-python consumer, created on first use, with bootstrap and requests bounded by
    the metadata timeout (kafka.request.timeout.ms, default 10 s): an unreachable broker is
    a KafkaBrokerUnreachableError naming the servers, never a hang; a broker that refused
    the SASL login is a KafkaAuthenticationError saying so (``authentication``).
    """

    def __init__(self, options: KafkaSourceOptions) -> None:
        self._options = options
        self._consumer: KafkaConsumer | None = None

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def _unreachable(self, error: BaseException) -> KafkaBrokerUnreachableError:
        name, text = type(error).__name__, str(error).strip()
        # kafka-python's errors print as "<class name>: <text>", or just the name
        cause = text if text.startswith(name) else f"{name}: {text}" if text else name
        return KafkaBrokerUnreachableError(
            f"Kafka at {self._options.bootstrap_servers} (option kafka.bootstrap.servers) did not"
            f" answer within {self._options.metadata_timeout_ms} ms ({cause}): check the servers"
            " are up and reachable, or raise kafka.request.timeout.ms"
        )

    def _call(self, action: Callable[[KafkaConsumer], Any]) -> Any:
        """``action`` with the consumer; a dropped connection is retried with a fresh
        consumer until the metadata timeout has passed (module docstring)."""
        # kafka-python is imported here, by the one process that talks to the broker: Spark's
        # planner processes that only build the source never pay its ~0.15 s import.
        from kafka import KafkaConsumer
        from kafka.errors import KafkaConnectionError, KafkaTimeoutError

        deadline = time.monotonic() + self._options.metadata_timeout_ms / 1000
        backoff = _FIRST_RETRY_BACKOFF_SECONDS
        while True:
            try:
                if self._consumer is None:
                    self._consumer = KafkaConsumer(**self._options.metadata_consumer_config())
                return action(self._consumer)
            except KafkaTimeoutError as error:
                self.close()
                raise_if_refused(self._options.metadata_consumer_config(), "replayable-kafka")
                raise self._unreachable(error) from None
            except KafkaConnectionError as error:
                self.close()
                raise_if_refused(self._options.metadata_consumer_config(), "replayable-kafka")
                if time.monotonic() + backoff >= deadline:
                    raise self._unreachable(error) from None
                time.sleep(backoff)  # a backoff between attempts, not a wait for a condition
                backoff = min(2 * backoff, _LAST_RETRY_BACKOFF_SECONDS)

    def cluster_view(self, subscription: Subscription) -> ClusterView:
        """The topic-partitions the subscription covers right now, from one fresh metadata
        answer (``kafka.metadata``), with every topic's id."""

        def discover(consumer: KafkaConsumer) -> ClusterView:
            topics = broker_call("kafka.metadata", consumer.topics)
            cluster = cluster_metadata(consumer)
            if subscription.kind == "subscribe":
                wanted = [t for t in subscription.topics if t in topics]
            elif subscription.kind == "subscribePattern":
                pattern = re.compile(subscription.pattern or "")
                wanted = sorted(t for t in topics if pattern.fullmatch(t))
            else:
                wanted = sorted({t for t, _ in subscription.partitions if t in topics})
            present = sorted(
                (t, p) for t in wanted for p in (cluster.partitions_for_topic(t) or ())
            )
            if subscription.kind == "assign":
                present = [tp for tp in subscription.partitions if tp in set(present)]
            return ClusterView(
                partitions=tuple(present),
                topics=frozenset(topics),
                topic_ids={t: topic_id_text(cluster.topic_id(t)) for t in wanted},
            )

        return self._call(discover)

    def partitions(self, subscription: Subscription) -> list[TopicPartitionKey]:
        """The topic-partitions the subscription covers right now (fresh metadata)."""
        return list(self.cluster_view(subscription).partitions)

    def check_assignment(self, subscription: Subscription, view: ClusterView | None = None) -> None:
        """Fail if ``assign`` names a topic or partition the cluster does not have (in
        ``view`` when given, else in a fresh metadata answer)."""
        if subscription.kind != "assign":
            return
        present = set(view.partitions if view is not None else self.partitions(subscription))
        missing = [tp for tp in subscription.partitions if tp not in present]
        if missing:
            names = ", ".join(f"{t}-{p}" for t, p in missing)
            raise KafkaSourceOptionError(
                f"Option assign names {names}, which do not exist on"
                f" {self._options.bootstrap_servers}: create them or fix assign"
            )

    def earliest(self, tps: Iterable[TopicPartitionKey]) -> PartitionOffsets:
        return self._list_offsets(tps, "beginning_offsets")

    def latest(self, tps: Iterable[TopicPartitionKey]) -> PartitionOffsets:
        return self._list_offsets(tps, "end_offsets")

    def _list_offsets(self, tps: Iterable[TopicPartitionKey], method: str) -> PartitionOffsets:
        from kafka import TopicPartition

        keys = [TopicPartition(t, p) for t, p in tps]
        if not keys:
            return {}
        timeout = self._options.metadata_timeout_ms
        found = self._call(
            lambda c: broker_call(
                f"kafka.{method}", lambda: getattr(c, method)(keys, timeout_ms=timeout)
            )
        )
        return {(tp.topic, tp.partition): int(offset) for tp, offset in found.items()}

    def for_times(
        self, timestamps: Mapping[TopicPartitionKey, int]
    ) -> dict[TopicPartitionKey, int | None]:
        """The first offset at or after each timestamp, None where there is none."""
        from kafka import TopicPartition

        query = {TopicPartition(t, p): ts for (t, p), ts in timestamps.items()}
        if not query:
            return {}
        timeout = self._options.metadata_timeout_ms
        found = self._call(
            lambda c: broker_call(
                "kafka.offsets_for_times", lambda: c.offsets_for_times(query, timeout_ms=timeout)
            )
        )
        return {
            (tp.topic, tp.partition): (None if hit is None else int(hit.offset))
            for tp, hit in found.items()
        }
