"""One exception class per way the replayable-kafka source can fail.

Every message is one line that names the option (or topic-partition) at fault and the fix.
None of them ever carries a secret: option values are only quoted for non-secret options.
"""

from __future__ import annotations

from eospack.errors import EospackError


class KafkaSourceOptionError(EospackError, ValueError):
    """An option is missing, malformed or inconsistent; raised before any data moves."""


class KafkaBrokerUnreachableError(EospackError, ConnectionError):
    """The bootstrap servers did not answer within the metadata timeout."""


class KafkaDataLossError(EospackError, RuntimeError):
    """Offsets that a batch must read are gone (retention, deleted topic, shrunk partition)."""


class KafkaReadTimeoutError(EospackError, TimeoutError):
    """A partition made no progress towards its end offset within kafkaConsumer.pollTimeoutMs."""


class KafkaCodecMissingError(EospackError, RuntimeError):
    """Records are compressed with a codec whose Python package is missing on an executor."""
