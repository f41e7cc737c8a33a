"""Pure parts of the Kafka connectors' least-privilege handling (issue 37): fitting the
transaction timeout to what a broker accepts, and the one-line authentication error."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kafka import errors as kafka_errors

from eospack.connectors.kafka.client import cluster_configs
from eospack.connectors.kafka.client.authentication import authentication_error, uses_sasl


class _Manager:
    """Answers the probe's InitProducerId as a broker with ``maximum_ms`` would."""

    def __init__(self, maximum_ms: int) -> None:
        self.maximum_ms = maximum_ms
        self.asked: list[int] = []

    def run(self, _: Callable[..., Any], __: Any, timeout_ms: int, ___: float) -> bool:
        self.asked.append(timeout_ms)
        return timeout_ms <= self.maximum_ms


class _Admin:
    def __init__(self, maximum_ms: int) -> None:
        self._manager = _Manager(maximum_ms)


@pytest.mark.parametrize(
    ("maximum_ms", "wanted_ms", "fitted_ms"),
    [
        (300_000, 900_000, 300_000),
        (900_000, 900_000, 900_000),
        (3_600_000, 900_000, 900_000),
        (300_000, 60_000, 60_000),
        (299_500, 900_000, 299_000),
        (1_000, 900_000, 1_000),
        (999, 900_000, None),
    ],
)
def test_the_timeout_is_fitted_to_the_largest_whole_second_a_broker_accepts(
    maximum_ms: int, wanted_ms: int, fitted_ms: int | None
) -> None:
    admin = _Admin(maximum_ms)
    assert cluster_configs.fit_transaction_timeout(admin, wanted_ms) == fitted_ms  # type: ignore[arg-type]
    assert len(admin._manager.asked) <= 12


def test_an_authentication_error_names_who_where_and_how_but_never_the_password() -> None:
    config = {
        "bootstrap_servers": ["b1:9093", "b2:9093"],
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "app",
        "sasl_plain_password": "s3cret-pw",
    }
    refusal = kafka_errors.SaslAuthenticationFailedError(
        "SaslAuthenticationFailedError: Authentication failed for s3cret-pw."
    )
    text = str(authentication_error(config, refusal, "2pc-kafka"))
    assert text == (
        "2pc-kafka: Kafka at b1:9093,b2:9093 (option kafka.bootstrap.servers) refused"
        " authentication: SASL SCRAM-SHA-512 as user 'app' over SASL_SSL failed"
        " (Authentication failed for ***): check kafka.sasl.jaas.config's username and"
        " password and kafka.sasl.mechanism against the listener's"
    )
    assert "\n" not in text


def test_only_sasl_protocols_are_probed() -> None:
    assert uses_sasl({"security_protocol": "SASL_SSL"})
    assert uses_sasl({"security_protocol": "sasl_plaintext"})
    assert not uses_sasl({"security_protocol": "SSL"})
    assert not uses_sasl({})
