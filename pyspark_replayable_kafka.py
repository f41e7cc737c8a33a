"""Auto-registers ``format("replayable-kafka")`` with Spark (found by its module name)."""

from eospack.connectors.kafka.source.data_source import ReplayableKafkaDataSource as DefaultSource

__all__ = ["DefaultSource"]
