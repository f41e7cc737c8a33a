"""Choose the state store: RocksDB with changelog checkpointing, or Spark's default store.

The default (HDFS-backed) store keeps every partition's state in JVM memory and writes a
delta file per partition per batch plus periodic snapshots. RocksDB keeps state off-heap
and on local disk; with changelog checkpointing each batch uploads only the changed
records (Spark's incremental checkpoint) and materialises full snapshots in the background.
The provider is part of a checkpoint: set it before the query first starts and never change
it for that checkpoint location.
"""

from __future__ import annotations

from typing import TypeVar

from pyspark.sql import SparkSession

from .errors import OperatorDefinitionError

PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
CHANGELOG_CONF = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
PROVIDERS = {
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
}

Target = TypeVar("Target", SparkSession, SparkSession.Builder)


def state_store_conf(provider: str = "rocksdb", changelog: bool = True) -> dict[str, str]:
    """The Spark settings for ``provider`` ("rocksdb" or "hdfs", Spark's default)."""
    if provider not in PROVIDERS:
        raise OperatorDefinitionError(
            f"configure_state_store: provider={provider!r}; use one of {', '.join(PROVIDERS)}"
        )
    if changelog and provider != "rocksdb":
        raise OperatorDefinitionError(
            "configure_state_store: changelog checkpointing needs provider='rocksdb';"
            " pass changelog=False with provider='hdfs'"
        )
    return {PROVIDER_CONF: PROVIDERS[provider], CHANGELOG_CONF: str(changelog).lower()}


def configure_state_store(
    builder_or_session: Target, provider: str = "rocksdb", changelog: bool = True
) -> Target:
    """Set the state store on a SparkSession.Builder or a running SparkSession.

    Returns its argument. On a running session the setting applies to queries started
    afterwards on new checkpoints; a query restarted from a checkpoint keeps its provider.
    """
    settings = state_store_conf(provider, changelog)
    if isinstance(builder_or_session, SparkSession):
        for key, value in settings.items():
            builder_or_session.conf.set(key, value)
        return builder_or_session
    builder = builder_or_session
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder
