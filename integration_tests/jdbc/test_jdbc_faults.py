"""2pc-jdbc under faults the driver-kill suite cannot make: a call that fails inside the
database client (before it applies, or after it applied with its answer lost), Spark's own
abort path after a partial commit, someone else rolling a decided transaction back, a
restart with another protocol or another way of giving the checkpoint, a Python worker
dying right after PREPARE, and a crashed run's locks at query start.

Each test ends with every input row exactly once in the table, no prepared transaction or
staged row of the sink left, and every ledger row done (or with the exact error expected).
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from eospack.connectors.jdbc.dialect import TableName, stage_table
from eospack.core import faults
from eospack.lab.testing import await_query
from integration_tests.jdbc_fixtures import (
    INPUT_SCHEMA_DDL,
    pg_leftovers,
    pg_rows,
    run_file_query,
    stream_input,
    write_input_files,
)
from integration_tests.jdbc_pipeline import (
    QUERY_TIMEOUT,
    Pipeline,
    input_batches,
)

pytestmark = pytest.mark.integration


@pytest.mark.timeout(300)
def test_spark_abort_after_a_partial_commit_rolls_the_batch_forward(
    spark, postgres, tmp_path, unique_name, call_faults
):
    """The connection drops right after the first COMMIT PREPARED of batch 1 applied: commit
    raises, Spark calls abort with the same messages. Abort must finish the decided batch,
    not roll back its second piece (which the old recovery then took for committed)."""
    pipeline = Pipeline(postgres, tmp_path, unique_name, call_faults)
    pipeline.arm("jdbc.commit_piece", "after", batch_id=1)

    failed = pipeline.run(spark, "--protocol", "prepared")

    assert not failed.succeeded, failed.explain()
    assert pipeline.fired() == ["jdbc.commit_piece after"]
    assert pipeline.ledger() == {0: "done", 1: "done"}  # abort finished batch 1
    assert pg_rows(pipeline.url, unique_name) == sorted(pipeline.batches[0] + pipeline.batches[1])
    assert pg_leftovers(pipeline.url, unique_name) == (0, 0)
    final = pipeline.run(spark, "--protocol", "prepared")
    assert final.succeeded, final.explain()
    pipeline.assert_exactly_once()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["before", "after"])
def test_a_decision_write_that_fails_or_loses_its_answer_commits_each_row_once(
    spark, postgres, tmp_path, unique_name, call_faults, mode
):
    pipeline = Pipeline(postgres, tmp_path, unique_name, call_faults)
    pipeline.arm("jdbc.decide", mode, batch_id=2)

    failed = pipeline.run(spark, "--protocol", "prepared")

    assert not failed.succeeded and pipeline.fired() == [f"jdbc.decide {mode}"], failed.explain()
    assert pg_leftovers(pipeline.url, unique_name) == (0, 0)  # abort cleaned or finished
    final = pipeline.run(spark, "--protocol", "prepared")
    assert final.succeeded, final.explain()
    pipeline.assert_exactly_once()


@pytest.mark.timeout(300)
def test_a_decided_transaction_that_someone_rolled_back_fails_loudly(
    spark, postgres, tmp_path, unique_name, call_faults
):
    pipeline = Pipeline(postgres, tmp_path, unique_name, call_faults)
    pipeline.crash("--protocol", "prepared", fault_point="after_decision@1")
    with psycopg.connect(pipeline.url, autocommit=True) as connection:
        sink_id, gid = connection.execute(
            "SELECT sink_id, p.gid FROM eospack_commits c, pg_prepared_xacts p"
            " WHERE c.target = %s AND c.batch_id = 1 AND c.status = 'decided'"
            " AND starts_with(p.gid, 'eospack-' || c.sink_id || '-1-') ORDER BY p.gid LIMIT 1",
            (unique_name,),
        ).fetchone()
        connection.execute(f"ROLLBACK PREPARED '{gid}'")

    restarted = pipeline.run(spark, "--protocol", "prepared")

    assert not restarted.succeeded
    assert (
        f"2pc-jdbc sink {sink_id} batch 1: prepared transaction {gid} (partition"
        in restarted.output
    ), restarted.explain()
    assert "was rolled back by someone else although the batch was decided" in restarted.output
    assert pipeline.ledger()[1] == "decided"  # never marked done over lost rows
    with psycopg.connect(pipeline.url, autocommit=True) as connection:
        for (left,) in connection.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE starts_with(gid, %s)", (f"eospack-{sink_id}-",)
        ).fetchall():
            connection.execute(f"ROLLBACK PREPARED '{left}'")


@pytest.mark.timeout(300)
def test_a_restart_with_another_protocol_finishes_what_the_crashed_run_decided(
    spark, postgres, tmp_path, unique_name, call_faults
):
    pipeline = Pipeline(postgres, tmp_path, unique_name, call_faults)
    pipeline.crash("--protocol", "prepared", fault_point="after_decision@1")

    final = pipeline.run(spark, "--protocol", "staging")

    assert final.succeeded, final.explain()
    pipeline.assert_exactly_once()


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("checkpoint_form", "restart_protocol"),
    [
        # the sink id comes from the query id Spark hands each task, whatever form the
        # checkpoint was given in (identity.current_task): the URI form runs in release checks
        pytest.param("uri", "prepared", marks=pytest.mark.chaos),
        ("conf", "prepared"),
        ("path", "staging"),
    ],
)
def test_a_replay_does_not_wait_on_the_crashed_runs_prepared_rows(
    spark, postgres, tmp_path, unique_name, call_faults, checkpoint_form, restart_protocol
):
    """The crashed run's prepared rows lock primary keys the replay writes again; with the
    checkpoint given as a URI or through spark.sql.streaming.checkpointLocation the sink
    used to find no query id to recover with, and the replay waited until lockTimeout.
    Restarted with protocol=staging, the driver's move into the table waited on them (the
    stress walk's stall): the commit now rolls them back before it decides."""
    pipeline = Pipeline(postgres, tmp_path, unique_name, call_faults)
    options = ("--checkpoint-form", checkpoint_form, "--lock-timeout", "3s")
    pipeline.crash("--protocol", "prepared", *options, fault_point="after_prepare@1")

    final = pipeline.run(spark, "--protocol", restart_protocol, *options)

    assert final.succeeded, final.explain()
    pipeline.assert_exactly_once()


@pytest.mark.timeout(300)
def test_a_task_retry_after_its_worker_died_does_not_wait_on_its_own_orphan(
    postgres, tmp_path, unique_name, call_faults
):
    pipeline = Pipeline(postgres, tmp_path, unique_name, call_faults)
    pipeline.arm("jdbc.prepare", "crash", batch_id=1)

    run = pipeline.in_own_process(  # local[2,3]: Spark retries a failed task
        "--protocol", "prepared", "--lock-timeout", "3s", "--master", "local[2,3]"
    )

    assert run.succeeded, run.explain()
    assert pipeline.fired() == ["jdbc.prepare crash"]
    pipeline.assert_exactly_once()


@pytest.mark.timeout(300)
def test_a_failed_batch_leaves_no_prepared_transaction_behind(
    spark, postgres, tmp_path, unique_name, call_faults
):
    """PREPARE applies but its answer is lost (no task retries in local[2]): the task rolls
    its own piece back before it fails, so nothing is left before any restart. One
    partition: with two, the other task may still PREPARE after Spark's abort ran (Spark
    does not wait for it); that piece is rolled back by the restart's first commit."""
    url = postgres.endpoint.url
    batches = input_batches(3)
    write_input_files(tmp_path / "in", batches)
    options = {
        "url": postgres.endpoint.jdbc_url,
        "user": postgres.endpoint.user,
        "dbtable": unique_name,
        "createTableIfNotExists": "true",
        "protocol": "prepared",
    }

    def run() -> None:
        query = (
            stream_input(spark, tmp_path / "in", partitions=1)
            .writeStream.format("2pc-jdbc")
            .options(**options)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        await_query(query, QUERY_TIMEOUT)

    faults.arm(call_faults, "jdbc.prepare", "after", batch_id=1)
    with pytest.raises(Exception, match="injected fault: jdbc.prepare after in batch 1"):
        run()
    assert pg_leftovers(url, unique_name) == (0, 0)

    run()
    assert pg_rows(url, unique_name) == sorted(row for batch in batches for row in batch)
    assert pg_leftovers(url, unique_name) == (0, 0)


@pytest.mark.timeout(300)
def test_query_start_fails_clearly_when_a_prepared_transaction_locks_the_stage(
    spark, postgres, tmp_path, unique_name
):
    """A crashed run's prepared upsert holds a lock on the staging table; a restart after the
    target's column was retyped by hand must drop and re-create the stage (its types are
    stale): it waits lockTimeout, then fails naming the gid. (A restart with fewer columns
    no longer re-creates the stage: rows are staged by column name.)"""
    url = postgres.endpoint.url
    write_input_files(tmp_path / "in", input_batches(1))
    options = {
        "url": postgres.endpoint.jdbc_url,
        "user": postgres.endpoint.user,
        "dbtable": unique_name,
        "createTableIfNotExists": "true",
        "protocol": "staging",
        "writeMode": "upsert",
        "upsertKeys": "id",
        "lockTimeout": "2s",
    }

    def start(frame: Any, checkpoint: str) -> Any:
        return (
            frame.writeStream.format("2pc-jdbc")
            .options(**options)
            .option("checkpointLocation", str(tmp_path / checkpoint))
            .trigger(availableNow=True)
            .start()
        )

    await_query(start(stream_input(spark, tmp_path / "in"), "first"), QUERY_TIMEOUT)
    stage = str(stage_table(TableName(None, unique_name)).name)
    gid = f"eospack-crashedrun-1-0-0xdeadx{unique_name[-6:]}"
    orphan = psycopg.connect(url)
    orphan.tpc_begin(gid)
    orphan.execute(f'INSERT INTO "{stage}" (eospack_piece, id) VALUES (%s, 1)', (gid,))
    orphan.tpc_prepare()
    orphan.close()
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(f'ALTER TABLE "{unique_name}" ALTER COLUMN name TYPE varchar(200)')
    try:
        with pytest.raises(Exception) as caught:
            await_query(start(stream_input(spark, tmp_path / "in"), "second"), QUERY_TIMEOUT)
        message = str(caught.value)
        assert "is locked by another session for over 2000ms" in message, message[:3000]
        assert gid in message
    finally:
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute(f"ROLLBACK PREPARED '{gid}'")


@pytest.mark.parametrize("server_name", ["postgres", "mariadb"])
@pytest.mark.timeout(300)
def test_a_restart_naming_the_table_with_its_default_schema_is_the_same_sink(
    request, spark, tmp_path, unique_name, call_faults, server_name
):
    """Batch 1's decision applied but its answer was lost; the restart names the table
    ``public.<table>`` (PostgreSQL) or ``<database>.<table>`` (MariaDB) instead of
    ``<table>``: the same table, so the same sink, which finishes batch 1 from its ledger
    instead of applying the replay a second time."""
    server = request.getfixturevalue(server_name)
    endpoint = server.endpoint
    options = {"url": endpoint.jdbc_url, "user": endpoint.user, "dbtable": unique_name}
    options["createTableIfNotExists"] = "true"
    if endpoint.password:
        options["password"] = endpoint.password
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    batches = [[(1, "a", 1)], [(2, "b", 1)], [(3, "c", 1)]]
    write_input_files(source, batches)
    faults.arm(call_faults, "jdbc.decide", "after", batch_id=1)
    with pytest.raises(Exception, match="jdbc.decide"):
        run_file_query(spark, source, checkpoint, INPUT_SCHEMA_DDL, options, files_per_trigger=1)

    schema = "public" if server_name == "postgres" else "eospack"
    restarted = {**options, "dbtable": f"{schema}.{unique_name}"}
    run_file_query(spark, source, checkpoint, INPUT_SCHEMA_DDL, restarted, files_per_trigger=1)

    connection = endpoint.connect() if server_name == "mariadb" else psycopg.connect(endpoint.url)
    try:
        cursor = connection.cursor()
        cursor.execute(f"SELECT id FROM {unique_name} ORDER BY id")
        assert [row[0] for row in cursor.fetchall()] == [1, 2, 3]
    finally:
        connection.close()
