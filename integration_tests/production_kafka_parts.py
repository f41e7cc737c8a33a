"""Shared by the tests on Kafka as production runs it (``production_kafka``): topics placed
on chosen leaders of the 3-node cluster, kills of the node that serves something while a
query runs, and the leftover check (no Ongoing transaction under a prefix).

Why placement: with every leader on the first bootstrap address a client that never follows
a leader change passes by accident; a topic created with an explicit replica assignment has
its preferred leaders where the test says, and ``place_topic`` waits until they lead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from eospack.lab.testing import wait_until

LEADER_CHANGE_SECONDS = 60.0
"""How long a test waits for the cluster to elect a new leader or readmit a restarted node
(broker.session.timeout.ms is 3 s on the test cluster: a new leader in a few seconds)."""


def place_topic(cluster: Any, topic: str, leaders: Sequence[int]) -> None:
    """Create ``topic`` with one partition per entry of ``leaders``, partition p led by node
    ``leaders[p]`` (replicas on every node, the leader first), and wait until it leads."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    nodes = sorted(cluster.nodes)
    assignments = {
        partition: [leader, *[node for node in nodes if node != leader]]
        for partition, leader in enumerate(leaders)
    }
    admin = KafkaAdminClient(
        bootstrap_servers=cluster.endpoint.bootstrap_servers, request_timeout_ms=10_000
    )
    try:
        admin.create_topics([NewTopic(topic, replica_assignments=assignments)])
    finally:
        admin.close()
    for partition, leader in enumerate(leaders):
        wait_for_leader(cluster, topic, partition, lambda node, leader=leader: node == leader)


def wait_for_leader(cluster: Any, topic: str, partition: int, wanted: Any) -> int:
    """Wait until ``wanted(leader)`` holds for ``topic``-``partition``; return the leader."""

    def current() -> int | None:
        try:
            leader = int(cluster.leader(topic, partition))
        except KeyError:  # a topic just created: its partitions are not described yet
            return None
        return leader if leader >= 0 and wanted(leader) else None

    found = wait_until(current, LEADER_CHANGE_SECONDS, f"a leader of {topic}-{partition}")
    return int(found)


def kill_and_await_new_leader(cluster: Any, topic: str, partition: int) -> int:
    """SIGKILL the node leading ``topic``-``partition`` now and wait until another node
    leads it; return the killed node (``cluster.start`` it again)."""
    killed = int(cluster.leader(topic, partition))
    cluster.kill(killed)
    wait_for_leader(cluster, topic, partition, lambda node: node != killed)
    return killed


def bootstrap_addresses(cluster: Any, order: Sequence[int]) -> str:
    """The cluster's bootstrap list with its nodes in ``order`` (node ids)."""
    return ",".join(f"127.0.0.1:{cluster.node(node).port}" for node in order)


def ongoing_transactions(
    bootstrap_servers: str, prefixes: Sequence[str], client: Mapping[str, Any] | None = None
) -> list[str]:
    """The transactional ids starting with one of ``prefixes`` whose transaction is open
    (Ongoing) on the cluster, sorted: what a finished query must not leave behind."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(
        bootstrap_servers=bootstrap_servers, request_timeout_ms=10_000, **dict(client or {})
    )
    try:
        listed = admin.list_transactions(state_filters=["Ongoing"])
    finally:
        admin.close()
    return sorted(
        entry.transactional_id
        for entries in listed.values()
        for entry in entries
        if entry.transactional_id.startswith(tuple(prefixes))
    )
