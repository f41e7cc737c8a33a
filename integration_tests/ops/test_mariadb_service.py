"""The embedded MariaDB is a real server: committed rows survive a SIGKILL of mariadbd
and a restart on the same data; an uncommitted transaction does not."""

from __future__ import annotations

import os
import signal

import pytest

pytestmark = pytest.mark.integration


@pytest.mark.timeout(120)
def test_committed_rows_survive_a_sigkill_and_restart(mariadb, unique_name) -> None:
    table = f"`{unique_name}`"
    connection = mariadb.endpoint.connect()
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE {table} (id BIGINT PRIMARY KEY) ENGINE=InnoDB")
        cursor.executemany(f"INSERT INTO {table} VALUES (%s)", [(i,) for i in range(100)])
    pending = mariadb.endpoint.connect(autocommit=False)
    with pending.cursor() as cursor:
        cursor.execute(f"INSERT INTO {table} VALUES (1000)")  # never committed
    server_pid = mariadb.process.pid

    mariadb.kill()

    assert mariadb.process.returncode == -signal.SIGKILL
    with pytest.raises(ProcessLookupError):
        os.kill(server_pid, 0)
    mariadb.start()
    assert mariadb.process.pid != server_pid
    connection = mariadb.endpoint.connect()
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id FROM {table} ORDER BY id")
        assert [row[0] for row in cursor.fetchall()] == list(range(100))
        cursor.execute(f"DROP TABLE {table}")
    connection.close()
