"""Driver side of replayable-kafka: which topic-partitions, which offsets, which ranges.

A batch is a set of half-open :class:`OffsetRange` ``[start, end)``, one per topic-partition
(or several, with minPartitions). Its end offsets go to Spark's offset log as JSON in the
format of Spark's own Kafka source, ``{"topic": {"0": 23}}``, and the next batch starts
where this one ended, so a replayed batch plans exactly the same ranges. Partitions that
appear during a query start at their earliest offset. Offsets that vanished (retention, a
deleted or re-created topic) are data loss: with failOnDataLoss=true planning fails naming
the topic-partition and offsets; with false it logs a warning, counts the skipped offsets
and continues from the earliest offset still available.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaConnectionError, KafkaTimeoutError

from connectors.kafka.errors import (
    KafkaBrokerUnreachableError,
    KafkaDataLossError,
    KafkaSourceOptionError,
)
from connectors.kafka.options import (
    EARLIEST,
    LATEST,
    KafkaSourceOptions,
    OffsetBound,
    Subscription,
    TopicPartitionKey,
)

log = logging.getLogger(__name__)

PartitionOffsets = dict[TopicPartitionKey, int]
OffsetsJson = dict[str, dict[str, int]]

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


def offsets_from_json(offsets: Mapping[str, Mapping[str, Any]]) -> PartitionOffsets:
    return {
        (topic, int(partition)): int(offset)
        for topic, partitions in offsets.items()
        for partition, offset in partitions.items()
    }


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
    """The ranges of a batch from its start and end offsets (driver side).

    New partitions (in ``end`` only) start at their earliest offset; partitions that
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
        try:
            if self._consumer is None:
                self._consumer = KafkaConsumer(**self._options.metadata_consumer_config())
            return action(self._consumer)
        except (KafkaTimeoutError, KafkaConnectionError) as error:
            self.close()
            raise self._unreachable(error) from None

    def partitions(self, subscription: Subscription) -> list[TopicPartitionKey]:
        """The topic-partitions the subscription covers right now (fresh metadata)."""

        def discover(consumer: KafkaConsumer) -> list[TopicPartitionKey]:
            topics = consumer.topics()
            cluster = consumer._client.cluster
            if subscription.kind == "subscribe":
                wanted = [t for t in subscription.topics if t in topics]
            elif subscription.kind == "subscribePattern":
                pattern = re.compile(subscription.pattern or "")
                wanted = sorted(t for t in topics if pattern.fullmatch(t))
            else:
                present = {(t, p) for t in topics for p in (cluster.partitions_for_topic(t) or ())}
                return [tp for tp in subscription.partitions if tp in present]
            return sorted((t, p) for t in wanted for p in (cluster.partitions_for_topic(t) or ()))

        return self._call(discover)

    def check_assignment(self, subscription: Subscription) -> None:
        """Fail if ``assign`` names a topic or partition the cluster does not have."""
        if subscription.kind != "assign":
            return
        present = set(self.partitions(subscription))
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
        keys = [TopicPartition(t, p) for t, p in tps]
        if not keys:
            return {}
        timeout = self._options.metadata_timeout_ms
        found = self._call(lambda c: getattr(c, method)(keys, timeout_ms=timeout))
        return {(tp.topic, tp.partition): int(offset) for tp, offset in found.items()}

    def for_times(
        self, timestamps: Mapping[TopicPartitionKey, int]
    ) -> dict[TopicPartitionKey, int | None]:
        """The first offset at or after each timestamp, None where there is none."""
        query = {TopicPartition(t, p): ts for (t, p), ts in timestamps.items()}
        if not query:
            return {}
        timeout = self._options.metadata_timeout_ms
        found = self._call(lambda c: c.offsets_for_times(query, timeout_ms=timeout))
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
            offset = wanted.get(tp, LATEST)
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

    def ranges(
        self, start: Mapping[TopicPartitionKey, int], end: Mapping[TopicPartitionKey, int]
    ) -> list[OffsetRange]:
        """The split, non-empty ranges of a batch; data loss reported per the option."""
        planned = plan_ranges(start, end, self.earliest_of, self.options.fail_on_data_loss)
        return split_ranges(planned, self.options.min_partitions)


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
