"""One exception class per way the Kafka source (replayable-kafka) and sink (2pc-kafka) can fail.

Every message is one line that names the option (or topic-partition) at fault and the fix.
None of them ever carries a secret: option values are only quoted for non-secret options.
The sink's option errors are ``KafkaSinkOptionError`` (``sink_options``), its ledger errors
``LedgerError`` (``ledger``), a decided transaction the broker aborted
``DecidedPieceLostError`` (``eospack.commit_protocols.resource``).
"""

from __future__ import annotations

import logging

from eospack.errors import EospackError

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
