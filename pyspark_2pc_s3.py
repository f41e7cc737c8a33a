"""Auto-registers ``format("2pc-s3")`` with Spark (found by its module name)."""

from eospack.connectors.s3.sink import TwoPhaseS3DataSource as DefaultSource

__all__ = ["DefaultSource"]
