"""``format("replayable-kafka")``: a Kafka source whose every micro-batch can be replayed.

Guarantee: each micro-batch is the half-open offset range ``[start, end)`` of every
topic-partition it covers, and its end offsets are the offsets Spark writes to its offset
log before the batch runs. Reading a batch again (after a failure or a restart from the
checkpoint) returns exactly the same records, so with an idempotent or transactional sink
every record is delivered exactly once. Offsets are owned by Spark: no consumer group, no
commits to Kafka. Limits: with startingOffsets=latest, a query that dies before its first
batch commits resolves "latest" again on restart (as Spark's own source would without its
metadata log); records that Kafka deleted before they were read cannot be replayed (data
loss, see failOnDataLoss); isolation.level=read_committed depends on the broker hiding
aborted records. Options and output schema are those of Spark's built-in Kafka source.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from connectors.kafka.errors import KafkaSourceOptionError
from connectors.kafka.options import KafkaSourceOptions, OffsetBound, parse_options
from connectors.kafka.planning import (
    KafkaMetadata,
    OffsetPlanner,
    OffsetRange,
    OffsetsJson,
    PartitionOffsets,
    TriggerPacer,
    available_records,
    offsets_from_json,
    offsets_to_json,
    rate_limit,
    split_ranges,
)
from connectors.kafka.reader import output_schema, read_range

log = logging.getLogger(__name__)


class KafkaInputPartition(InputPartition):
    """One Spark task: one offset range of one topic-partition."""

    def __init__(self, offset_range: OffsetRange) -> None:
        self.offset_range = offset_range


class ReplayableKafkaDataSource(DataSource):
    """Reads Kafka like Spark's ``format("kafka")``, with offsets kept by Spark."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.kafka_options = parse_options(options)

    @classmethod
    def name(cls) -> str:
        return "replayable-kafka"

    def schema(self) -> StructType:
        return output_schema(self.kafka_options.include_headers)

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
        return [KafkaInputPartition(r) for r in split_ranges(ranges, self.options.min_partitions)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaInputPartition)
        return read_range(self.options, partition.offset_range)


class ReplayableKafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream``: offsets in Spark's offset log, admission control, AvailableNow.

    Runs on the driver (planning) and is re-created on executors only to call ``read``,
    so it connects to Kafka lazily.
    """

    def __init__(self, options: KafkaSourceOptions) -> None:
        if options.ending is not None:
            raise KafkaSourceOptionError(
                f"Option {options.ending.option} is for batch queries only:"
                " remove it from readStream"
            )
        self.options = options
        self._planner: OffsetPlanner | None = None
        self._latest: PartitionOffsets | None = None
        self._available_now_target: PartitionOffsets | None = None
        self._pacer = TriggerPacer(options.max_trigger_delay_ms)

    @property
    def planner(self) -> OffsetPlanner:
        if self._planner is None:
            self._planner = OffsetPlanner(self.options, KafkaMetadata(self.options))
        return self._planner

    def initialOffset(self) -> OffsetsJson:
        self.planner.metadata.check_assignment(self.options.subscription)
        tps = self.planner.current_partitions()
        bound = self.options.starting or OffsetBound("latest", "startingOffsets")
        return offsets_to_json(self.planner.resolve(bound, tps, is_start=True))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        if self.options.min_offsets_per_trigger is not None:
            return ReadMinRows(self.options.min_offsets_per_trigger)
        return ReadAllAvailable()

    def _fetch_latest(self) -> PartitionOffsets:
        return self.planner.metadata.latest(self.planner.current_partitions())

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now_target = self._fetch_latest()
        log.info("Trigger.AvailableNow reads up to %s", offsets_to_json(self._available_now_target))

    def latestOffset(self, start: OffsetsJson, limit: ReadLimit) -> OffsetsJson:
        start_offsets = offsets_from_json(start)
        available_now = self._available_now_target is not None
        latest = self._available_now_target if available_now else self._fetch_latest()
        assert latest is not None
        self._latest = latest
        if isinstance(limit, ReadAllAvailable):
            return offsets_to_json(latest)
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
        new = [tp for tp in latest if tp not in start_offsets]
        earliest_of_new = self.planner.earliest_of(new) if new and (min_rows or max_rows) else {}
        if min_rows and not available_now:
            available = available_records(start_offsets, latest, earliest_of_new)
            if self._pacer.should_wait(available, min_rows):
                return start
        if max_rows:
            return offsets_to_json(rate_limit(max_rows, start_offsets, latest, earliest_of_new))
        return offsets_to_json(latest)

    def reportLatestOffset(self) -> OffsetsJson | None:
        return offsets_to_json(self._latest) if self._latest else None

    def partitions(self, start: OffsetsJson, end: OffsetsJson) -> Sequence[InputPartition]:
        ranges = self.planner.ranges(offsets_from_json(start), offsets_from_json(end))
        return [KafkaInputPartition(r) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaInputPartition)
        return read_range(self.options, partition.offset_range)

    def commit(self, end: OffsetsJson) -> None:
        """Nothing to do: Spark's commit log is the only record of consumed offsets."""

    def stop(self) -> None:
        if self._planner is not None:
            self._planner.metadata.close()
