"""Which cluster a 2pc-kafka query writes to, as the driver asks it once per process: the
cluster's id (part of the derived sink id) and its transaction timeout maximum.

Both the data source (at query start) and the 2PC resource (``inspect_sink``, for tools
that inspect a sink) need ``derived_sink_id``; it lives here, below both, so neither
imports the other for it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from kafka import errors as kafka_errors
from kafka.admin import ConfigResource, ConfigResourceType

from ....commit_protocols import derive_sink_id
from ..client.authentication import raise_if_refused
from ..client.cluster_configs import (
    describe_configs,
    fit_transaction_timeout,
)
from ..client.transactions import admin_client
from .options import (
    DEFAULT_TRANSACTION_TIMEOUT_MS,
    SINK_NAME,
    KafkaSinkOptions,
    client_config,
    parse_options,
)

BROKER_TIMEOUT_SETTING = "transaction.max.timeout.ms"
logger = logging.getLogger(__name__)


def derived_sink_id(query_id: str, options: Mapping[str, str]) -> str:
    """The sink id that a query of ``query_id`` writing with ``options`` uses: ``sinkId``
    if given, else derived from the query id and the target as the tasks derive it (the
    cluster's id is asked, so the cluster must be up). For tools that inspect a sink."""
    parsed = parse_options(options)
    if parsed.sink_id is not None:
        return parsed.sink_id
    resolved = replace(parsed, cluster_id=cluster_facts(parsed).cluster_id)
    return derive_sink_id(query_id, resolved.target)


@dataclass(frozen=True)
class ClusterFacts:
    cluster_id: str | None
    """None only for a broker that reports none (then the sorted bootstrap list stands in)."""
    transaction_max_timeout_ms: int | None
    """The brokers' ``transaction.max.timeout.ms`` (or, where it may not be read, the
    largest timeout up to the wanted one that a broker accepts); None when unknown."""


def cluster_facts(options: KafkaSinkOptions, fit_timeout: bool = False) -> ClusterFacts:
    """What the driver asks the cluster once per process: its id and its transaction
    timeout maximum (``fit_timeout``: probed where DescribeConfigs is denied, see
    ``cluster_configs``)."""
    wanted = options.transaction_timeout_ms if fit_timeout else None
    return _cluster_facts(options.bootstrap_servers, options.producer_params, wanted)


@functools.cache
def _cluster_facts(
    bootstrap_servers: str, producer_params: tuple[tuple[str, Any], ...], wanted_ms: int | None
) -> ClusterFacts:
    """Cached by the cluster, the client settings used to ask it and the timeout to fit; a
    raised error is not cached. A broker that refused the login raises
    ``KafkaAuthenticationError``."""
    config = client_config(bootstrap_servers, producer_params)
    raise_if_refused(config, SINK_NAME)  # first: kafka-python retries a refused login 30 s
    try:
        admin = admin_client(config)
    except (kafka_errors.KafkaTimeoutError, kafka_errors.KafkaConnectionError):
        raise_if_refused(config, SINK_NAME)
        raise
    maximum: int | None = None
    try:
        cluster = admin.describe_cluster()
        broker = str(cluster["brokers"][0]["broker_id"])
        resource = ConfigResource(ConfigResourceType.BROKER, broker, [BROKER_TIMEOUT_SETTING])
        why = None
        try:
            described = describe_configs(admin, [resource]).get(("broker", broker))
            if described is not None and described.error is not None:
                why = f"DescribeConfigs refused: {described.error.__name__}"
            elif described is not None and described.values.get(BROKER_TIMEOUT_SETTING):
                maximum = int(str(described.values[BROKER_TIMEOUT_SETTING]))
            else:
                why = "not in the answer"
        except kafka_errors.KafkaError as error:
            why = type(error).__name__
        if maximum is None and wanted_ms is not None:
            maximum = fit_transaction_timeout(admin, wanted_ms)
            logger.warning(
                "2pc-kafka could not read the brokers' %s (%s; DESCRIBE_CONFIGS on the"
                " cluster allows it): %s",
                BROKER_TIMEOUT_SETTING,
                why,
                f"a broker accepts a transaction timeout of {maximum} ms"
                if maximum is not None
                else f"asking a broker failed too, using {wanted_ms} ms",
            )
        elif maximum is None:
            logger.warning(
                "2pc-kafka could not read the brokers' %s (%s): using %d ms",
                BROKER_TIMEOUT_SETTING,
                why,
                DEFAULT_TRANSACTION_TIMEOUT_MS,
            )
    finally:
        admin.close()
    return ClusterFacts(cluster.get("cluster_id") or None, maximum)
