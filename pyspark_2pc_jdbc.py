"""Auto-registers ``format("2pc-jdbc")`` with Spark (found by its module name)."""

from eospack.connectors.jdbc.sink import TwoPhaseJdbcDataSource as DefaultSource

__all__ = ["DefaultSource"]
