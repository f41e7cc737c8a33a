"""Auto-registers ``format("2pc-kafka")`` with Spark (found by its module name)."""

from eospack.connectors.kafka.sink.data_source import TwoPhaseKafkaDataSource as DefaultSource

__all__ = ["DefaultSource"]
