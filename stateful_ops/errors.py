"""Errors raised by stateful_ops: one class per failure kind, all subclasses of StatefulOpsError."""

from __future__ import annotations

from eospack.core.errors import EospackError


class StatefulOpsError(EospackError):
    """Base class of every error raised by stateful_ops."""


class OperatorDefinitionError(StatefulOpsError, ValueError):
    """An operator was defined with bad input (missing column, bad aggregate, ttl, watermark).

    Raised on the driver when the operator is applied to a DataFrame, before any query starts.
    """


class StateSchemaMismatchError(StatefulOpsError):
    """A stored state row cannot be decoded by this operator (it changed incompatibly).

    Raised inside the stateful function when a query restarts from a checkpoint written by
    another operator, another state format version or another state schema.
    """
