"""Who is writing: the sink id, and the batch/partition/attempt of the running task.

The sink id keys every decision and transaction id. It is derived from the streaming
query's id (stored in ``<checkpoint>/metadata``; Spark hands it to tasks as a local
property) and the sink's target, so a query restarted from its checkpoint finds its own
decisions, while a new checkpoint writing to the same target gets a new id and is never
skipped as "already committed". A user-given ``sinkId`` replaces the derivation.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from eospack.core.errors import EospackError

from .pieces import PreparedPiece

QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"

SINK_ID_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
SINK_ID_RULE = "1 to 64 letters, digits or underscores"


class SinkIdentityError(EospackError, ValueError):
    """The sink id cannot be derived or the given one is unusable."""


def derive_sink_id(query_id: str, target: str) -> str:
    digest = hashlib.sha256(f"{query_id}\n{target}".encode()).hexdigest()
    return digest[:20]


def validate_sink_id(sink_id: str) -> str:
    if not sink_id or len(sink_id) > 64 or not set(sink_id) <= SINK_ID_CHARACTERS:
        raise SinkIdentityError(f"sinkId {sink_id!r} is not usable: use {SINK_ID_RULE}")
    return sink_id


RUN_ID_PROPERTY = "spark.jobGroup.id"
"""Spark runs a streaming query's jobs in a job group named by its run id (new per start)."""
SPECULATION_PROPERTY = "spark.speculation"
"""Spark propagates session settings to tasks as local properties; this one says whether a
second attempt of a task may run while the first is still alive."""


@dataclass(frozen=True)
class Attempt:
    """What a piece's attempt string says: Spark's attempt number and the query run."""

    number: int
    run: str | None
    """The first characters of the query's run id, None for pieces of older eospack versions."""


def attempt_string(attempt_number: int, run_id: str | None) -> str:
    """``<attempt number>x<run>x<random>``: unique per task attempt, even across restarts
    (a restart replays batch N with the same partition ids and attempt numbers)."""
    run = (run_id or "").replace("-", "")[:12] or "norun"
    return f"{attempt_number}x{run}x{uuid.uuid4().hex[:8]}"


def parse_attempt(attempt: str) -> Attempt:
    parts = attempt.split("x")
    number = int(parts[0]) if parts[0].isdigit() else -1
    run = parts[1] if len(parts) == 3 and parts[1] != "norun" else None
    return Attempt(number, run)


@dataclass(frozen=True)
class TaskIdentity:
    """The running write task: which sink, batch and partition, and a unique attempt."""

    sink_id: str
    batch_id: int
    partition_id: int
    attempt: str
    speculation: bool = False
    """Whether Spark may run another attempt of this task at the same time."""
    query_id: str | None = None
    """Spark's id of the streaming query (kept across restarts from its checkpoint)."""

    def piece(self, rows: int, handle: Mapping[str, Any] | None = None) -> PreparedPiece:
        """This task's prepared piece (its commit message)."""
        return PreparedPiece(
            self.sink_id,
            self.batch_id,
            self.partition_id,
            self.attempt,
            rows,
            dict(handle or {}),
            self.query_id,
        )

    @property
    def attempt_number(self) -> int:
        return parse_attempt(self.attempt).number

    @property
    def run(self) -> str | None:
        return parse_attempt(self.attempt).run


def current_task(sink_id_option: str | None, target: str) -> TaskIdentity:
    """Identify the write task running in this Python worker (executor side only).

    The sink id comes from the query id Spark hands every task, never from the checkpoint
    path, so it is the same whichever way the checkpoint was given (option, URI, or
    ``spark.sql.streaming.checkpointLocation``) and on any machine.
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
    attempt = attempt_string(context.attemptNumber(), context.getLocalProperty(RUN_ID_PROPERTY))
    speculation = (context.getLocalProperty(SPECULATION_PROPERTY) or "").lower() == "true"
    return TaskIdentity(sink_id, int(batch), context.partitionId(), attempt, speculation, query_id)
