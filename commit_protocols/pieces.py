"""What crosses from executors to the driver: prepared pieces and the batch decision."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pyspark.sql.datasource import WriterCommitMessage

TRANSACTION_ID_PREFIX = "eospack"


def transaction_id(sink_id: str, batch_id: int, partition_id: int, attempt: str) -> str:
    """Derived, not random at its root: a restarted query finds its own work by sink id."""
    return f"{TRANSACTION_ID_PREFIX}-{sink_id}-{batch_id}-{partition_id}-{attempt}"


def sink_prefix(sink_id: str) -> str:
    """The prefix shared by every transaction id of one sink (for recovery listings)."""
    return f"{TRANSACTION_ID_PREFIX}-{sink_id}-"


def parse_transaction_id(value: str) -> tuple[str, int, int, str] | None:
    """(sink id, batch id, partition id, attempt) of an eospack transaction id, else None."""
    parts = value.split("-")
    if len(parts) != 5 or parts[0] != TRANSACTION_ID_PREFIX:
        return None
    try:
        return parts[1], int(parts[2]), int(parts[3]), parts[4]
    except ValueError:
        return None


@dataclass(frozen=True)
class PreparedPiece(WriterCommitMessage):
    """One task's prepared, not yet visible, output: the commit message of ``write()``.

    ``handle`` holds what the resource needs to commit or roll the piece back later
    (a prepared transaction's gid, a staging tag, multipart upload ids); it must be
    JSON-serialisable because decisions store it durably for roll-forward.
    """

    sink_id: str
    batch_id: int
    partition_id: int
    attempt: str
    rows: int
    handle: Mapping[str, Any] = field(default_factory=dict)
    query_id: str | None = None
    """The streaming query that wrote it (Spark's query id, the same across restarts from
    one checkpoint): tells a replay of this query's batch from another query's batch of
    the same number under a shared ``sinkId``. None in pieces of older eospack versions."""

    @property
    def transaction_id(self) -> str:
        return transaction_id(self.sink_id, self.batch_id, self.partition_id, self.attempt)

    def to_json(self) -> dict[str, Any]:
        value = {
            "sink_id": self.sink_id,
            "batch_id": self.batch_id,
            "partition_id": self.partition_id,
            "attempt": self.attempt,
            "rows": self.rows,
            "handle": dict(self.handle),
        }
        if self.query_id is not None:
            value["query_id"] = self.query_id
        return value

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> PreparedPiece:
        return cls(
            sink_id=str(value["sink_id"]),
            batch_id=int(value["batch_id"]),
            partition_id=int(value["partition_id"]),
            attempt=str(value["attempt"]),
            rows=int(value["rows"]),
            handle=dict(value.get("handle") or {}),
            query_id=value.get("query_id"),
        )


DECIDED = "decided"
"""The batch commits with exactly these pieces; some may not be committed yet."""
DONE = "done"
"""Every piece of the decision is committed."""
ABORTED = "aborted"
"""No decision yet, and these pieces were fenced off: no later decision may name them."""
STATUSES = (DECIDED, DONE, ABORTED)


@dataclass(frozen=True)
class BatchDecision:
    """What the sink's durable slot for (sink, batch) holds: the coordinator's "commit batch N
    with exactly these pieces" record, or an ``aborted`` fence naming pieces rolled back.

    A slot moves absent -> decided -> done, or absent -> aborted -> (aborted with more
    pieces) -> decided with pieces disjoint from the fence. Decided and done are final.
    """

    sink_id: str
    batch_id: int
    pieces: tuple[PreparedPiece, ...]
    status: str = DECIDED

    @property
    def rows(self) -> int:
        return sum(piece.rows for piece in self.pieces)

    @property
    def is_decided(self) -> bool:
        """True for ``decided`` and ``done``: the batch commits, and only with these pieces."""
        return self.status in (DECIDED, DONE)

    def query_ids(self) -> frozenset[str]:
        """The queries whose tasks wrote the pieces (empty for pieces of older versions)."""
        return frozenset(piece.query_id for piece in self.pieces if piece.query_id is not None)

    def piece_query_ids(self) -> frozenset[str | None]:
        """``query_ids`` with None for each piece that names no query."""
        return frozenset(piece.query_id for piece in self.pieces)

    def transaction_ids(self) -> frozenset[str]:
        return frozenset(piece.transaction_id for piece in self.pieces)

    def names(self, piece: PreparedPiece) -> bool:
        return piece.transaction_id in self.transaction_ids()

    def same_pieces(self, other: BatchDecision) -> bool:
        return self.transaction_ids() == other.transaction_ids()

    def accepts(self, decision: BatchDecision) -> bool:
        """Whether ``decision`` may replace what this slot holds (an abort fence that names
        none of its pieces)."""
        return self.status == ABORTED and not (self.transaction_ids() & decision.transaction_ids())

    def fenced_with(self, pieces: tuple[PreparedPiece, ...]) -> BatchDecision:
        """This abort fence widened by ``pieces`` (each transaction id once)."""
        known = self.transaction_ids()
        added = tuple(piece for piece in pieces if piece.transaction_id not in known)
        return replace(self, pieces=self.pieces + added)

    def pieces_json(self) -> str:
        return json.dumps([piece.to_json() for piece in self.pieces], separators=(",", ":"))

    @classmethod
    def from_pieces_json(
        cls, sink_id: str, batch_id: int, pieces_json: str, status: str = DECIDED
    ) -> BatchDecision:
        pieces = tuple(PreparedPiece.from_json(value) for value in json.loads(pieces_json))
        return cls(sink_id, batch_id, pieces, status)
