"""Keyed stateful operators on applyInPandasWithState, snapshotted at batch barriers.

Spark commits every operator's state at the end of each micro-batch, after all its tasks
finished; after a crash and restart, state equals the state of the last committed batch and
the replayed batch produces the same output. See docs/stateful-operators.md for the per-key
contracts.
"""

from eospack.stateful_ops.base import DEFAULT_KEY_GROUPS, Clock, StatefulOperator
from eospack.stateful_ops.errors import (
    OperatorDefinitionError,
    StatefulOpsError,
    StateSchemaMismatchError,
)
from eospack.stateful_ops.initial_state import InitialState
from eospack.stateful_ops.operators.deduplicate import Deduplicate, deduplicate
from eospack.stateful_ops.operators.running_aggregate import RunningAggregate, running_aggregate
from eospack.stateful_ops.operators.running_count import RunningCount, running_count
from eospack.stateful_ops.operators.sessionize import Sessionize, sessionize
from eospack.stateful_ops.state_reader import read_state
from eospack.stateful_ops.state_store import configure_state_store

__all__ = [
    "DEFAULT_KEY_GROUPS",
    "Clock",
    "Deduplicate",
    "InitialState",
    "OperatorDefinitionError",
    "RunningAggregate",
    "RunningCount",
    "Sessionize",
    "StateSchemaMismatchError",
    "StatefulOperator",
    "StatefulOpsError",
    "configure_state_store",
    "deduplicate",
    "read_state",
    "running_aggregate",
    "running_count",
    "sessionize",
]
