"""Every exception class of the Kafka source (replayable-kafka), the sink (2pc-kafka), their
shared client and record codec: one module, so that what a user may catch is in one place.

Every message is one line that names the option (or topic-partition) at fault and the fix.
None of them ever carries a secret: option values are only quoted for non-secret options.
A decided transaction the broker aborted is ``DecidedPieceLostError``
(``eospack.commit_protocols.resource``), shared by every two-phase-commit sink.
"""

from __future__ import annotations

import logging

from eospack.core.errors import EospackError

log = logging.getLogger(__name__)

FAIL_ON_DATA_LOSS_HINT = (
    "If this is expected (e.g. a deleted topic or retention), set the option"
    " failOnDataLoss=false to skip the lost offsets and continue"
)
SKIP_HINT = "continuing from the earliest available offset because failOnDataLoss=false"


class KafkaSourceOptionError(EospackError, ValueError):
    """An option is missing, malformed or inconsistent; raised before any data moves."""


class KafkaBrokerUnreachableError(EospackError, ConnectionError):
    """The bootstrap servers did not answer within the metadata timeout."""


class KafkaAuthenticationError(EospackError, ConnectionError):
    """A broker refused the SASL handshake or the credentials (``authentication``): the
    message names the mechanism, the user, the protocol and the servers, never a secret."""


class KafkaDataLossError(EospackError, RuntimeError):
    """Offsets that a batch must read are gone (retention, deleted topic, shrunk partition)."""


class KafkaReadTimeoutError(EospackError, TimeoutError):
    """A partition made no progress towards its end offset within kafkaConsumer.pollTimeoutMs."""


class KafkaCodecMissingError(EospackError, RuntimeError):
    """Records are compressed with a codec whose Python package is missing on an executor."""


class KafkaSendError(EospackError, RuntimeError):
    """The broker refused a record (or the producer could not deliver it): the task fails,
    and its transaction is aborted, so nothing of the task becomes visible; Spark retries
    the task, and the query fails with this message if the broker keeps refusing."""


class PreparedTransactionLostError(EospackError, RuntimeError):
    """A task's transaction ended before the driver decided the batch (the broker aborted it
    after ``transaction.timeout.ms``, or it was fenced): the batch is not decided, Spark's
    abort fences it, and a restart replays it whole."""


def report_data_loss(fail_on_data_loss: bool, message: str, skipped: int | None = None) -> None:
    """Raise KafkaDataLossError, or log a warning that counts the skipped offsets."""
    if fail_on_data_loss:
        raise KafkaDataLossError(f"{message}. {FAIL_ON_DATA_LOSS_HINT}")
    counted = f"; skipped {skipped} offsets" if skipped is not None else ""
    log.warning("%s%s; %s", message, counted, SKIP_HINT)


class TlsRefusal(EospackError):
    """The TLS handshake (or the first read after it) failed with the broker's or the
    client's verdict on a certificate: the reason, never a secret. Returned by the probe,
    never raised: ``authentication_error`` turns it into ``KafkaAuthenticationError``."""


class TransactionTimeoutProbeError(EospackError, RuntimeError):
    """The probe's InitProducerId was answered with neither yes nor a refused timeout."""


class LedgerError(EospackError, RuntimeError):
    """The ledger topic cannot be created, read or written."""


class LedgerFencedError(LedgerError):
    """Another process opened this sink's ledger after this one: this one may not write."""


class LedgerReadTimeoutError(LedgerError):
    """The ledger topic could not be read to its end in time (a writer's transaction held it
    back, or its leader was gone): the next attempt may get through."""

    transient = True
    """Retried by the commit's ride-through (``ride_through.is_transient``)."""


class CorruptRecordsError(EospackError, ValueError):
    """Record data that fails its CRC or cannot be parsed or decompressed."""


class TimestampOutOfRangeError(EospackError, OverflowError):
    """A record whose timestamp Spark's TimestampType cannot hold: the task fails, as with
    Spark's own Kafka source (its ``Math.multiplyExact`` overflows), rather than reading a
    wrapped or clamped instant."""


class RecordRefusedError(EospackError, ValueError):
    """A row that cannot become a record (too large, a partition the topic lacks)."""


class KafkaSinkOptionError(EospackError, ValueError):
    """An option of 2pc-kafka is missing, malformed or inconsistent."""


class TokenProviderNameError(EospackError, ValueError):
    """The option's name cannot be imported or names no token provider."""


class TransactionFencedError(EospackError, RuntimeError):
    """The transaction can no longer be committed: its epoch moved on (fenced or timed out)."""
