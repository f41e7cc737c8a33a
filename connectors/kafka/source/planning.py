"""Driver side of replayable-kafka: which offsets the next batch reads, and why.

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

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import KafkaSourceOptionError, report_data_loss
from .broker_metadata import (
    ClusterSnapshot,
    ClusterView,
    KafkaMetadata,
)
from .offset_format import BatchOffsets, offsets_from_json
from .offset_ranges import (
    OffsetRange,
    PartitionOffsets,
    split_ranges,
)
from .options import (
    EARLIEST,
    LATEST,
    KafkaSourceOptions,
    OffsetBound,
    TopicPartitionKey,
)

log = logging.getLogger(__name__)


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
