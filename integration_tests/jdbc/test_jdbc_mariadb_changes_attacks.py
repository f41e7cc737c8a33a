"""Attacks on 2pc-jdbc's MariaDB dialect (issue 39): each test tries to break exactly
once; the ones kept here held (or pin a hole with a strict xfail)."""

from __future__ import annotations

from typing import Any

import pytest

from integration_tests.jdbc_fixtures import INPUT_SCHEMA_DDL, run_file_query, write_input_files

pytestmark = pytest.mark.integration

BATCHES = [[(1, "a", 1), (2, "b", 1)], [(3, "c", 1)]]


def _options(server: Any, url: str, table: str) -> dict[str, str]:
    options = {
        "url": url,
        "user": server.endpoint.user,
        "dbtable": table,
        "createTableIfNotExists": "true",
    }
    if server.endpoint.password:
        options["password"] = server.endpoint.password
    return options


def _rows(server: Any, table: str) -> list[tuple[Any, ...]]:
    connection = server.endpoint.connect()
    try:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT id, name, version FROM `{table}` ORDER BY id")
            return list(cursor.fetchall())
    finally:
        connection.close()


@pytest.mark.timeout(300)
def test_a_replayed_batch_under_another_url_spelling_is_not_applied_twice(
    spark, mariadb, tmp_path, unique_name
):
    """Attack: batch 1 committed in the database, its Spark commit lost (commits/1 gone),
    and the restart spells the same server and table another way: jdbc:mysql instead of
    jdbc:mariadb, the other loopback host name, and ``database.table``. The sink id must
    be the same, so the replay finds batch 1's decision and appends nothing twice."""
    endpoint = mariadb.endpoint
    source, checkpoint = tmp_path / "in", tmp_path / "cp"
    write_input_files(source, BATCHES)
    options = _options(mariadb, endpoint.jdbc_url, unique_name)
    run_file_query(spark, source, checkpoint, INPUT_SCHEMA_DDL, options, files_per_trigger=1)
    expected = [(1, "a", 1), (2, "b", 1), (3, "c", 1)]
    assert _rows(mariadb, unique_name) == expected

    (checkpoint / "commits" / "1").unlink()
    (checkpoint / "commits" / ".1.crc").unlink(missing_ok=True)
    other_host = "localhost" if endpoint.host == "127.0.0.1" else endpoint.host
    url = f"jdbc:mysql://{other_host}:{endpoint.port}/{endpoint.database}"
    table = f"{endpoint.database}.{unique_name}"
    options = _options(mariadb, url, table)
    run_file_query(spark, source, checkpoint, INPUT_SCHEMA_DDL, options, files_per_trigger=1)

    assert _rows(mariadb, unique_name) == expected


SECRET = "s3cr3t-Pw"


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "url",
    [
        "jdbc:mysql://address=(host=127.0.0.1)(port=3306)(password=SECRET)/eospack",
        "jdbc:mariadb://127.0.0.1:3306/eospack;password=SECRET",
    ],
    ids=["address-form", "semicolon-parameter"],
)
def test_a_password_in_another_jdbc_url_form_is_refused_without_showing_it(
    spark, tmp_path, unique_name, caplog, url
):
    """Attack: MariaDB Connector/J's ``address=(...)(password=...)`` form and a
    ``;password=`` suffix carry the password where ``user:password@`` and ``?password=``
    checks do not look. The query must fail at start in one line naming the url option,
    and the secret must appear in no error and no log line (the url is logged and shown
    in plans)."""
    source, checkpoint = tmp_path / "in", tmp_path / "cp"
    write_input_files(source, [[(1, "a", 1)]])
    options = {"url": url.replace("SECRET", SECRET), "user": "root", "dbtable": unique_name}
    caplog.set_level("DEBUG", logger="eospack")
    with pytest.raises(Exception) as caught:
        run_file_query(spark, source, checkpoint, INPUT_SCHEMA_DDL, options, files_per_trigger=1)
    assert "url contains a password: remove it from url and set the password option" in str(
        caught.value
    )
    assert SECRET not in str(caught.value)
    # eospack's own log lines (py4j's DEBUG lines echo every option, the password option too)
    assert not [r for r in caplog.records if r.name.startswith("eospack") and SECRET in r.message]
