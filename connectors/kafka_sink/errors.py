"""Errors of 2pc-kafka's data path and commit that a user may see (each one line, with the fix).

Option errors are ``KafkaSinkOptionError`` (``options``), ledger errors ``LedgerError``
(``ledger``), a decided transaction the broker aborted ``DecidedPieceLostError``
(``eospack.commit_protocols.resource``).
"""

from __future__ import annotations

from eospack.errors import EospackError


class KafkaSendError(EospackError, RuntimeError):
    """The broker refused a record (or the producer could not deliver it): the task fails,
    and its transaction is aborted, so nothing of the task becomes visible; Spark retries
    the task, and the query fails with this message if the broker keeps refusing."""


class PreparedTransactionLostError(EospackError, RuntimeError):
    """A task's transaction ended before the driver decided the batch (the broker aborted it
    after ``transaction.timeout.ms``, or it was fenced): the batch is not decided, Spark's
    abort fences it, and a restart replays it whole."""
