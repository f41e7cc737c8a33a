"""Attacks on issue 28's cuts of 2pc-jdbc's commit cost (2ba39b3, 4cae125).

The driver keeps its PostgreSQL connection between commits, decides an empty slot in one
autocommitted INSERT, and lists leftovers once per commit (before the decision). Each test
here is one input that could make those cuts lose, double or leave something: a kept
connection whose server moved away without a word, a zombie task preparing after the
single listing, a decision whose answer was lost, a zombie driver deciding the same batch.
Without Spark: the resource and the coordinator are the driver's whole commit.
"""

from __future__ import annotations

import select
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from eospack.commit_protocols import (
    BatchDecision,
    PreparedPiece,
    TwoPhaseCommitCoordinator,
    sink_prefix,
    transaction_id,
)
from eospack.connectors.jdbc.options import parse_options
from eospack.connectors.jdbc.planning import plan_sink
from eospack.connectors.jdbc.resource import JdbcResource, open_resource
from eospack.lab.testing import wait_until

SCHEMA = StructType([StructField("id", LongType()), StructField("name", StringType())])


def resource_for(postgres: Any, table: str, url: str | None = None) -> JdbcResource:
    options = parse_options(
        {
            "url": url or postgres.endpoint.jdbc_url,
            "user": postgres.endpoint.user,
            "dbtable": table,
            "protocol": "prepared",
            "createTableIfNotExists": "true",
            "sinkId": table.replace("_", "")[-20:],
        }
    )
    return open_resource(options, plan_sink(options, SCHEMA))


def prepare_piece(
    postgres: Any,
    table: str,
    sink_id: str,
    batch_id: int,
    partition: int,
    attempt: str,
    ids: list[int],
) -> PreparedPiece:
    """What a task does: its rows in a two-phase transaction, prepared under its gid."""
    gid = transaction_id(sink_id, batch_id, partition, attempt)
    connection = psycopg.connect(postgres.endpoint.url)
    try:
        connection.tpc_begin(gid)
        for row_id in ids:
            connection.execute(f'INSERT INTO "{table}" (id, name) VALUES (%s, %s)', (row_id, gid))
        row = connection.execute("SELECT pg_current_xact_id()::text").fetchone()
        assert row is not None
        connection.tpc_prepare()
    finally:
        connection.close()
    return PreparedPiece(
        sink_id, batch_id, partition, attempt, len(ids), {"gid": gid, "xid": row[0]}
    )


def left_prepared(postgres: Any, sink_id: str) -> list[str]:
    with psycopg.connect(postgres.endpoint.url, autocommit=True) as connection:
        rows = connection.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE starts_with(gid, %s) ORDER BY gid",
            (sink_prefix(sink_id),),
        ).fetchall()
    return [gid for (gid,) in rows]


def roll_back_all(postgres: Any, sink_id: str) -> None:
    with psycopg.connect(postgres.endpoint.url, autocommit=True) as connection:
        for gid in left_prepared(postgres, sink_id):
            connection.execute(psycopg.sql.SQL("ROLLBACK PREPARED {}").format(gid))


def table_ids(postgres: Any, table: str) -> list[int]:
    with psycopg.connect(postgres.endpoint.url, autocommit=True) as connection:
        rows = connection.execute(f'SELECT id FROM "{table}" ORDER BY id').fetchall()
    return [row_id for (row_id,) in rows]


# A zombie task preparing after the single listing (2ba39b3) ----------------------------


@pytest.mark.timeout(60)
def test_a_zombie_piece_prepared_after_the_single_listing_is_not_left_behind(
    postgres: Any, unique_name: str
) -> None:
    """A task attempt of a crashed run is still alive (a lost executor's Python worker) and
    prepares its piece of batch 3 while the new run's driver commits batch 3, after the
    driver listed leftovers. Before 2ba39b3 the listing after the decision rolled it back;
    now nothing does until batch 4, and a query whose batch 3 was its last leaves it."""
    resource = resource_for(postgres, unique_name)
    sink_id = resource.options.sink_id
    assert sink_id is not None
    try:
        ours = [
            prepare_piece(postgres, unique_name, sink_id, 3, p, "0xthisrunx3", [p])
            for p in range(2)
        ]
        listed = resource.prepared_pieces
        zombies: list[PreparedPiece] = []

        def listing_then_zombie(listed_sink: str) -> list[PreparedPiece]:
            found = listed(listed_sink)
            if not zombies:
                zombies.append(
                    prepare_piece(postgres, unique_name, sink_id, 3, 0, "0xcrashedx1", [100])
                )
            return found

        resource.prepared_pieces = listing_then_zombie  # type: ignore[method-assign, assignment]
        TwoPhaseCommitCoordinator(resource, "2pc-jdbc").commit(ours, 3)

        assert zombies, "the zombie prepared after the listing"
        assert table_ids(postgres, unique_name) == [0, 1]
        assert left_prepared(postgres, sink_id) == []
    finally:
        resource.close()
        roll_back_all(postgres, sink_id)


# A kept connection whose address moved to another server (4cae125) ---------------------


class _FailoverProxy:
    """A TCP relay in front of PostgreSQL that can "fail over" without a word: the sessions
    it relays are cut from the server, and the first bytes a client sends afterwards are
    answered with a reset (what a client sees when its server's address moved to another
    host, or a NAT forgot the connection). New connections reach the server as before."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.generation = 0
        self.silently = False
        self.closing = False
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def fail_over(self, silently: bool = False) -> None:
        """Cut the relayed sessions; ``silently``: what their clients send afterwards is
        swallowed, never answered (a network partition, a firewall that dropped the
        session), instead of being reset."""
        self.silently = silently
        self.generation += 1

    def close(self) -> None:
        self.closing = True
        self.listener.close()
        for thread in self.threads:
            thread.join(timeout=5)

    def _accept(self) -> None:
        while not self.closing:
            try:
                readable, _, _ = select.select([self.listener], [], [], 0.1)
                if not readable:
                    continue
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            thread = threading.Thread(
                target=self._relay, args=(client, server, self.generation), daemon=True
            )
            self.threads.append(thread)
            thread.start()

    def _relay(self, client: socket.socket, server: socket.socket | None, born: int) -> None:
        try:
            while not self.closing:
                if server is not None and self.generation != born:
                    server.close()  # the old server is gone; the client is not told
                    server = None
                watched = [client] + ([server] if server is not None else [])
                readable, _, _ = select.select(watched, [], [], 0.1)
                if server is not None and self.generation != born:
                    continue
                for source in readable:
                    data = source.recv(65536)
                    if source is client and server is None and self.silently and data:
                        continue
                    if source is client and server is None:
                        client.setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                        )
                        return  # closed in finally with linger 0: a reset
                    if not data:
                        return
                    (server if source is client else client).sendall(data)  # type: ignore[union-attr]
        except OSError:
            return
        finally:
            client.close()
            if server is not None:
                server.close()


@pytest.fixture
def failover_proxy(postgres: Any) -> Iterator[_FailoverProxy]:
    url = psycopg.conninfo.conninfo_to_dict(postgres.endpoint.url)
    proxy = _FailoverProxy(str(url.get("host") or "127.0.0.1"), int(url.get("port") or 5432))
    yield proxy
    proxy.close()


def keep_a_connection_through(proxy: _FailoverProxy, postgres: Any, table: str) -> tuple[str, str]:
    """A resource over ``proxy`` used and closed, so its connection is kept: the proxied
    jdbc url and the sink id."""
    url = postgres.endpoint.jdbc_url
    host_port = url.split("//", 1)[1].split("/", 1)[0]
    proxied = url.replace(host_port, f"127.0.0.1:{proxy.port}", 1)
    first = resource_for(postgres, table, url=proxied)
    sink_id = first.options.sink_id
    assert sink_id is not None
    first.close()
    return proxied, sink_id


@pytest.mark.timeout(60)
def test_the_commit_after_a_silent_failover_connects_anew(
    postgres: Any, unique_name: str, failover_proxy: _FailoverProxy
) -> None:
    """The kept connection looked idle and healthy (nothing on its socket: the old server
    never said goodbye), but its first statement after the failover is reset. A new
    connection would have reached the server; the commit must not fail on the kept one."""
    proxied, sink_id = keep_a_connection_through(failover_proxy, postgres, unique_name)
    failover_proxy.fail_over()

    second = resource_for(postgres, unique_name, url=proxied)
    try:
        piece = PreparedPiece(sink_id, 0, 0, "0xrunx1", 1, {"piece": "none"})
        assert second.unfinished_decisions(sink_id) == []
        slot = second.record_decision(BatchDecision(sink_id, 0, (piece,)))
        assert slot.is_decided and slot.same_pieces(BatchDecision(sink_id, 0, (piece,)))
    finally:
        second.close()


# The one-statement decision (4cae125): a lost answer, and a zombie driver ---------------


def slot_of(resource: JdbcResource, sink_id: str, batch_id: int) -> tuple[str, frozenset[str]]:
    found = resource.find_decision(sink_id, batch_id)
    assert found is not None
    return found.status, found.transaction_ids()


@pytest.mark.timeout(60)
def test_a_decision_applied_with_its_answer_lost_is_rolled_forward_by_the_abort(
    postgres: Any, unique_name: str, call_faults: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The autocommitted INSERT took the slot, then the connection dropped before its
    answer: the commit raises, Spark's abort (same messages) must find the decision its
    own and commit it, and the replay of the batch by a restarted run must add nothing."""
    from eospack.core import faults

    monkeypatch.setattr(faults, "_DIRECTORY", str(call_faults))
    faults.arm(call_faults, "jdbc.decide", "after", batch_id=3)
    resource = resource_for(postgres, unique_name)
    sink_id = resource.options.sink_id
    assert sink_id is not None
    try:
        ours = [
            prepare_piece(postgres, unique_name, sink_id, 3, p, "0xfirstx3", [p]) for p in range(2)
        ]
        with pytest.raises(psycopg.OperationalError):
            TwoPhaseCommitCoordinator(resource, "2pc-jdbc").commit(ours, 3)
        resource.close()
        assert [fault["call"] for fault in faults.injected(call_faults)] == ["jdbc.decide"]

        resource = resource_for(postgres, unique_name)
        TwoPhaseCommitCoordinator(resource, "2pc-jdbc").abort(ours, 3)
        assert table_ids(postgres, unique_name) == [0, 1]
        assert slot_of(resource, sink_id, 3) == ("done", {p.transaction_id for p in ours})

        replay = [
            prepare_piece(postgres, unique_name, sink_id, 3, p, "0xsecondx3", [10 + p])
            for p in range(2)
        ]
        assert TwoPhaseCommitCoordinator(resource, "2pc-jdbc").commit(replay, 3) is None
        assert table_ids(postgres, unique_name) == [0, 1]
        assert left_prepared(postgres, sink_id) == []
    finally:
        resource.close()
        roll_back_all(postgres, sink_id)


@pytest.mark.parametrize("zombie_first", [True, False])
@pytest.mark.timeout(60)
def test_a_zombie_driver_deciding_the_same_batch_with_other_pieces_is_refused(
    postgres: Any, unique_name: str, zombie_first: bool
) -> None:
    """The driver of a crashed run (same sinkId, still alive) decides batch 3 with its
    pieces while the restarted run's driver commits batch 3 with others, both through the
    one-statement INSERT on an empty slot: exactly one set of pieces is applied, the other
    is rolled back, and nothing is left prepared."""
    current = resource_for(postgres, unique_name)
    zombie = resource_for(postgres, unique_name)
    sink_id = current.options.sink_id
    assert sink_id is not None
    try:
        theirs = [
            prepare_piece(postgres, unique_name, sink_id, 3, p, "0xzombiex3", [p]) for p in range(2)
        ]
        ours = [
            prepare_piece(postgres, unique_name, sink_id, 3, p, "0xcurrentx3", [10 + p])
            for p in range(2)
        ]
        first, second = (theirs, ours) if zombie_first else (ours, theirs)
        first_resource, second_resource = (zombie, current) if zombie_first else (current, zombie)
        taken = first_resource.record_decision(BatchDecision(sink_id, 3, tuple(first)))
        assert taken.is_decided and taken.same_pieces(BatchDecision(sink_id, 3, tuple(first)))
        refused = second_resource.record_decision(BatchDecision(sink_id, 3, tuple(second)))
        assert refused.same_pieces(BatchDecision(sink_id, 3, tuple(first)))

        TwoPhaseCommitCoordinator(second_resource, "2pc-jdbc").commit(second, 3)
        TwoPhaseCommitCoordinator(first_resource, "2pc-jdbc").commit(first, 3)

        expected = [0, 1] if zombie_first else [10, 11]
        assert table_ids(postgres, unique_name) == expected
        assert slot_of(current, sink_id, 3) == ("done", {p.transaction_id for p in first})
        assert left_prepared(postgres, sink_id) == []
    finally:
        current.close()
        zombie.close()
        roll_back_all(postgres, sink_id)


@pytest.mark.timeout(60)
def test_the_commit_after_a_silent_partition_does_not_hang_on_the_kept_connection(
    postgres: Any, unique_name: str, failover_proxy: _FailoverProxy
) -> None:
    """A kept connection whose server became unreachable without a word (a network
    partition, a firewall that forgot the session) must not be lent: the commit would
    wait on it without bound (TCP retransmission, about 15 min on Linux), where a new
    connection reaches the server or fails within connect_timeout."""
    proxied, sink_id = keep_a_connection_through(failover_proxy, postgres, unique_name)
    failover_proxy.fail_over(silently=True)

    outcome: list[object] = []

    def next_commit() -> None:
        try:
            resource = resource_for(postgres, unique_name, url=proxied)
            try:
                outcome.append(resource.unfinished_decisions(sink_id))
            finally:
                resource.close()
        except Exception as error:  # the outcome is asserted below
            outcome.append(error)

    thread = threading.Thread(target=next_commit, daemon=True)
    thread.start()
    try:
        wait_until(lambda: outcome, 8, "the commit after the partition to answer")
    finally:
        failover_proxy.close()  # ends the wait on the dead session, if any
        thread.join(timeout=10)
    assert outcome == [[]]


# The connection kept across a change of options (4cae125) ------------------------------


@pytest.mark.timeout(60)
def test_a_connection_kept_for_options_no_longer_used_is_closed_once_idle_too_long(
    postgres: Any, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The query restarts in the same process with another ledgerTable (or user, password,
    url): the connection kept for the old options is never asked for again. It must not
    stay logged in for the life of the process (a server session and a connection slot
    per change, the old user's session after a password change, a database that cannot
    be dropped)."""
    from eospack.connectors.jdbc import resource as resource_module

    monkeypatch.setattr(resource_module._IdleConnections, "MAX_IDLE_SECONDS", 0.3)
    old = resource_for(postgres, unique_name)
    old_backend = int(old.connection.info.backend_pid)
    old.close()
    closed_at = time.monotonic()
    wait_until(
        lambda: time.monotonic() > closed_at + 0.5,
        5,
        "the old options' connection to be idle longer than MAX_IDLE_SECONDS",
    )

    options = parse_options(
        {
            "url": postgres.endpoint.jdbc_url,
            "user": postgres.endpoint.user,
            "dbtable": unique_name,
            "protocol": "prepared",
            "createTableIfNotExists": "true",
            "sinkId": old.options.sink_id or "",
            "ledgerTable": f"{unique_name}_ledger",
        }
    )
    new = open_resource(options, plan_sink(options, SCHEMA))
    new.close()

    def old_session_ended() -> bool:
        with psycopg.connect(postgres.endpoint.url, autocommit=True) as connection:
            row = connection.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (old_backend,)
            ).fetchone()
        return row == (0,)

    wait_until(old_session_ended, 10, "the old options' idle session to be closed")


@pytest.mark.timeout(60)
def test_a_kept_connection_the_server_ends_after_the_decision_is_not_kept_and_abort_rolls_forward(
    postgres: Any, unique_name: str
) -> None:
    """The server ends the kept session between the decision and the first COMMIT
    PREPARED (an administrator, a pooler, a failover): the commit fails, the broken
    connection must not be lent to Spark's abort, which commits the decided batch once."""
    resource = resource_for(postgres, unique_name)
    sink_id = resource.options.sink_id
    assert sink_id is not None
    try:
        ours = [
            prepare_piece(postgres, unique_name, sink_id, 3, p, "0xrunx3", [p]) for p in range(2)
        ]
        ended = int(resource.connection.info.backend_pid)
        commit_piece = resource.commit_piece

        def ended_before_commit(piece: PreparedPiece) -> None:
            with psycopg.connect(postgres.endpoint.url, autocommit=True) as connection:
                connection.execute("SELECT pg_terminate_backend(%s)", (ended,))
            commit_piece(piece)

        resource.commit_piece = ended_before_commit  # type: ignore[method-assign]
        with pytest.raises(psycopg.OperationalError):
            TwoPhaseCommitCoordinator(resource, "2pc-jdbc").commit(ours, 3)
        resource.close()

        resource = resource_for(postgres, unique_name)
        assert int(resource.connection.info.backend_pid) != ended
        TwoPhaseCommitCoordinator(resource, "2pc-jdbc").abort(ours, 3)
        assert table_ids(postgres, unique_name) == [0, 1]
        assert slot_of(resource, sink_id, 3) == ("done", {p.transaction_id for p in ours})
        assert left_prepared(postgres, sink_id) == []
    finally:
        resource.close()
        roll_back_all(postgres, sink_id)
