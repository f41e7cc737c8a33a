"""The 3-broker Apache Kafka cluster the services start (``kafka_cluster``): RF 3 and min ISR
2 by default, the transaction state log likewise, and a node that is SIGKILLed and
restarted on its ports and log directory rejoins with its data. What tests of the
connectors on several brokers stand on (``make test-kafka-production``)."""

from __future__ import annotations

from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import ConfigResource, ConfigResourceType, NewTopic

from eospack.lab.services.kafka_tools import read_all
from eospack.lab.testing import wait_until

pytestmark = pytest.mark.production_kafka


def admin_of(cluster: Any) -> KafkaAdminClient:
    return KafkaAdminClient(
        bootstrap_servers=cluster.endpoint.bootstrap_servers, request_timeout_ms=10_000
    )


def in_sync_replicas(cluster: Any, topic: str) -> list[int]:
    return cluster.in_sync_replicas(topic)


def test_new_topics_and_the_transaction_log_are_replicated_three_times_with_min_isr_2(
    kafka_cluster: Any, unique_name: str
) -> None:
    admin = admin_of(kafka_cluster)
    try:
        assert sorted(b["broker_id"] for b in admin.describe_cluster()["brokers"]) == [1, 2, 3]
        admin.create_topics([NewTopic(unique_name, num_partitions=1, replication_factor=-1)])
        wait_until(
            lambda: in_sync_replicas(kafka_cluster, unique_name) == [1, 2, 3], 30, "3 in sync"
        )
        described = admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, unique_name, ["min.insync.replicas"])],
            config_filter="all",
        )
        assert described["topic"][unique_name]["min.insync.replicas"]["value"] == "2"
        producer = KafkaProducer(
            bootstrap_servers=kafka_cluster.endpoint.bootstrap_servers,
            transactional_id=f"eospack-{unique_name}",
        )
        try:
            producer.init_transactions()  # creates __transaction_state
        finally:
            producer.close(timeout=5)
        (state,) = admin.describe_topics(["__transaction_state"])
        assert {len(p["replica_nodes"]) for p in state["partitions"]} == {3}
        broker = admin.describe_configs(
            [ConfigResource(ConfigResourceType.BROKER, "1", ["transaction.state.log.min.isr"])],
            config_filter="all",
        )
        assert broker["broker"]["1"]["transaction.state.log.min.isr"]["value"] == "2"
    finally:
        admin.close()


@pytest.mark.timeout(240)
def test_a_killed_leader_restarts_on_its_ports_and_rejoins_with_its_data(
    kafka_cluster: Any, unique_name: str
) -> None:
    servers = kafka_cluster.endpoint.bootstrap_servers
    admin = admin_of(kafka_cluster)
    try:
        admin.create_topics([NewTopic(unique_name, num_partitions=1, replication_factor=3)])
    finally:
        admin.close()
    wait_until(lambda: in_sync_replicas(kafka_cluster, unique_name) == [1, 2, 3], 30, "3 in sync")
    producer = KafkaProducer(bootstrap_servers=servers, acks="all")
    try:
        producer.send(unique_name, b"before").get(timeout=30)
        leader = kafka_cluster.leader(unique_name)
        port = kafka_cluster.node(leader).port
        kafka_cluster.kill(leader)
        assert not kafka_cluster.node(leader).alive
        # acks=all with min ISR 2: the two live replicas take the write.
        wait_until(lambda: kafka_cluster.leader(unique_name) != leader, 60, "a new leader")
        producer.send(unique_name, b"while down").get(timeout=60)
    finally:
        producer.close(timeout=5)
    kafka_cluster.start(leader)
    assert kafka_cluster.node(leader).alive and kafka_cluster.node(leader).port == port
    wait_until(
        lambda: in_sync_replicas(kafka_cluster, unique_name) == [1, 2, 3], 90, "back in sync"
    )
    values = [value for _, _, _, value in read_all(servers, unique_name)]
    assert values == [b"before", b"while down"]
