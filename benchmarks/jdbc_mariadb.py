"""13. 2pc-jdbc into MariaDB versus Spark's own JDBC writer with MariaDB's driver.

The same input as benchmark 2 (``benchmarks.data``, every size in 10 micro-batches), the
contenders interleaved (``jdbc_sink.interleaved``), each into a fresh table whose row count
is checked after the write. The peer is what a Spark user runs without eospack:
``foreachBatch`` + ``DataFrame.write.jdbc`` with Connector/J 3.5 (the ``mariadb-jdbc`` jar
set), ``batchsize=10000`` and ``useBulkStmts=true`` in the url (the driver's documented bulk
path: one COM_STMT_BULK_EXECUTE per batch instead of a round trip per row), the url spelled
``jdbc:mysql:...?permitMysqlScheme`` so that Spark quotes names as MySQL does. The ceiling is
what one process gets from the server: the sink's own ``LOAD DATA LOCAL INFILE`` path, one
connection, one transaction, no Spark.
"""

from __future__ import annotations

import contextlib
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from benchmarks.data import parquet_directory, parquet_stream
from benchmarks.harness import Comparison, Figure, Report, say, scaling_note
from benchmarks.jdbc_sink import (
    MICRO_BATCHES,
    TIMEOUT,
    Contender,
    checked_write,
    interleaved,
    write_with_eospack,
)
from eospack.lab.testing import await_query

TABLE_DDL = (
    "(id BIGINT, name LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin, amount DOUBLE,"
    " at DATETIME(6)) ENGINE=InnoDB"
)
"""What ``createTableIfNotExists`` makes for the input's schema."""
SPARK_WRITER = "Spark JDBC writer (MariaDB Connector/J, useBulkStmts)"
CEILING = "LOAD DATA LOCAL INFILE, one process"
XA = "2pc-jdbc exactly-once (XA)"
STAGING = "2pc-jdbc exactly-once (staging)"
AT_LEAST_ONCE = "2pc-jdbc at-least-once"
CONTENDERS = {
    XA: {"protocol": "prepared"},
    STAGING: {"protocol": "staging"},
    AT_LEAST_ONCE: {"deliveryGuarantee": "at-least-once"},
}


def _execute(mariadb: Any, *statements: str) -> Any:
    """Run the statements in one autocommit session; the last one's first row."""
    with contextlib.closing(mariadb.endpoint.connect()) as connection:
        cursor = connection.cursor()
        for statement in statements:
            cursor.execute(statement)
        return cursor.fetchone()


def reset_table(mariadb: Any, table: str) -> None:
    _execute(mariadb, f"DROP TABLE IF EXISTS {table}", f"CREATE TABLE {table} {TABLE_DDL}")


def count_rows(mariadb: Any, table: str) -> int:
    row = _execute(mariadb, f"SELECT count(*) FROM {table}")
    return int(row[0]) if row else 0


def write_with_spark_jdbc(spark: Any, directory: Path, mariadb: Any, table: str) -> None:
    endpoint = mariadb.endpoint
    # jdbc:mysql (with permitMysqlScheme, Connector/J's switch for it) selects Spark's
    # MySQLDialect (backquoted names); Spark's dialects do not know jdbc:mariadb.
    url = endpoint.jdbc_url.replace("jdbc:mariadb:", "jdbc:mysql:")
    url += "?permitMysqlScheme&useBulkStmts=true"
    properties = {
        "user": endpoint.user,
        "password": endpoint.password,
        "driver": "org.mariadb.jdbc.Driver",
        "batchsize": "10000",
        "sessionInitStatement": "SET time_zone = '+00:00'",
    }

    def write_batch(frame: Any, _batch_id: int) -> None:
        frame.write.jdbc(url, table, mode="append", properties=properties)

    query = (
        parquet_stream(spark, directory)
        .writeStream.foreachBatch(write_batch)
        .option("checkpointLocation", tempfile.mkdtemp(prefix="bench-spark-mariadb-"))
        .trigger(availableNow=True)
        .start()
    )
    await_query(query, TIMEOUT)


def load_in_one_process(directory: Path, mariadb: Any, table: str) -> None:
    """The ceiling: the sink's own encoding and ``LOAD DATA`` (``MariaDBDialect.write_rows``),
    every file in one connection and one transaction."""
    from eospack.connectors.jdbc.dialect import TableName
    from eospack.connectors.jdbc.mariadb import SESSION_SETUP, MariaDBConnection, MariaDBDialect

    raw = mariadb.endpoint.connect(autocommit=False, local_infile=True, init_command=SESSION_SETUP)
    connection = MariaDBConnection(raw)
    try:
        for path in sorted(directory.glob("*.parquet")):
            batches = pq.read_table(path).to_batches()
            columns = [str(name) for name in batches[0].schema.names]
            target = TableName(None, table)
            MariaDBDialect().write_rows(connection, target, columns, batches, 10_000)
        connection.commit()
    finally:
        connection.close()


def run(
    report: Report,
    spark: Any,
    mariadb: Any,
    workdir: Path,
    sizes: list[int],
    repetitions: int,
    spark_writer: bool,
) -> None:
    """``spark_writer``: the session has MariaDB's JDBC driver, so Spark's writer runs."""
    by_size: dict[str, dict[int, Figure]] = {}
    for rows in sizes:
        directory = parquet_directory(
            workdir / f"rows-{rows}-in-{MICRO_BATCHES}",
            rows,
            rows_per_file=-(-rows // MICRO_BATCHES),
        )
        say(f"jdbc-mariadb: {rows:,} rows in {MICRO_BATCHES} micro-batches into MariaDB")
        table = f"bench_mariadb_{rows}"
        into_table = partial(
            checked_write,
            reset=partial(reset_table, mariadb, table),
            count=partial(count_rows, mariadb, table),
            rows=rows,
        )
        contenders: dict[str, Contender] = {
            label: into_table(partial(write_with_eospack, spark, directory, mariadb, table, how))
            for label, how in CONTENDERS.items()
        }
        contenders[CEILING] = into_table(partial(load_in_one_process, directory, mariadb, table))
        if spark_writer:
            contenders[SPARK_WRITER] = into_table(
                partial(write_with_spark_jdbc, spark, directory, mariadb, table)
            )
        seconds = interleaved(contenders, repetitions)
        figures = {label: Figure(label, seconds[label], rows) for label in contenders}
        size = f"{rows:,} rows"
        for label in (XA, STAGING):
            if spark_writer:
                report.add(
                    Comparison(
                        "13. mariadb sink vs Spark writer",
                        size,
                        figures[label],
                        figures[SPARK_WRITER],
                        2.0 if rows >= 1_000_000 else None,
                    )
                )
            report.add(
                Comparison(
                    "13. mariadb exactly-once cost",
                    size,
                    figures[label],
                    figures[AT_LEAST_ONCE],
                    0.85,
                )
            )
        for label in CONTENDERS:
            report.add(
                Comparison("13. mariadb sink vs ceiling", size, figures[label], figures[CEILING])
            )
        for label, figure in figures.items():
            by_size.setdefault(label, {})[rows] = figure
    if not spark_writer:
        report.notes.append("jar set mariadb-jdbc missing: Spark's JDBC writer was not measured")
    if len(sizes) > 1:
        for label, figures_by_size in by_size.items():
            report.notes.append(scaling_note(f"jdbc-mariadb: {label}", figures_by_size))
