"""``format("replayable-kafka")``: a Kafka source whose every micro-batch can be replayed.

Guarantee: each micro-batch is the half-open offset range ``[start, end)`` of every
topic-partition it covers, fixed when the batch is planned and written to Spark's offset
log, starts included (see ``planning.BatchOffsets``), before the batch runs. Reading a batch
again (after a failure or a restart from the checkpoint, batch 0 included) returns exactly
the same records, so with an idempotent or transactional sink every record is delivered
exactly once. Offsets are owned by Spark: Kafka's committed offsets are never read
(``commitOffsetsToGroup`` writes a copy for lag tools, see ``client.group_offsets``). Records
are read with isolation.level=read_committed unless the user asks for read_uncommitted.
Limits: with startingOffsets=latest, a query stopped before Spark logged its first batch
resolves "latest" again on restart; records that Kafka deleted before they were read cannot
be replayed (data loss, see failOnDataLoss). Options and output schema are those of Spark's
built-in Kafka source.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.types import StructType

from eospack.core.metrics import RECORDER
from eospack.core.spark_features import ADMISSION_CONTROL, require

from ..client.group_offsets import GroupOffsetCommitter
from ..errors import KafkaSourceOptionError
from ..records import native_path
from ..records.schema import spark_schema
from .broker_metadata import ClusterSnapshot, KafkaMetadata
from .offset_format import (
    STARTS_IF_INITIAL_KEY,
    STARTS_KEY,
    BatchOffsets,
    OffsetsJson,
    offsets_to_json,
)
from .offset_ranges import (
    OffsetRange,
    available_records,
    pack_ranges,
    rate_limit,
    split_ranges,
)
from .options import (
    KafkaSourceOptions,
    OffsetBound,
    TopicPartitionKey,
    parse_options,
)
from .planning import OffsetPlanner, TriggerPacer

if TYPE_CHECKING or ADMISSION_CONTROL.available:
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        ReadMinRows,
        SupportsTriggerAvailableNow,
    )
else:  # Spark 4.0 and 4.1: Spark calls latestOffset() with nothing (no read limits)
    from .read_limits import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        ReadMinRows,
        SupportsTriggerAvailableNow,
    )

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)


def read_ranges(
    options: KafkaSourceOptions, offset_ranges: Sequence[OffsetRange]
) -> Iterator[pa.RecordBatch]:
    """The executor's reader (imported where a task first reads), range after range; with
    metrics on, metered (``metered_batches``)."""
    from . import reader

    batches = (
        batch
        for offset_range in offset_ranges
        for batch in reader.read_range(options, offset_range)
    )
    if RECORDER.directory() is None or not offset_ranges:
        return batches
    return metered_batches(batches, options.metrics_query)


def metered_batches(batches: Iterator[pa.RecordBatch], query: str) -> Iterator[pa.RecordBatch]:
    """``batches``, recording the task's fetch time (the time spent producing batches, from
    the brokers and the decoder, not the time Spark spends between them) and the key and
    value bytes read. Recorded once, when the task's read ends, however it ends (a failed
    or retried task's reads count: they were fetched), in the executor's Python worker,
    whose snapshot is rewritten shortly after (``flush_soon``: once for the tasks that end
    meanwhile). A task of an empty batch records nothing."""
    import pyarrow.compute as compute

    fetch_seconds, read_bytes = 0.0, 0
    try:
        while True:
            started = time.perf_counter()
            batch = next(batches, None)
            fetch_seconds += time.perf_counter() - started
            if batch is None:
                return
            for column in (batch.column(0), batch.column(1)):
                read_bytes += compute.sum(compute.binary_length(column)).as_py() or 0
            yield batch
    finally:
        RECORDER.observe("eospack_kafka_source_fetch_seconds", {"query": query}, fetch_seconds)
        RECORDER.add("eospack_kafka_source_read_bytes_total", {"query": query}, read_bytes)
        RECORDER.flush_soon()


class KafkaInputPartition(InputPartition):
    """One Spark task: offset ranges of topic-partitions (one, or small ones packed)."""

    def __init__(self, offset_ranges: Sequence[OffsetRange]) -> None:
        self.offset_ranges = tuple(offset_ranges)


def offset_ranges_of(partition: InputPartition) -> Sequence[OffsetRange]:
    """The ranges a task reads. When ``partitions()`` plans none (an empty topic, or
    startingOffsets equal to endingOffsets), PySpark still runs one task with the
    placeholder ``InputPartition(None)``: it reads nothing, so the result is an empty
    DataFrame, as with Spark's own source."""
    if isinstance(partition, KafkaInputPartition):
        return partition.offset_ranges
    if type(partition) is InputPartition and partition.value is None:
        return ()
    raise TypeError(f"replayable-kafka cannot read a {type(partition).__name__}")


def input_partitions(
    options: KafkaSourceOptions, ranges: Sequence[OffsetRange]
) -> list[KafkaInputPartition]:
    """One Spark partition per packed group of ``ranges`` (see ``pack_ranges``)."""
    return [
        KafkaInputPartition(group)
        for group in pack_ranges(ranges, options.min_records_per_partition, options.min_partitions)
    ]


class ReplayableKafkaDataSource(DataSource):
    """Reads Kafka like Spark's ``format("kafka")``, with offsets kept by Spark."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.kafka_options = parse_options(options)

    @classmethod
    def name(cls) -> str:
        return "replayable-kafka"

    def schema(self) -> StructType:
        return spark_schema(self.kafka_options.include_headers)

    def _check_schema(self, schema: StructType) -> None:
        if schema != self.schema():
            raise KafkaSourceOptionError(
                "replayable-kafka has a fixed schema (that of Spark's Kafka source):"
                " remove .schema(...) and cast the key/value columns instead"
            )

    def reader(self, schema: StructType) -> DataSourceReader:
        self._check_schema(schema)
        return ReplayableKafkaBatchReader(self.kafka_options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        self._check_schema(schema)
        for option, value in (
            ("maxOffsetsPerTrigger", self.kafka_options.max_offsets_per_trigger),
            ("minOffsetsPerTrigger", self.kafka_options.min_offsets_per_trigger),
        ):
            if value is not None:
                require(ADMISSION_CONTROL, option)
        native_path.warn_if_reference_path()
        return ReplayableKafkaStreamReader(self.kafka_options)


class ReplayableKafkaBatchReader(DataSourceReader):
    """``spark.read``: from startingOffsets (default earliest) to endingOffsets (latest)."""

    def __init__(self, options: KafkaSourceOptions) -> None:
        starting = options.starting
        if starting is not None and (
            starting.kind == "latest"
            or (starting.kind == "offsets" and -1 in starting.as_dict().values())
        ):
            raise KafkaSourceOptionError(
                f"Option {starting.option} cannot be latest (-1) for batch queries:"
                " use earliest or specific offsets"
            )
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        metadata = KafkaMetadata(self.options)
        try:
            planner = OffsetPlanner(self.options, metadata)
            metadata.check_assignment(self.options.subscription)
            tps = planner.current_partitions()
            start = planner.resolve(
                self.options.starting or OffsetBound("earliest", "startingOffsets"), tps, True
            )
            end = planner.resolve(
                self.options.ending or OffsetBound("latest", "endingOffsets"), tps, False
            )
        finally:
            metadata.close()
        ranges = []
        for tp in tps:
            if end[tp] < start[tp]:
                raise KafkaSourceOptionError(
                    f"Starting offset {start[tp]} of {tp[0]}-{tp[1]} is after its ending offset"
                    f" {end[tp]}: fix startingOffsets/endingOffsets"
                )
            ranges.append(OffsetRange(tp[0], tp[1], start[tp], end[tp]))
        return input_partitions(self.options, split_ranges(ranges, self.options.min_partitions))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_ranges(self.options, offset_ranges_of(partition))


class ReplayableKafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream``: offsets in Spark's offset log, admission control, AvailableNow.

    Runs on the driver (planning) and is re-created on executors only to call ``read``,
    so it connects to Kafka lazily. ``latestOffset`` plans a batch completely (every range
    start is fixed and logged with the end offsets); ``partitions`` reads the plan back
    from the logged offset. For a batch it did not just plan (a replay after a restart) it
    asks the broker one thing: whether the batch's topics still have the same ids.

    The initial offset is resolved once per query (Spark asks for it again to read batch 0),
    as Spark's Kafka source does; under Trigger.AvailableNow it is resolved against the
    partitions of the target taken just before, so a query start costs one metadata answer.
    """

    def __init__(self, options: KafkaSourceOptions) -> None:
        if options.ending is not None:
            raise KafkaSourceOptionError(
                f"Option {options.ending.option} is for batch queries only:"
                " remove it from readStream"
            )
        self.options = options
        self._planner: OffsetPlanner | None = None
        self._latest: Mapping[TopicPartitionKey, int] | None = None
        self._available_now_target: ClusterSnapshot | None = None
        self._planned: OffsetsJson | None = None
        self._initial: OffsetsJson | None = None
        self._pacer = TriggerPacer(options.max_trigger_delay_ms)
        self._group: GroupOffsetCommitter | None = None

    @property
    def planner(self) -> OffsetPlanner:
        if self._planner is None:
            self._planner = OffsetPlanner(self.options, KafkaMetadata(self.options))
        return self._planner

    def initialOffset(self) -> OffsetsJson:
        if self._initial is None:
            bound = self.options.starting or OffsetBound("latest", "startingOffsets")
            target = self._available_now_target
            initial = self.planner.initial_batch(bound, target.view if target else None)
            if target is not None:
                # Resolved after the AvailableNow target was taken: the target must not be
                # behind.
                latest = {
                    tp: max(end, initial.ends.get(tp, end)) for tp, end in target.latest.items()
                }
                self._available_now_target = ClusterSnapshot(target.view, latest)
            self._initial = initial.to_json()
        return copy.deepcopy(self._initial)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        if self.options.min_offsets_per_trigger is not None:
            return ReadMinRows(self.options.min_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now_target = self.planner.snapshot()
        log.info(
            "Trigger.AvailableNow reads up to %s",
            offsets_to_json(self._available_now_target.latest),
        )

    def latestOffset(
        self, start: OffsetsJson | None = None, limit: ReadLimit | None = None
    ) -> OffsetsJson:
        """Plan the next batch: ``start`` itself when there is nothing new (or not enough
        for minOffsetsPerTrigger yet), else the self-describing offset of the batch.

        Spark without admission control for Python sources (4.0, 4.1) asks with no
        ``start``: the answer is then every partition's latest offset in the format of
        Spark's own source (ends only), and ``partitions`` reads from Spark's start offset,
        as Spark's Kafka source does (see ``planning.plan_ranges``)."""
        if start is None:
            return self._latest_offset_without_start()
        if limit is None:
            limit = ReadAllAvailable()
        started = time.perf_counter()
        planned = self._plan_batch(start, limit)
        self._record_metrics(BatchOffsets.from_json(start), planned, planned is not start, started)
        return planned

    def _plan_batch(self, start: OffsetsJson, limit: ReadLimit) -> OffsetsJson:
        previous = BatchOffsets.from_json(start)
        if start != self._initial:
            self._commit_to_group(previous.ends)
        available_now = self._available_now_target is not None
        snapshot = self._available_now_target or self.planner.snapshot()
        self._latest = snapshot.latest
        plan = self.planner.plan(previous, snapshot)
        ends = plan.limits
        if not isinstance(limit, ReadAllAvailable):
            min_rows = (
                limit.min_rows
                if isinstance(limit, ReadMinRows)
                else self.options.min_offsets_per_trigger
            )
            max_rows = (
                limit.max_rows
                if isinstance(limit, ReadMaxRows)
                else self.options.max_offsets_per_trigger
            )
            if min_rows and not available_now:
                available = available_records(plan.begins, plan.limits, {})
                if self._pacer.should_wait(available, min_rows):
                    self._planned = start
                    return start
            if max_rows:
                ends = rate_limit(max_rows, plan.begins, plan.limits, {})
        if ends == previous.ends and plan.topic_ids == (previous.topic_ids or plan.topic_ids):
            self._planned = start
        else:
            self._planned = BatchOffsets(ends, plan.begins, plan.topic_ids).to_json()
        return self._planned

    def _record_metrics(
        self, previous: BatchOffsets, planned: OffsetsJson, new_batch: bool, started: float
    ) -> None:
        """Lag per partition (the broker's end offset minus the end offset of the last
        committed batch, ``previous``: Spark plans only after a batch is in its commit log),
        and the offsets and planning time of a newly planned batch. Off: nothing."""
        if RECORDER.directory() is None or self._latest is None:
            return
        query = self.options.metrics_query
        RECORDER.set_many(
            "eospack_kafka_source_lag_records",
            [
                ({"query": query, "topic": tp[0], "partition": tp[1]}, max(0, end - consumed))
                for tp, end in sorted(self._latest.items())
                if (consumed := previous.ends.get(tp)) is not None
            ],
        )
        if new_batch:
            records = sum(r.size for r in BatchOffsets.from_json(planned).ranges())
            RECORDER.add("eospack_kafka_source_records_total", {"query": query}, records)
            RECORDER.set("eospack_kafka_source_batch_records", {"query": query}, records)
        RECORDER.observe(
            "eospack_kafka_source_planning_seconds",
            {"query": query},
            time.perf_counter() - started,
        )
        RECORDER.flush()

    def _latest_offset_without_start(self) -> OffsetsJson:
        """Spark 4.0 and 4.1: every partition's latest offset, ends only.

        The first batch a process plans may be batch 0, whose start Spark takes from
        ``initialOffset()`` (asked after this call) and, when it replays an uncommitted batch
        0 after a restart, from a fresh ``initialOffset()`` (a later "latest"). So the first
        answer also records, under ``@startsIfInitial``, where each range starts if the
        start is this process's initial offset; ``partitions`` uses them only when Spark's
        start is the initial offset that process handed out (batch 0, or its replay), and
        Spark's start otherwise (this process was a restart that never planned batch 0).
        """
        snapshot = self.planner.snapshot()
        self._latest = snapshot.latest
        if self._planned is None:
            previous = BatchOffsets.from_json(self.initialOffset())
            plan = self.planner.plan(previous, snapshot)
            offsets = BatchOffsets(plan.limits, None, plan.topic_ids).to_json()
            starts = {tp: s for tp, s in plan.begins.items() if s != plan.limits.get(tp, s)}
            offsets[STARTS_IF_INITIAL_KEY] = offsets_to_json(starts)
        else:
            ids = {t: id_ for t, id_ in snapshot.view.topic_ids.items() if id_ is not None}
            offsets = BatchOffsets(snapshot.latest, None, ids).to_json()
        self._planned = offsets
        return offsets

    def reportLatestOffset(self) -> OffsetsJson | None:
        return offsets_to_json(self._latest) if self._latest else None

    def partitions(self, start: OffsetsJson, end: OffsetsJson) -> Sequence[InputPartition]:
        # A batch planned by this reader's latestOffset was checked then; others are replays.
        replay = end != self._planned
        if STARTS_IF_INITIAL_KEY in end:  # planned without a start (Spark 4.0, 4.1)
            starts = end[STARTS_IF_INITIAL_KEY]
            end = {key: value for key, value in end.items() if key != STARTS_IF_INITIAL_KEY}
            if self._initial is not None and start == self._initial:
                end[STARTS_KEY] = starts  # batch 0 (or its replay): the ranges first planned
        return input_partitions(self.options, self.planner.ranges(start, end, replay))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_ranges(self.options, offset_ranges_of(partition))

    def commit(self, end: OffsetsJson) -> None:
        """Spark's commit log is the only record of consumed offsets; with
        commitOffsetsToGroup, a copy of ``end`` goes to the group (see ``_commit_to_group``)."""
        self._commit_to_group(BatchOffsets.from_json(end).ends)

    def _commit_to_group(self, ends: Mapping[TopicPartitionKey, int]) -> None:
        """Copy a committed batch's end offsets to the commitOffsetsToGroup group.

        Called from ``commit(end)`` and from ``latestOffset(start)``: Spark 4.x calls
        ``commit`` for batch N only when it plans batch N+1 (measured: never after the last
        batch before new data arrives), but it asks ``latestOffset(start)`` only after the
        batch ending at ``start`` is in the commit log (a restart runs an uncommitted last
        batch again before planning), so ``start`` is committed and lag tools see the last
        batch within one trigger. Bounded by kafka.request.timeout.ms; never raises."""
        group = self.options.commit_offsets_to_group
        if group is None or not ends:
            return
        if self._group is None:
            self._group = GroupOffsetCommitter(
                group, self.options.metadata_consumer_config(), self.options.metadata_timeout_ms
            )
        self._group.commit(ends)

    def stop(self) -> None:
        if self._group is not None:
            self._group.close()
        if self._planner is not None:
            self._planner.metadata.close()
