"""Who is writing: the sink id, and the batch/partition/attempt of the running task.

The sink id keys every decision and transaction id. It is derived from the streaming
query's id (stored in ``<checkpoint>/metadata``; Spark hands it to tasks as a local
property) and the sink's target, so a query restarted from its checkpoint finds its own
decisions, while a new checkpoint writing to the same target gets a new id and is never
skipped as "already committed". A user-given ``sinkId`` replaces the derivation.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from dataclasses import dataclass
from urllib.parse import unquote, urlparse

QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"

SINK_ID_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


class SinkIdentityError(ValueError):
    """The sink id cannot be derived or the given one is unusable."""


def derive_sink_id(query_id: str, target: str) -> str:
    digest = hashlib.sha256(f"{query_id}\n{target}".encode()).hexdigest()
    return digest[:20]


def validate_sink_id(sink_id: str) -> str:
    if not sink_id or len(sink_id) > 64 or not set(sink_id) <= SINK_ID_CHARACTERS:
        raise SinkIdentityError(
            f"sinkId {sink_id!r} is not usable: use 1 to 64 letters, digits or underscores"
        )
    return sink_id


def query_id_from_checkpoint(checkpoint_location: str | None) -> str | None:
    """The query id in ``<checkpoint>/metadata`` when the checkpoint is on a local path."""
    if not checkpoint_location:
        return None
    parsed = urlparse(checkpoint_location)
    if parsed.scheme not in ("", "file"):
        return None
    path = unquote(parsed.path) if parsed.scheme == "file" else checkpoint_location
    try:
        with open(os.path.join(path, "metadata"), encoding="utf-8") as metadata:
            return str(json.loads(metadata.readline())["id"])
    except (OSError, ValueError, KeyError):
        return None


@dataclass(frozen=True)
class TaskIdentity:
    """The running write task: which sink, batch and partition, and a unique attempt."""

    sink_id: str
    batch_id: int
    partition_id: int
    attempt: str


def current_task(sink_id_option: str | None, target: str) -> TaskIdentity:
    """Identify the write task running in this Python worker (executor side only).

    The attempt is the task attempt number plus a random suffix: a query restarted
    after a crash replays batch N with the same partition ids and attempt numbers, and
    its pieces must not collide with what the crashed run left prepared.
    """
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        raise SinkIdentityError("current_task() is only available inside a Spark write task")
    batch = context.getLocalProperty(BATCH_ID_PROPERTY)
    query_id = context.getLocalProperty(QUERY_ID_PROPERTY)
    if batch is None or query_id is None:
        raise SinkIdentityError(
            "this sink is for streaming writes: use df.writeStream, not df.write"
        )
    sink_id = sink_id_option or derive_sink_id(query_id, target)
    attempt = f"{context.attemptNumber()}x{uuid.uuid4().hex[:10]}"
    return TaskIdentity(sink_id, int(batch), context.partitionId(), attempt)
