"""2pc-kafka's adapters on Kafka as production runs it (a 3-node cluster, a SASL_SSL broker
with a least-privilege user): only the production_kafka lane collects them."""

from __future__ import annotations

from typing import Any

from integration_tests.sink_contract.base import (
    Options,
)
from integration_tests.sink_contract.kafka_adapter import Kafka, KafkaSink

# 2pc-kafka on Kafka as production runs it (issue 37) ---------------------------------


class KafkaClusterSink(KafkaSink):
    """2pc-kafka on the 3-node cluster (RF 3, min ISR 2). The output topic's two
    partitions are led by nodes 2 and 3, none by node 1, the first bootstrap address: a
    client that only ever talks to the first address passes nothing here by accident. The
    ledger topic is the sink's own (replicated 3 times by ``ensure_ledger_topic``)."""

    broker_fixture = "kafka_cluster"

    def create_output_topic(self) -> None:
        from integration_tests.production_kafka_parts import place_topic

        place_topic(self.kafka, self.topic, OUTPUT_LEADERS)

    def ledger_transactional_id(self, sink_id: str) -> str:
        from eospack.connectors.kafka.sink.ledger import LEDGER_ID_PREFIX

        return f"{LEDGER_ID_PREFIX}{sink_id}"


OUTPUT_LEADERS = (2, 3)
"""Partition p of a cluster adapter's output topic is led by node OUTPUT_LEADERS[p]."""


class SecuredKafkaSink(KafkaSink):
    """2pc-kafka on the SASL_SSL broker as user ``app`` with only the documented grant:
    topics ``app.*`` (the output and the ledger topic, which the sink creates itself:
    CREATE is in the grant), TransactionalIds ``eospack-*`` (pieces and the ledger). The
    test reads the end state as the super user ``admin``, who sees every transaction."""

    broker_fixture = "secured_kafka"

    def topic_name(self, name: str) -> str:
        from eospack.lab.services.kafka_cluster import APP_TOPIC_PREFIX

        return f"{APP_TOPIC_PREFIX}{name}"

    def create_output_topic(self) -> None:
        from kafka import KafkaConsumer
        from kafka.admin import NewTopic

        from eospack.lab.services.kafka_cluster import ADMIN_USER
        from eospack.lab.testing import wait_until

        admin = self.kafka.admin_client(ADMIN_USER)
        try:
            admin.create_topics([NewTopic(self.topic, num_partitions=2, replication_factor=1)])
        finally:
            admin.close()
        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, **self.client())
        try:
            wait_until(
                lambda: len(consumer.partitions_for_topic(self.topic) or ()) == 2,
                30,
                f"the partitions of {self.topic}",
            )
        finally:
            consumer.close()

    def client(self) -> dict[str, Any]:
        from eospack.lab.services.kafka_cluster import ADMIN_USER

        return dict(self.kafka.client_config(ADMIN_USER))

    def base_options(self) -> Options:
        return {**super().base_options(), **self.kafka.client_options("app")}


class KafkaCluster(Kafka):
    """The 2pc-kafka adapter on the 3-node cluster (``production_kafka`` only)."""

    name = "kafka-cluster"
    fixtures = ("kafka_cluster",)
    bound = KafkaClusterSink


class KafkaSecured(Kafka):
    """The 2pc-kafka adapter on the SASL_SSL broker, least privilege (``production_kafka``
    only). Its documented options leave out ``kafka.security.protocol=PLAINTEXT``, which
    this broker refuses."""

    name = "kafka-secured"
    fixtures = ("secured_kafka",)
    documented_options = tuple(
        option for option in Kafka.documented_options if option.name != "kafka.security.protocol"
    )
    bound = SecuredKafkaSink
