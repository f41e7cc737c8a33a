"""Keyed stateful operators on applyInPandasWithState, snapshotted at batch barriers.

Spark commits every operator's state at the end of each micro-batch, after all its tasks
finished; after a crash and restart, state equals the state of the last committed batch and
the replayed batch produces the same output. See docs/stateful-operators.md for the per-key
contracts.
"""

from .base import (
    DEFAULT_KEY_GROUPS,
    FIRED_TIMER_COLUMN,
    Clock,
    StatefulOperator,
    delete_timer,
    register_timer,
)
from .errors import (
    OperatorDefinitionError,
    StatefulOpsError,
    StateSchemaMismatchError,
)
from .initial_state import InitialState
from .operators.deduplicate import Deduplicate, deduplicate
from .operators.running_aggregate import RunningAggregate, running_aggregate
from .operators.running_count import RunningCount, running_count
from .operators.sessionize import Sessionize, sessionize
from .state_codec import TIMER_COLUMN
from .state_reader import read_state
from .state_store import configure_state_store

__all__ = [
    "DEFAULT_KEY_GROUPS",
    "FIRED_TIMER_COLUMN",
    "TIMER_COLUMN",
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
    "delete_timer",
    "read_state",
    "register_timer",
    "running_aggregate",
    "running_count",
    "sessionize",
]
