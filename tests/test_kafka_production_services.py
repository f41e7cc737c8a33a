"""``eospack services up --kafka-brokers N --kafka-security sasl_ssl``: the options parse, and
what cannot be started is refused before anything starts (issue 37)."""

from __future__ import annotations

import pytest

from eospack.cli import build_parser
from eospack.lab.services import ServiceStartError
from eospack.lab.services.kafka_cluster import start_production_kafka


def test_services_up_takes_the_number_of_brokers_and_the_security() -> None:
    arguments = build_parser().parse_args(
        ["services", "up", "--kafka-brokers", "3", "--kafka-security", "sasl_ssl"]
    )
    assert (arguments.kafka_brokers, arguments.kafka_security) == (3, "sasl_ssl")
    defaults = build_parser().parse_args(["services", "up"])
    assert (defaults.kafka_brokers, defaults.kafka_security) == (1, "none")


def test_a_secured_cluster_of_several_brokers_is_refused_before_anything_starts() -> None:
    with pytest.raises(ServiceStartError, match="--kafka-security sasl_ssl runs one broker"):
        start_production_kafka(3, "sasl_ssl")


def test_a_cluster_of_no_broker_is_refused() -> None:
    with pytest.raises(ServiceStartError, match="needs at least one broker, not 0"):
        start_production_kafka(0, "none")
