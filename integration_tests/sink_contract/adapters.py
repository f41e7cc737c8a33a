"""Every two-phase-commit sink's contract adapter, one module per sink (the shape of Flink's
``KafkaSinkExternalContext``): ``base.py`` (what an adapter is, and why adapters look the
way they do), ``jdbc_adapters.py``, ``mariadb_adapter.py``, ``s3_adapter.py``,
``kafka_adapter.py`` and ``production_kafka_adapters.py``. Adding a sink is one module and
one line in ``ADAPTERS``. The names the harness and the tests import are re-exported here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from integration_tests.sink_contract.base import (
    AT_LEAST_ONCE,
    EXACTLY_ONCE,
    BoundSink,
    CallFaults,
    DocumentedOption,
    OptionChange,
    Options,
    Rows,
    SinkAdapter,
    _switch,
    hole,
)
from integration_tests.sink_contract.jdbc_adapters import (
    JdbcPrepared,
    JdbcSink,
    JdbcSqlite,
    JdbcStaging,
    PostgresSink,
    PreparedPostgresSink,
    SqliteSink,
    StagingPostgresSink,
)
from integration_tests.sink_contract.kafka_adapter import Kafka, KafkaSink
from integration_tests.sink_contract.mariadb_adapter import (
    MariaDBAdapter,
    MariaDBSink,
    MariaDBXAAdapter,
)
from integration_tests.sink_contract.production_kafka_adapters import (
    KafkaCluster,
    KafkaClusterSink,
    KafkaSecured,
    SecuredKafkaSink,
)
from integration_tests.sink_contract.s3_adapter import S3, Bucket, S3Sink, named_upload_ids

__all__ = [
    "ADAPTERS",
    "AT_LEAST_ONCE",
    "EXACTLY_ONCE",
    "PRODUCTION_ADAPTERS",
    "S3",
    "BoundSink",
    "Bucket",
    "CallFaults",
    "DocumentedOption",
    "JdbcPrepared",
    "JdbcSink",
    "JdbcSqlite",
    "JdbcStaging",
    "Kafka",
    "KafkaCluster",
    "KafkaClusterSink",
    "KafkaSecured",
    "KafkaSink",
    "MariaDBAdapter",
    "MariaDBSink",
    "MariaDBXAAdapter",
    "OptionChange",
    "Options",
    "PostgresSink",
    "PreparedPostgresSink",
    "Rows",
    "S3Sink",
    "SecuredKafkaSink",
    "SinkAdapter",
    "SqliteSink",
    "StagingPostgresSink",
    "_switch",
    "hole",
    "named_upload_ids",
    "sink_params",
]

ADAPTERS: dict[str, type[SinkAdapter]] = {
    adapter.name: adapter
    for adapter in (
        JdbcPrepared,
        JdbcStaging,
        JdbcSqlite,
        MariaDBAdapter,
        MariaDBXAAdapter,
        S3,
        Kafka,
    )
}
"""Every two-phase-commit sink; adding a sink means adding its adapter here."""


PRODUCTION_ADAPTERS: dict[str, type[SinkAdapter]] = {
    adapter.name: adapter for adapter in (KafkaCluster, KafkaSecured)
}
"""2pc-kafka on Kafka as production runs it: collected only by the ``production_kafka``
module (``test_sink_contract_production_kafka.py``), never by ``make test``."""


def sink_params(case: str, adapters: Mapping[str, type[SinkAdapter]] = ADAPTERS) -> list[Any]:
    """One pytest parameter per adapter, with the adapter's mark for ``case`` if any."""
    return [
        pytest.param(name, marks=[adapter.marks[case]] if case in adapter.marks else [], id=name)
        for name, adapter in adapters.items()
    ]
