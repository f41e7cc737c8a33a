"""What 2pc-kafka asks a cluster about its settings, and what it does when it may not ask.

An application user's grant usually has no DESCRIBE_CONFIGS (on the cluster, or on its
topics), and kafka-python does not raise when the broker denies DescribeConfigs: it
answers with an empty set of settings, indistinguishable from "not set". So
``describe_configs`` here reads each resource's error code and says *denied* apart from
*empty*.

``fit_transaction_timeout``: when the brokers' ``transaction.max.timeout.ms`` cannot be
read, the transaction timeout is fitted by asking a broker directly: InitProducerId with
the wanted timeout on a probe transactional id (``PROBE_TRANSACTIONAL_ID``, inside the
``eospack-`` prefix the sink's grant covers); a refusal (INVALID_TRANSACTION_TIMEOUT,
which names no maximum) is followed by a search, to the second, for the largest timeout
the broker accepts. About ten round trips, once per driver process; the probe id never
begins a transaction (only its epoch moves).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kafka import KafkaAdminClient
from kafka import errors as kafka_errors
from kafka.admin import ConfigResource

from ..errors import TransactionTimeoutProbeError

PROBE_TRANSACTIONAL_ID = "eospack-transaction-timeout-probe"
PROBE_DEADLINE_SECONDS = 30.0


@dataclass(frozen=True)
class DescribedConfigs:
    """One resource's settings (name to value), or why the broker gave none."""

    values: Mapping[str, str | None]
    error: type[kafka_errors.KafkaError] | None = None

    @property
    def denied(self) -> bool:
        return self.error is not None and issubclass(
            self.error,
            (
                kafka_errors.ClusterAuthorizationFailedError,
                kafka_errors.TopicAuthorizationFailedError,
            ),
        )


def describe_configs(
    admin: KafkaAdminClient, resources: Iterable[ConfigResource]
) -> dict[tuple[str, str], DescribedConfigs]:
    """DescribeConfigs of ``resources``, keyed by (resource type name lower-case, resource
    name), each with its error code read (kafka-python's own call drops it). Broker
    resources are asked of that broker, others of any."""
    wanted = list(resources)

    async def ask() -> list[Any]:
        responses = []
        for resource in wanted:
            request = admin._describe_configs_request([resource])
            node = None
            if resource.resource_type.name == "BROKER":
                node = int(resource.name)
            responses.append(await admin._manager.send(request, node_id=node))
        return responses

    described: dict[tuple[str, str], DescribedConfigs] = {}
    for response in admin._manager.run(ask):
        for result in response.results:
            from kafka.admin import ConfigResourceType

            kind = ConfigResourceType(result.resource_type).name.lower()
            error = kafka_errors.for_code(result.error_code)
            values = {entry.name: entry.value for entry in result.configs}
            described[(kind, result.resource_name)] = DescribedConfigs(
                values, None if error is kafka_errors.NoError else error
            )
    return described


def fit_transaction_timeout(admin: KafkaAdminClient, wanted_ms: int) -> int | None:
    """The largest transaction timeout up to ``wanted_ms`` (whole seconds below it) that
    the brokers accept, found by InitProducerId on ``PROBE_TRANSACTIONAL_ID``; None when
    the probe itself is not allowed or gets no answer (the caller keeps ``wanted_ms``)."""
    deadline = time.monotonic() + PROBE_DEADLINE_SECONDS

    def accepted(timeout_ms: int) -> bool:
        return bool(admin._manager.run(_init_producer_id, admin, timeout_ms, deadline))

    try:
        if accepted(wanted_ms):
            return wanted_ms
        low, high = 1, wanted_ms // 1000 - (wanted_ms % 1000 == 0)
        if high < 1 or not accepted(1000):
            return None
        while low < high:  # low is accepted, above high is refused (seconds)
            middle = (low + high + 1) // 2
            if accepted(middle * 1000):
                low = middle
            else:
                high = middle - 1
        return low * 1000
    except (kafka_errors.KafkaError, TransactionTimeoutProbeError):
        return None


async def _init_producer_id(admin: KafkaAdminClient, timeout_ms: int, deadline: float) -> bool:
    """InitProducerId with ``timeout_ms`` on the probe id: True if accepted, False if the
    timeout is refused; retried while the coordinator asks for it, until ``deadline``."""
    from kafka.protocol.metadata import CoordinatorType
    from kafka.protocol.producer.transaction import InitProducerIdRequest

    manager = admin._manager
    key = (CoordinatorType.TRANSACTION, PROBE_TRANSACTIONAL_ID)
    retried = (
        kafka_errors.ConcurrentTransactionsError,
        kafka_errors.CoordinatorLoadInProgressError,
        kafka_errors.NotCoordinatorError,
        kafka_errors.CoordinatorNotAvailableError,
    )
    while time.monotonic() < deadline:
        try:
            coordinator = await admin._find_coordinator_id(
                PROBE_TRANSACTIONAL_ID, CoordinatorType.TRANSACTION
            )
            request = InitProducerIdRequest(
                transactional_id=PROBE_TRANSACTIONAL_ID,
                transaction_timeout_ms=timeout_ms,
                producer_id=-1,
                producer_epoch=-1,
                max_version=4,
            )
            response = await manager.send(request, node_id=coordinator)
        except kafka_errors.KafkaError as failure:
            # No coordinator yet (the transaction state topic is created on first use), a
            # node not ready: asked again; anything else is an answer.
            if not (failure.retriable or isinstance(failure, retried)):
                raise
            manager.cluster._coordinators.pop(key, None)
            await admin._net.sleep(0.1)
            continue
        error = kafka_errors.for_code(response.error_code)
        if error is kafka_errors.NoError:
            return True
        if error is kafka_errors.InvalidTransactionTimeoutError:
            return False
        if not issubclass(error, retried):
            raise TransactionTimeoutProbeError(error.__name__)
        manager.cluster._coordinators.pop(key, None)
        await admin._net.sleep(0.05)
    raise TransactionTimeoutProbeError("no answer")
