"""The offset replayable-kafka logs for a batch in Spark's checkpoint (the offset format).

The end offsets in the format of Spark's own Kafka source, ``{"topic": {"0": 23}}``, plus
``"@starts"``, the start of every range the batch reads, and ``"@topicIds"``, the Kafka
topic id of every topic: a batch described on its own, so that a replay needs nothing else.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .offset_ranges import OffsetRange, PartitionOffsets
from .options import TopicPartitionKey

OffsetsJson = dict[str, Any]

# Reserved keys of the offset JSON; "@" cannot occur in a Kafka topic name.
STARTS_KEY = "@starts"
TOPIC_IDS_KEY = "@topicIds"
# Spark 4.0 and 4.1 (no start given to latestOffset): the starts of the first batch a process
# planned, valid only if Spark's start is that process's initial offset (see data_source.py).
STARTS_IF_INITIAL_KEY = "@startsIfInitial"


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
        sorted, with only the starts of non-empty ranges, so equal batches give equal JSON.
        Without starts (``None``: ends only, as Spark's own source logs them) no "@starts"."""
        result: OffsetsJson = offsets_to_json(self.ends)
        if self.starts is not None:
            starts = self.starts
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
