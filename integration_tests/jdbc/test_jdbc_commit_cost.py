"""2pc-jdbc's commit at small batches (issue 28): what the driver keeps between commits.

The driver keeps its PostgreSQL connection between commits in the process Spark commits
from, so a commit pays no new server process and no cold catalog. These tests hold what
that may never change: a connection the server has ended is not handed out again (the
commit after it connects anew and succeeds), and one resource at a time holds it.
Without Spark: the resource is the driver's whole view of the database.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from eospack.commit_protocols import BatchDecision, PreparedPiece
from eospack.connectors.jdbc.options import parse_options
from eospack.connectors.jdbc.planning import plan_sink
from eospack.connectors.jdbc.resource import JdbcResource, open_resource
from eospack.lab.testing import wait_until

SCHEMA = StructType([StructField("id", LongType()), StructField("name", StringType())])


def resource_for(postgres: Any, table: str, protocol: str = "prepared") -> JdbcResource:
    options = parse_options(
        {
            "url": postgres.endpoint.jdbc_url,
            "user": postgres.endpoint.user,
            "dbtable": table,
            "protocol": protocol,
            "createTableIfNotExists": "true",
            "sinkId": table.replace("_", "")[-20:],
        }
    )
    return open_resource(options, plan_sink(options, SCHEMA))


def backend(resource: JdbcResource) -> int:
    return int(resource.connection.info.backend_pid)


@pytest.mark.timeout(120)
def test_the_driver_connection_is_kept_between_commits_and_lent_to_one_resource_at_a_time(
    postgres: Any, unique_name: str
) -> None:
    first = resource_for(postgres, unique_name)
    kept = backend(first)
    first.close()

    second = resource_for(postgres, unique_name)
    concurrent = resource_for(postgres, unique_name)
    assert backend(second) == kept
    assert backend(concurrent) != kept
    second.close()
    concurrent.close()


@pytest.mark.timeout(120)
def test_a_kept_connection_the_server_ended_is_replaced_and_the_next_commit_succeeds(
    postgres: Any, unique_name: str
) -> None:
    """The database ended the sink's sessions between two commits (an administrator, a
    pooler, a failover): the next commit must not fail on the dead connection."""
    first = resource_for(postgres, unique_name)
    ended = backend(first)
    first.close()
    with psycopg.connect(postgres.endpoint.url, autocommit=True) as connection:
        connection.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = %s", (ended,)
        )

    second = resource_for(postgres, unique_name)
    try:
        assert backend(second) != ended
        sink_id = second.options.sink_id
        assert sink_id is not None
        piece = PreparedPiece(sink_id, 0, 0, "0xrunx1", 1, {"piece": "none"})
        slot = second.record_decision(BatchDecision(sink_id, 0, (piece,)))
        assert slot.is_decided
        assert second.unfinished_decisions(sink_id) == [BatchDecision(sink_id, 0, (piece,))]
    finally:
        second.close()


@pytest.mark.timeout(120)
def test_a_connection_left_inside_a_transaction_is_not_kept(
    postgres: Any, unique_name: str
) -> None:
    first = resource_for(postgres, unique_name)
    left = backend(first)
    first.connection.execute("BEGIN")
    first.close()

    second = resource_for(postgres, unique_name)
    try:
        assert backend(second) != left

        def ended() -> bool:
            with psycopg.connect(postgres.endpoint.url, autocommit=True) as connection:
                row = connection.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (left,)
                ).fetchone()
            return row == (0,)

        wait_until(ended, 30, "the session left inside a transaction to be closed")
    finally:
        second.close()
