"""Refuse, before a query starts, a restart its checkpoint's state cannot take: ttl (or
timers) turned on or off for one checkpoint.

Why: an operator keeps a Spark timeout only with ttl or timers (or its own expiry), and
Spark stores that with the state: the key-groups layout's ``applyInPandasWithState`` row
gains ``timeoutTimestamp``, the segment log's ``transformWithStateInPandas`` records its
time mode. Turning ttl on or off therefore fails the restarted query's first batch while
Spark plans it, before any of this package's code runs, with Spark's own errors:
``STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE`` (multi-line, advising to switch Spark's schema
check off, after which the state fails to load) or ``STATE_STORE_INVALID_CONFIG_AFTER_RESTART``
("Cannot change timeMode"), neither naming ttl. The operator cannot know its checkpoint
when it is defined unless told: given ``checkpoint_location`` (or an ``initial_state``
from ``RestoredCheckpoint``, which knows it), it reads what Spark recorded of its state
(Spark's operator metadata and the state schema: files, no state is read) and refuses in
one line naming ttl and the fix, before the query starts.

Guarantee: with the checkpoint known, a checkpoint whose last committed batch holds this
operator's state with a timeout is refused for an operator without one, and the other way
round; a fresh checkpoint, one without committed batches, and one whose operator cannot be
told apart (several stateful operators, this one unnamed) are not checked (Spark's error
then remains). A switch of layout is left to Spark's own one-line refusal.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from pyspark.sql import SparkSession

from eospack.core.checkpoint_files import checkpoint_files

from .errors import StateSchemaMismatchError
from .initial_state import operator_id_of

if TYPE_CHECKING:
    from .base import StatefulOperator

KEY_GROUPS_OPERATOR = "applyInPandasWithState"
SEGMENT_LOG_OPERATOR = "transformWithStateInPandasExec"
TIMEOUT_FIELD = "timeoutTimestamp"
"""What Spark adds to an ``applyInPandasWithState`` state row kept with a timeout."""


def stored_timeout(
    spark: SparkSession,
    checkpoint_location: str,
    operator_id: int | None = None,
    operator_name: str | None = None,
) -> tuple[str, bool] | None:
    """The layout and whether Spark keeps a timeout with the state of this package's
    operator in ``checkpoint_location`` (after its last committed batch): the operator
    ``operator_id``, else the checkpoint's only stateful operator of this package, else
    the one that ``operator_name`` names. None when that is unknown: no committed batch, no
    such operator, or several with none chosen."""
    files = checkpoint_files(checkpoint_location, spark)
    if not any(name.isdigit() for name in files.names("commits")):
        return None
    try:
        operators = {
            int(row["operatorId"]): (str(row["operatorName"]), row["operatorProperties"])
            for row in spark.read.format("state-metadata").load(checkpoint_location).collect()
            if str(row["operatorName"]) in (KEY_GROUPS_OPERATOR, SEGMENT_LOG_OPERATOR)
        }
    except Exception:  # no operator metadata (a checkpoint of an older Spark): not checked
        return None
    if operator_id is None and len(operators) == 1:
        operator_id = next(iter(operators))
    elif operator_id is None and operator_name is not None:
        # several (Spark's unsupportedOperationCheck off): found by the settings rows' name,
        # a scan of each operator's state, paid only then
        operator_id = operator_id_of(spark, checkpoint_location, operator_name)
    if operator_id is None or operator_id not in operators:
        return None
    kind, properties = operators[operator_id]
    if kind == SEGMENT_LOG_OPERATOR:
        time_mode = json.loads(properties or "{}").get("timeMode")
        if time_mode is None:
            return None
        return "segment-log", time_mode != "NoTime"
    try:
        schema = (
            spark.read.format("statestore")
            .option("operatorId", operator_id)
            .load(checkpoint_location)
            .schema
        )
    except Exception:  # its schema cannot be read: left to Spark's own check
        return None
    value = schema["value"].dataType
    names = getattr(value, "names", [])
    return "key-groups", TIMEOUT_FIELD in names


def refuse_timeout_switch(
    spark: SparkSession,
    operator: StatefulOperator,
    checkpoint_location: str,
    operator_id: int | None = None,
) -> None:
    """Raise ``StateSchemaMismatchError`` (one line naming ttl and the fix) when
    ``operator`` turns ttl or timers on or off for ``checkpoint_location``'s state (see the
    module); otherwise, or when that state is unknown, return."""
    stored = stored_timeout(spark, checkpoint_location, operator_id, operator.operator_name)
    if stored is None:
        return
    layout, had_timeout = stored
    if layout != operator.state_layout:
        return  # Spark refuses a switch of layout in one line of its own
    has_timeout = operator.timeout != "none"
    if had_timeout == has_timeout:
        return
    if had_timeout:
        raise StateSchemaMismatchError(
            f"{operator.name}: ttl (or timers) was turned off for checkpoint"
            f" {checkpoint_location}, whose state Spark keeps with a timeout, which it cannot"
            " load without one: keep ttl= (and timers=) as the checkpoint was written, or"
            " take a savepoint (eospack savepoint create) and restore it into the query"
            " without ttl"
        )
    raise StateSchemaMismatchError(
        f"{operator.name}: ttl (or timers) was turned on for checkpoint"
        f" {checkpoint_location}, whose state Spark keeps without a timeout, which it cannot"
        " load with one: leave ttl (and timers) unset for this checkpoint, or take a"
        " savepoint (eospack savepoint create) and restore it into the query with ttl"
    )
