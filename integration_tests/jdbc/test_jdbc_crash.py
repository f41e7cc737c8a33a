"""2pc-jdbc when its database dies mid-stream.

The driver SIGKILLed at every crash point, call faults and the other cases every sink
must pass are the contract suite's (``test_sink_contract.py``, adapters ``jdbc-prepared``,
``jdbc-staging`` and ``jdbc-sqlite``); this module keeps what only a database can do to
the sink. Its end state is the contract's: each row once, nothing prepared or staged
left, every decision done.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from eospack.lab.testing import await_query, wait_until
from integration_tests.sink_contract.adapters import JdbcPrepared
from integration_tests.sink_contract.harness import ContractRun

pytestmark = pytest.mark.integration


@pytest.mark.timeout(300)
def test_database_restart_mid_stream_fails_clearly_and_recovers_exactly_once(
    request: pytest.FixtureRequest, tmp_path: Path, unique_name: str
) -> None:
    from eospack.lab.services import start_postgres

    server = start_postgres(max_prepared_transactions=16)
    try:
        sink = JdbcPrepared.open(request, tmp_path, unique_name)
        sink.server = server  # type: ignore[attr-defined]
        run = ContractRun(sink)
        run.add_batches(12)

        query = run.start_here()
        wait_until(
            lambda: len(sink.decisions(query_sink_ids(run), run.options)) >= 2,
            60,
            "two committed batches",
        )
        server.kill()
        with pytest.raises(Exception) as caught:
            await_query(query, 120)
        # A task that cannot connect fails the job ("Writing job failed"): its cause is in
        # the JVM trace. A commit that loses the server fails with its own message.
        message = f"{caught.value}\n{getattr(caught.value, '_stackTrace', '')}"
        assert "could not connect to postgresql://" in message or (
            "2pc-jdbc lost postgresql://" in message and "connection error" in message
        ), message[:2000]

        server.start()
        run.remember_sink_id()
        run.assert_nothing_doubled()
        run.run_here()
        run.assert_each_row_once()
    finally:
        server.stop()


def query_sink_ids(run: ContractRun) -> set[str]:
    """The running query's sink id, once its checkpoint names the query."""
    run.remember_sink_id()
    return run.sink_ids
