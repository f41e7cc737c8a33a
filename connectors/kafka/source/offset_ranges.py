"""Range math of replayable-kafka (pure): offset ranges, rate limits, splitting and packing.

A batch reads half-open :class:`OffsetRange` ``[start, end)``, one per topic-partition (or
several, with minPartitions). Nothing here talks to the broker or knows the offset format.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .options import TopicPartitionKey

PartitionOffsets = dict[TopicPartitionKey, int]


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
