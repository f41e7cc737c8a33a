"""Two-phase commit for Spark streaming sinks, written once; sinks plug a resource in.

- ``PreparedPiece``: what a task prepared (its ``write()`` commit message).
- ``TransactionalResource``: the storage side a sink implements.
- ``TwoPhaseCommitCoordinator``: commit/abort/recover on the driver, in a fixed order
  with named fault points (``eospack.core.fault_points``) for crash tests.
- ``current_task`` / ``derive_sink_id``: transaction ids derived from sink, batch,
  partition and attempt, so a restarted query finds its own prepared work.
"""

from eospack.core.fault_points import AFTER_PREPARE, ALL_FAULT_POINTS, fault_point

from .coordinator import (
    CommitProtocolError,
    TwoPhaseCommitCoordinator,
    prepared_pieces_of,
    stale_pieces,
)
from .identity import (
    SinkIdentityError,
    TaskIdentity,
    current_task,
    derive_sink_id,
    validate_sink_id,
)
from .pieces import (
    BatchDecision,
    PreparedPiece,
    parse_transaction_id,
    sink_prefix,
    transaction_id,
)
from .resource import DecidedPieceLostError, TransactionalResource
from .stream_writer import TwoPhaseCommitStreamWriter

__all__ = [
    "AFTER_PREPARE",
    "ALL_FAULT_POINTS",
    "BatchDecision",
    "CommitProtocolError",
    "DecidedPieceLostError",
    "PreparedPiece",
    "SinkIdentityError",
    "TaskIdentity",
    "TransactionalResource",
    "TwoPhaseCommitCoordinator",
    "TwoPhaseCommitStreamWriter",
    "current_task",
    "derive_sink_id",
    "fault_point",
    "parse_transaction_id",
    "prepared_pieces_of",
    "sink_prefix",
    "stale_pieces",
    "transaction_id",
    "validate_sink_id",
]
