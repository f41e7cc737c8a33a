"""What a two-phase-commit sink holds right now, in one shape for every sink.

Why: "what did a sink leave behind" is asked by ``eospack checkpoint inspect``, the demo's
verification and the tests; each sink's resource answers it once
(``TransactionalResource.inspect``) from its own decision slots, prepared pieces and the
sink-specific leftovers, instead of every caller reading the sink's tables, keys or topics.

Guarantee: inspection only reads. It never writes a slot, fences, commits or rolls back
anything, so it is safe on a running query and on a crashed one whose restart must still
find its decided batch and prepared pieces exactly as they were.
"""

from __future__ import annotations

from dataclasses import dataclass

from .pieces import ABORTED, DONE, BatchDecision

DECIDED_STATUS = "decided"
"""A decision whose pieces are not all committed yet (a crash between decision and commit)."""
DONE_STATUS = "done"
ABORTED_STATUS = "aborted (fence)"
"""An abort fence: the pieces it names were rolled back and no decision may name them."""
NOTHING_TO_CLEAN = "nothing to clean"


@dataclass(frozen=True)
class DecisionState:
    """One decision slot of the sink: the batch, its status, its rows and pieces."""

    batch_id: int
    status: str
    """``decided``, ``done`` or ``aborted (fence)``."""
    rows: int
    pieces: int

    @classmethod
    def of(cls, decision: BatchDecision, finished: bool | None = None) -> DecisionState:
        """``finished`` overrides the slot's own status for a resource that keeps no
        "done" (2pc-s3: a decided batch is finished when none of its pieces is prepared)."""
        if decision.status == ABORTED:
            status = ABORTED_STATUS
        elif finished is None:
            status = DONE_STATUS if decision.status == DONE else DECIDED_STATUS
        else:
            status = DONE_STATUS if finished else DECIDED_STATUS
        return cls(decision.batch_id, status, decision.rows, len(decision.pieces))


@dataclass(frozen=True)
class Leftover:
    """One thing the sink left behind, e.g. ``prepared transaction <gid>``, ``staged rows
    12``, ``multipart upload <key> (<upload id>)``, ``open Kafka transaction <id>``."""

    kind: str
    name: str
    count: int = 1
    """How many items it stands for (staged rows: the rows), for totals."""

    @property
    def what(self) -> str:
        return f"{self.kind} {self.name}"


@dataclass(frozen=True)
class SinkState:
    """A sink's state as its resource reads it (see the module doc); never holds secrets."""

    format: str
    sink_id: str
    target: str
    """Where the sink writes, as its options describe it without credentials."""
    decisions: tuple[DecisionState, ...]
    prepared_pieces: tuple[str, ...]
    """Transaction ids of the pieces still prepared (neither committed nor rolled back)."""
    leftovers: tuple[Leftover, ...]
    cleanup: str
    """One line: what cleans the leftovers, or ``nothing to clean``."""

    @property
    def unfinished(self) -> tuple[DecisionState, ...]:
        return tuple(decision for decision in self.decisions if decision.status == DECIDED_STATUS)

    @property
    def is_clean(self) -> bool:
        """Nothing left behind and no decision waiting for its commit."""
        return not self.leftovers and not self.unfinished

    def leftover_count(self) -> int:
        """Items left behind (a staged row counts one) plus decisions waiting for their
        commit: 0 once every batch is finished and nothing is left. An abort fence is a
        finished batch (its pieces were rolled back; the slot stays for good), not a
        leftover."""
        return sum(leftover.count for leftover in self.leftovers) + len(self.unfinished)

    def lines(self) -> list[str]:
        """The state as text lines (``eospack checkpoint inspect`` prints them)."""
        lines = [f"{self.format} sink {self.sink_id} ({self.target}):"]
        lines += [
            f"  batch {decision.batch_id}: {decision.status}, {decision.rows} rows,"
            f" {decision.pieces} pieces"
            for decision in self.decisions
        ]
        lines.append(f"  prepared pieces: {len(self.prepared_pieces)}")
        lines += [f"    {piece}" for piece in self.prepared_pieces]
        lines.append(f"  left behind: {len(self.leftovers)}")
        lines += [f"    {leftover.what}" for leftover in self.leftovers]
        lines.append(f"  {self.cleanup}")
        return lines


def no_decision_line(sink_id: str) -> str:
    """The cleanup line of a sink id under which nothing at all was found: not "nothing to
    clean", since options that address the sink another way than the query did (another
    table spelling, topic or ledger) derive another id and would hide what the real sink
    left behind."""
    return (
        f"no decision of sink {sink_id} found: if the query wrote a batch, these options"
        " are not the query's (give url, dbtable, path, topic and ledger options exactly as"
        " the query wrote them, or its sinkId)"
    )


def cleanup_line(
    decisions: tuple[DecisionState, ...], leftovers: tuple[Leftover, ...], advice: str
) -> str:
    """``advice`` when anything is left or unfinished, else ``nothing to clean``."""
    unfinished = any(decision.status == DECIDED_STATUS for decision in decisions)
    return advice if leftovers or unfinished else NOTHING_TO_CLEAN


__all__ = [
    "ABORTED_STATUS",
    "DECIDED_STATUS",
    "DONE_STATUS",
    "NOTHING_TO_CLEAN",
    "DecisionState",
    "Leftover",
    "SinkState",
    "cleanup_line",
    "no_decision_line",
]
