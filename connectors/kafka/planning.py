"""Driver side of replayable-kafka: which topic-partitions, which offsets, which ranges.

A batch is a set of half-open :class:`OffsetRange` ``[start, end)``, one per topic-partition
(or several, with minPartitions). The offset Spark logs for a batch describes the batch on
its own (:class:`BatchOffsets`): the end offsets in the format of Spark's own Kafka source,
``{"topic": {"0": 23}}``, plus ``"@starts"``, the start of every range the batch reads, and
``"@topicIds"``, the Kafka topic id of every topic. Every start is fixed when the batch is
planned (``latestOffset``), never looked up again: a replayed batch, batch 0 included (which
Spark replays against a fresh ``initialOffset()``), reads exactly the ranges first planned.
Partitions that appear during a query start at their earliest offset at planning time; an
earliest offset above 0, offsets that went backwards, a topic whose id changed (deleted and
re-created) and a topic that is gone are data loss: with failOnDataLoss=true planning fails
naming the topic-partition and offsets; with false it logs a warning, counts the skipped
offsets and plans from the earliest offset still available. A partition missing from a
metadata answer while its topic is listed is carried forward at its offset; a topic counts as
gone only when two metadata answers in a row do not list it. A replayed batch first checks
that its topics still have the recorded ids: one re-created since is data loss, and the new
topic's records are never read in place of the old one's. Offsets logged by earlier versions
(no "@starts") are still planned as they were then (:func:`plan_ranges`).
"""

from __future__ import annotations

import base64
import logging
import math
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from eospack.connectors.kafka.broker_calls import broker_call
from eospack.connectors.kafka.errors import (
    KafkaBrokerUnreachableError,
    KafkaDataLossError,
    KafkaSourceOptionError,
)
from eospack.connectors.kafka.source_options import (
    EARLIEST,
    LATEST,
    KafkaSourceOptions,
    OffsetBound,
    Subscription,
    TopicPartitionKey,
)

if TYPE_CHECKING:
    from kafka import KafkaConsumer

log = logging.getLogger(__name__)

PartitionOffsets = dict[TopicPartitionKey, int]
OffsetsJson = dict[str, Any]

# Reserved keys of the offset JSON; "@" cannot occur in a Kafka topic name.
STARTS_KEY = "@starts"
TOPIC_IDS_KEY = "@topicIds"

FAIL_ON_DATA_LOSS_HINT = (
    "If this is expected (e.g. a deleted topic or retention), set the option"
    " failOnDataLoss=false to skip the lost offsets and continue"
)
SKIP_HINT = "continuing from the earliest available offset because failOnDataLoss=false"


@dataclass(frozen=True)
class OffsetRange:
    """Offsets ``start <= offset < end`` of one topic-partition, read by position."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)

    def describe(self) -> str:
        return f"{self.topic}-{self.partition} [{self.start}, {self.end})"


def offsets_to_json(offsets: Mapping[TopicPartitionKey, int]) -> OffsetsJson:
    """Spark's Kafka offset JSON, sorted so that equal offsets give equal JSON."""
    result: OffsetsJson = {}
    for (topic, partition), offset in sorted(offsets.items()):
        result.setdefault(topic, {})[str(partition)] = int(offset)
    return result


def offsets_from_json(offsets: Mapping[str, Any]) -> PartitionOffsets:
    """The per-partition offsets of Spark's Kafka offset JSON (reserved "@" keys skipped)."""
    return {
        (topic, int(partition)): int(offset)
        for topic, partitions in offsets.items()
        if not topic.startswith("@")
        for partition, offset in partitions.items()
    }


def topic_id_text(topic_id: uuid.UUID | None) -> str | None:
    """A topic id as Kafka shows it (kafka-topics.sh: URL-safe base64); None if unknown."""
    if topic_id is None or topic_id.int == 0:
        return None
    return base64.urlsafe_b64encode(topic_id.bytes).decode().rstrip("=")


@dataclass(frozen=True)
class BatchOffsets:
    """The offset Spark logs for a batch, self-describing so that a replay needs nothing else.

    ``ends``: every topic-partition the batch covers, at its end offset. ``starts``: where
    each range starts; a partition left out reads nothing (starts at its end). ``None`` for
    offsets logged before this format (ends only): such a batch is planned from Spark's
    start offset as it was then. ``topic_ids``: topic name to Kafka topic id, where known.
    """

    ends: Mapping[TopicPartitionKey, int]
    starts: Mapping[TopicPartitionKey, int] | None = field(default_factory=dict)
    topic_ids: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> OffsetsJson:
        """``{"t": {"0": 23}, "@starts": {"t": {"0": 20}}, "@topicIds": {"t": "..."}}``,
        sorted, with only the starts of non-empty ranges, so equal batches give equal JSON."""
        result: OffsetsJson = offsets_to_json(self.ends)
        starts = self.starts or {}
        result[STARTS_KEY] = offsets_to_json(
            {tp: start for tp, start in starts.items() if start != self.ends.get(tp, start)}
        )
        if self.topic_ids:
            result[TOPIC_IDS_KEY] = dict(sorted(self.topic_ids.items()))
        return result

    @classmethod
    def from_json(cls, offsets: Mapping[str, Any]) -> BatchOffsets:
        starts = offsets.get(STARTS_KEY)
        return cls(
            ends=offsets_from_json(offsets),
            starts=None if starts is None else offsets_from_json(starts),
            topic_ids=dict(offsets.get(TOPIC_IDS_KEY) or {}),
        )

    def ranges(self) -> list[OffsetRange]:
        """Every range of the batch, in topic-partition order (empty ones included)."""
        starts = self.starts or {}
        return [
            OffsetRange(topic, partition, starts.get((topic, partition), end), end)
            for (topic, partition), end in sorted(self.ends.items())
        ]


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


@dataclass(frozen=True)
class BatchPlan:
    """The next batch before admission control: where each range starts (``begins``) and
    how far it may go (``limits``), over the same topic-partitions."""

    begins: PartitionOffsets
    limits: PartitionOffsets
    topic_ids: dict[str, str]


def plan_next_batch(
    previous: BatchOffsets,
    view: ClusterView,
    latest: Mapping[TopicPartitionKey, int],
    earliest_of: Callable[[list[TopicPartitionKey]], PartitionOffsets],
    fail_on_data_loss: bool,
) -> BatchPlan:
    """Fix the start of every range of the batch after ``previous`` (driver side, pure).

    - A partition of ``previous`` continues at its end offset; if its latest offset is now
      below that (truncated, or re-created where ids are unknown), data loss, then it
      starts at its earliest offset.
    - A topic whose id differs from the one ``previous`` recorded was re-created: data
      loss; then every partition of the new topic starts at its earliest offset.
    - A new partition starts at its earliest offset; above 0 is data loss (as Spark).
    - A partition missing from ``view`` while its topic is listed is carried forward at
      its offset (metadata can miss a partition for a moment; Kafka never removes one).
      Partitions of a topic the cluster no longer lists are gone: data loss, dropped.

    ``earliest_of`` is called at most once, only for the partitions that need it.
    """
    ids = {topic: id_ for topic, id_ in view.topic_ids.items() if id_ is not None}
    recreated = {
        topic: (old, ids[topic])
        for topic, old in previous.topic_ids.items()
        if ids.get(topic) not in (None, old)
    }
    before = previous.ends
    current = set(view.partitions)
    new = [tp for tp in view.partitions if tp not in before or tp[0] in recreated]
    backwards = [tp for tp in view.partitions if tp not in new and latest[tp] < before[tp]]
    earliest = earliest_of(sorted(set(new) | set(backwards))) if new or backwards else {}

    for topic, (old, new_id) in sorted(recreated.items()):
        read = ", ".join(
            f"{t}-{p} to offset {o}" for (t, p), o in sorted(before.items()) if t == topic
        )
        report_data_loss(
            fail_on_data_loss,
            f"Topic {topic} was deleted and re-created: its topic id changed from {old} to"
            f" {new_id} (the query had read {read}), so records of the old topic may have"
            " been missed",
        )
    gone = sorted(
        tp
        for tp in before
        if tp not in current and (tp[0] not in view.topics or tp[0] in recreated)
    )
    unannounced = [tp for tp in gone if tp[0] not in recreated]
    if unannounced:
        names = ", ".join(f"{t}-{p} (at offset {before[(t, p)]})" for t, p in unannounced)
        report_data_loss(fail_on_data_loss, f"Topic-partitions {names} are gone")

    begins: PartitionOffsets = {}
    limits: PartitionOffsets = {}
    for tp in view.partitions:
        topic, partition = tp
        end = latest[tp]
        if tp in backwards:
            report_data_loss(
                fail_on_data_loss,
                f"Topic-partition {topic}-{partition} went back from offset {before[tp]} to"
                f" {end} (re-created or truncated), so offsets from {end} to {before[tp]}"
                " may be lost",
            )
            begin = earliest.get(tp, end)
        elif tp in new:
            begin = earliest.get(tp, 0)
            if begin > 0 and topic not in recreated:
                report_data_loss(
                    fail_on_data_loss,
                    f"Added partition {topic}-{partition} starts from {begin} instead of 0."
                    " Some data may have been missed",
                    skipped=begin,
                )
        else:
            begin = before[tp]
        begins[tp] = min(begin, end)
        limits[tp] = end
    for tp in sorted(set(before) - current - set(gone)):
        log.info(
            "Topic-partition %s-%s is missing from the metadata while its topic exists:"
            " carried forward at offset %s",
            *tp,
            before[tp],
        )
        begins[tp] = limits[tp] = before[tp]
    known = {**previous.topic_ids, **ids}
    topic_ids = {topic: known[topic] for topic in {t for t, _ in limits} if topic in known}
    return BatchPlan(begins, limits, topic_ids)


def available_records(
    start: Mapping[TopicPartitionKey, int],
    latest: Mapping[TopicPartitionKey, int],
    earliest_of_new: Mapping[TopicPartitionKey, int],
) -> int:
    """How many offsets lie between ``start`` (or a new partition's earliest) and ``latest``."""
    total = 0
    for tp, end in latest.items():
        begin = start.get(tp, earliest_of_new.get(tp, end))
        total += max(0, end - begin)
    return total


def rate_limit(
    max_rows: int,
    start: Mapping[TopicPartitionKey, int],
    latest: Mapping[TopicPartitionKey, int],
    earliest_of_new: Mapping[TopicPartitionKey, int],
) -> PartitionOffsets:
    """Share ``max_rows`` offsets among partitions in proportion to their backlog.

    As Spark's Kafka source does: a partition with a backlog gets at least one offset, and
    no partition goes beyond its latest offset.
    """
    sizes = {}
    for tp, end in latest.items():
        begin = start.get(tp, earliest_of_new.get(tp))
        if begin is not None and end - begin > 0:
            sizes[tp] = end - begin
    total = sum(sizes.values())
    if total < 1:
        return dict(latest)
    limited: PartitionOffsets = {}
    for tp, end in latest.items():
        if tp not in sizes:
            limited[tp] = end
            continue
        begin = start[tp] if tp in start else earliest_of_new[tp]
        share = max_rows * (sizes[tp] / total)
        whole = math.ceil(share) if share < 1 else math.floor(share)
        limited[tp] = min(end, begin + whole)
    return limited


def split_ranges(ranges: Iterable[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """Drop empty ranges; split the rest so that about ``min_partitions`` Spark tasks read.

    Same rule as Spark's KafkaOffsetRangeCalculator: with fewer non-empty ranges than
    minPartitions, each range is cut into pieces proportional to its share of all offsets.
    """
    non_empty = [r for r in ranges if r.size > 0]
    if not min_partitions or len(non_empty) >= min_partitions:
        return non_empty
    total = sum(r.size for r in non_empty)
    ideal = total / min_partitions
    result: list[OffsetRange] = []
    for r in non_empty:
        parts = max(round(r.size / ideal), 1)
        for i in range(parts):
            begin = r.start + int(r.size * (i / parts))
            end = r.start + int(r.size * ((i + 1) / parts))
            if end > begin:
                result.append(OffsetRange(r.topic, r.partition, begin, end))
    return result


def pack_ranges(
    ranges: Sequence[OffsetRange], min_records: int, min_partitions: int | None
) -> list[tuple[OffsetRange, ...]]:
    """Spark partitions of ``ranges``: ranges smaller than ``min_records`` share one.

    Why: Spark's JVM source reads each range in its own task, which costs it milliseconds;
    a Python data source's task costs Spark's Python runner 50-80 ms whatever it reads, so
    a small batch over many topic-partitions spent most of its read stage starting tasks.
    Ranges are taken in the order given and added to the current partition while it stays
    within ``min_records`` offsets; a range of ``min_records`` or more gets its own. Never
    splits a range, and packs nothing when ``min_partitions`` is set (the user asked for
    tasks; its split ranges each keep one). A replay may be packed otherwise than its first
    attempt (other options after a restart): the sinks commit named pieces, not tasks.
    """
    if min_partitions:
        return [(offset_range,) for offset_range in ranges]
    packed: list[tuple[OffsetRange, ...]] = []
    current: list[OffsetRange] = []
    held = 0
    for offset_range in ranges:
        if offset_range.size >= min_records:
            packed.append((offset_range,))
            continue
        if current and held + offset_range.size > min_records:
            packed.append(tuple(current))
            current, held = [], 0
        current.append(offset_range)
        held += offset_range.size
    if current:
        packed.append(tuple(current))
    return packed


def report_data_loss(fail_on_data_loss: bool, message: str, skipped: int | None = None) -> None:
    """Raise KafkaDataLossError, or log a warning that counts the skipped offsets."""
    if fail_on_data_loss:
        raise KafkaDataLossError(f"{message}. {FAIL_ON_DATA_LOSS_HINT}")
    counted = f"; skipped {skipped} offsets" if skipped is not None else ""
    log.warning("%s%s; %s", message, counted, SKIP_HINT)


def plan_ranges(
    start: Mapping[TopicPartitionKey, int],
    end: Mapping[TopicPartitionKey, int],
    earliest_of: Callable[[list[TopicPartitionKey]], PartitionOffsets],
    fail_on_data_loss: bool,
) -> list[OffsetRange]:
    """The ranges of a batch logged before offsets recorded their starts (driver side).

    New partitions (in ``end`` only) start at their earliest offset now; partitions that
    vanished (in ``start`` only) and partitions whose offsets went backwards (re-created or
    truncated) are data loss. With failOnDataLoss=false a backwards partition is read from
    its earliest offset up to ``end``.
    """
    gone = sorted(set(start) - set(end))
    if gone:
        names = ", ".join(f"{t}-{p} (at offset {start[(t, p)]})" for t, p in gone)
        report_data_loss(fail_on_data_loss, f"Topic-partitions {names} are gone")
    backwards = [tp for tp in end if tp in start and end[tp] < start[tp]]
    new = [tp for tp in end if tp not in start]
    earliest = earliest_of(sorted(set(new) | set(backwards))) if new or backwards else {}
    ranges = []
    for tp in sorted(end):
        topic, partition = tp
        if tp in start and tp not in backwards:
            begin = start[tp]
        elif tp in backwards:
            report_data_loss(
                fail_on_data_loss,
                f"Topic-partition {topic}-{partition} went back from offset {start[tp]} to"
                f" {end[tp]} (re-created or truncated), so offsets from {end[tp]} to"
                f" {start[tp]} may be lost",
            )
            begin = min(earliest.get(tp, end[tp]), end[tp])
        else:
            begin = earliest.get(tp, 0)
            if begin > 0:
                log.info("New topic-partition %s-%s starts at offset %s", topic, partition, begin)
        ranges.append(OffsetRange(topic, partition, begin, end[tp]))
    return ranges


class KafkaMetadata:
    """The driver's view of the cluster: partitions and earliest/latest/timestamp offsets.

    One kafka-python consumer, created on first use, with bootstrap and requests bounded by
    the metadata timeout (kafka.request.timeout.ms, default 10 s): an unreachable broker is
    a KafkaBrokerUnreachableError naming the servers, never a hang.
    """

    def __init__(self, options: KafkaSourceOptions) -> None:
        self._options = options
        self._consumer: KafkaConsumer | None = None

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def _unreachable(self, error: BaseException) -> KafkaBrokerUnreachableError:
        return KafkaBrokerUnreachableError(
            f"Kafka at {self._options.bootstrap_servers} (option kafka.bootstrap.servers) did not"
            f" answer within {self._options.metadata_timeout_ms} ms"
            f" ({type(error).__name__}): check the servers are up and reachable, or raise"
            " kafka.request.timeout.ms"
        )

    def _call(self, action: Callable[[KafkaConsumer], Any]) -> Any:
        # kafka-python is imported here, by the one process that talks to the broker: Spark's
        # planner processes that only build the source never pay its ~0.15 s import.
        from kafka import KafkaConsumer
        from kafka.errors import KafkaConnectionError, KafkaTimeoutError

        try:
            if self._consumer is None:
                self._consumer = KafkaConsumer(**self._options.metadata_consumer_config())
            return action(self._consumer)
        except (KafkaTimeoutError, KafkaConnectionError) as error:
            self.close()
            raise self._unreachable(error) from None

    def cluster_view(self, subscription: Subscription) -> ClusterView:
        """The topic-partitions the subscription covers right now, from one fresh metadata
        answer (``kafka.metadata``), with every topic's id."""

        def discover(consumer: KafkaConsumer) -> ClusterView:
            topics = broker_call("kafka.metadata", consumer.topics)
            cluster = consumer._client.cluster
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


class OffsetPlanner:
    """Resolves offset options to concrete offsets and batches to ranges."""

    def __init__(self, options: KafkaSourceOptions, metadata: KafkaMetadata) -> None:
        self.options = options
        self.metadata = metadata

    def current_partitions(self) -> list[TopicPartitionKey]:
        return self.metadata.partitions(self.options.subscription)

    def resolve(
        self, bound: OffsetBound, tps: list[TopicPartitionKey], is_start: bool
    ) -> PartitionOffsets:
        """Concrete offsets for ``tps`` from a starting or ending option."""
        if bound.kind == "earliest":
            return self.metadata.earliest(tps)
        if bound.kind == "latest":
            return self.metadata.latest(tps)
        if bound.kind in ("timestamps", "timestamp"):
            return self._resolve_timestamps(bound, tps, is_start)
        return self._resolve_specific(bound, tps, is_start)

    def _check_topics_known(self, bound: OffsetBound, tps: list[TopicPartitionKey]) -> None:
        unknown = sorted(tp for tp in bound.as_dict() if tp not in set(tps))
        if unknown:
            names = ", ".join(f"{t}-{p}" for t, p in unknown)
            raise KafkaSourceOptionError(
                f"Option {bound.option} names {names}, which the subscription"
                f" ({self.options.subscription.describe()}) does not cover or which do not"
                " exist: fix the option"
            )

    def _resolve_specific(
        self, bound: OffsetBound, tps: list[TopicPartitionKey], is_start: bool
    ) -> PartitionOffsets:
        self._check_topics_known(bound, tps)
        wanted = bound.as_dict()
        earliest = self.metadata.earliest(tps)
        latest = self.metadata.latest(tps)
        resolved: PartitionOffsets = {}
        for tp in tps:
            offset = wanted.get(tp, bound.unlisted)
            if offset == EARLIEST:
                resolved[tp] = earliest[tp]
            elif offset == LATEST:
                resolved[tp] = latest[tp]
            elif earliest[tp] <= offset <= latest[tp]:
                resolved[tp] = offset
            else:
                topic, partition = tp
                report_data_loss(
                    self.options.fail_on_data_loss,
                    f"Option {bound.option} asks for offset {offset} of {topic}-{partition},"
                    f" outside the available offsets [{earliest[tp]}, {latest[tp]}]",
                    skipped=None,
                )
                resolved[tp] = earliest[tp] if is_start else latest[tp]
        return resolved

    def _resolve_timestamps(
        self, bound: OffsetBound, tps: list[TopicPartitionKey], is_start: bool
    ) -> PartitionOffsets:
        if bound.kind == "timestamp":
            wanted = {tp: bound.timestamp or 0 for tp in tps}
        else:
            self._check_topics_known(bound, tps)
            wanted = bound.as_dict()
        found = self.metadata.for_times(wanted)
        latest = self.metadata.latest(tps)
        resolved: PartitionOffsets = {}
        for tp in tps:
            if tp not in wanted:
                resolved[tp] = latest[tp]
                continue
            offset = found.get(tp)
            if offset is None:
                if is_start and bound.timestamp_strategy == "error":
                    topic, partition = tp
                    raise KafkaSourceOptionError(
                        f"Option {bound.option}: {topic}-{partition} has no record at or after"
                        f" timestamp {wanted[tp]}: pick an earlier timestamp or set"
                        " startingOffsetsByTimestampStrategy=latest"
                    )
                offset = latest[tp]
            resolved[tp] = offset
        return resolved

    def earliest_of(self, tps: list[TopicPartitionKey]) -> PartitionOffsets:
        return self.metadata.earliest(tps)

    def snapshot(self) -> ClusterSnapshot:
        """The subscription's partitions, topic ids and latest offsets: two broker calls."""
        view = self.metadata.cluster_view(self.options.subscription)
        return ClusterSnapshot(view, self.metadata.latest(view.partitions))

    def initial_batch(self, bound: OffsetBound, view: ClusterView | None = None) -> BatchOffsets:
        """The start of the first batch, from the starting option, as a batch of nothing;
        over the partitions of ``view`` if given (one just taken), else of a fresh answer."""
        if view is None:
            view = self.metadata.cluster_view(self.options.subscription)
        self.metadata.check_assignment(self.options.subscription, view)
        offsets = self.resolve(bound, list(view.partitions), is_start=True)
        ids = {t: i for t, i in view.topic_ids.items() if i is not None}
        return BatchOffsets(offsets, {}, ids)

    def plan(self, previous: BatchOffsets, snapshot: ClusterSnapshot) -> BatchPlan:
        """The next batch's starts and limits (see :func:`plan_next_batch`).

        A topic of ``previous`` that the snapshot does not list is asked for once more
        before its partitions count as gone: one metadata answer is not proof of deletion.
        Partitions the subscription no longer covers (options changed over a restart) are
        left out, as the user asked, not reported as lost.
        """
        subscription = self.options.subscription
        dropped = sorted(tp for tp in previous.ends if not subscription.covers(tp))
        if dropped:
            log.info(
                "No longer subscribed (%s): %s",
                subscription.describe(),
                ", ".join(f"{t}-{p}" for t, p in dropped),
            )
            ends = {tp: o for tp, o in previous.ends.items() if tp not in dropped}
            previous = BatchOffsets(ends, previous.starts, previous.topic_ids)
        view = snapshot.view
        if any(topic not in view.topics for topic, _ in previous.ends):
            again = self.metadata.cluster_view(self.options.subscription)
            ids = {**again.topic_ids, **view.topic_ids}
            view = ClusterView(view.partitions, view.topics | again.topics, ids)
        return plan_next_batch(
            previous, view, snapshot.latest, self.earliest_of, self.options.fail_on_data_loss
        )

    def ranges(
        self, start: Mapping[str, Any], end: Mapping[str, Any], replay: bool = True
    ) -> list[OffsetRange]:
        """The split, non-empty ranges of the batch that ends at ``end``.

        From ``end`` alone when it records its starts (every batch this version plans);
        from ``start`` and ``end`` as before for offsets logged by earlier versions, whose
        new partitions start at their earliest offset now. A ``replay`` (a batch this
        process did not just plan) first checks that its topics were not re-created since.
        """
        batch = BatchOffsets.from_json(end)
        if batch.starts is None:
            previous = offsets_from_json(start)
            fail = self.options.fail_on_data_loss
            planned = plan_ranges(previous, batch.ends, self.earliest_of, fail)
        else:
            planned = batch.ranges()
        if replay and batch.topic_ids:
            recreated = self._recreated_since(batch, planned)
            planned = [r for r in planned if r.topic not in recreated]
        return split_ranges(planned, self.options.min_partitions)

    def _recreated_since(self, batch: BatchOffsets, planned: list[OffsetRange]) -> set[str]:
        """Topics of ``batch`` whose id changed since it was planned: its records of them
        are gone (data loss per the option), and the new topic's must not be read instead."""
        current = self.metadata.cluster_view(self.options.subscription).topic_ids
        recreated = set()
        for topic, planned_id in sorted(batch.topic_ids.items()):
            now = current.get(topic)
            if now is None or now == planned_id:
                continue
            recreated.add(topic)
            lost = [r for r in planned if r.topic == topic and r.size > 0]
            report_data_loss(
                self.options.fail_on_data_loss,
                f"Cannot replay {', '.join(r.describe() for r in lost) or 'a batch'}: topic"
                f" {topic} was deleted and re-created after the batch was planned (topic id"
                f" {planned_id} is now {now}), so these records are lost",
                skipped=sum(r.size for r in lost),
            )
        return recreated


class TriggerPacer:
    """minOffsetsPerTrigger with maxTriggerDelay: wait for enough offsets, but not forever.

    The Python ReadMinRows limit carries no delay, so the source keeps the clock, as Spark's
    Kafka source does (the first trigger always runs).
    """

    def __init__(self, max_delay_ms: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._max_delay_ms = max_delay_ms
        self._clock = clock
        self._last_trigger: float | None = None

    def should_wait(self, available: int, min_rows: int) -> bool:
        now = self._clock()
        overdue = (
            self._last_trigger is None or (now - self._last_trigger) * 1000 >= self._max_delay_ms
        )
        if overdue or available >= min_rows:
            self._last_trigger = now
            return False
        return True
