"""One contract run: a sink's query restarted again and again from one checkpoint.

Decisions:

- Runs that need no SIGKILL run in the test's session (``run_here``: no JVM start, a few
  seconds each); a SIGKILL or a task retry (``local[2,3]``) needs a driver of its own
  (``run_driver``: ``drivers/contract_driver.py``, 30-40 s each), so a test chains its
  crash points into driver runs and restarts in its own session.
- A run that ends in a crash or an injected fault is checked at once for what may never
  happen at any moment (a row visible twice, a row that was never input); the complete
  end state is checked once, after a clean run (``assert_each_row_once``): each row
  exactly once, nothing prepared, staged, in progress or open left for any sink id the
  runs used, and no decision left pending: read from the store by the adapter, and asked
  of the sink's own inspection (``TransactionalResource.inspect``), which must agree.
- Every sink id the runs used is remembered (from the checkpoint's query id and each
  run's options), so an option change that gives the sink a new id cannot hide the old
  id's leftovers or duplicates.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

from eospack.commit_protocols import PreparedPiece, TaskIdentity
from eospack.commit_protocols.identity import attempt_string
from eospack.core import faults
from eospack.lab.testing import await_query
from eospack.tools.checkpoint import inspect_sink
from integration_tests.crash_harness import DriverRun, run_driver
from integration_tests.sink_contract.adapters import BoundSink, Options, Rows
from integration_tests.sink_contract.inputs import start_query, write_source

DRIVER = Path(__file__).resolve().parents[1] / "drivers" / "contract_driver.py"
DRIVER_TIMEOUT = 240.0
QUERY_TIMEOUT = 180.0
ROWS_PER_BATCH = 20
SINK_ID_GIVEN = "(unused: inspection is given the sinkId)"


class ContractRun:
    """One query of ``sink`` (one checkpoint, one input directory), run to its end again
    and again; ``options`` add to or replace the sink's base options; ``name`` separates
    two queries of one test."""

    def __init__(
        self, sink: BoundSink, options: Mapping[str, str] | None = None, name: str = "query"
    ) -> None:
        self.sink = sink
        self.source = sink.tmp_path / f"{name}-source"
        self.checkpoint = sink.tmp_path / f"{name}-checkpoint"
        self.batches: list[list[tuple[int, str]]] = []
        self.options: Options = {**sink.base_options(), **(options or {})}
        self.sink_ids: set[str] = set()

    # Input -----------------------------------------------------------------------------

    def add_batches(self, count: int) -> None:
        self.batches += write_source(self.source, count, ROWS_PER_BATCH)

    def expected(self, batches: int | None = None) -> Rows:
        return Counter(row for batch in self.batches[:batches] for row in batch)

    # Runs ------------------------------------------------------------------------------

    def start_here(self, options: Options | None = None) -> Any:
        """Start the query in the test's session and return it (``run_here`` awaits it)."""
        if options is not None:
            self.options = options
        return start_query(
            self.sink.spark,
            self.sink.adapter.sink_format,
            str(self.source),
            str(self.checkpoint),
            self.options,
            self.sink.adapter.as_kafka_records,
        )

    def run_here(self, options: Options | None = None) -> None:
        """Run the query in the test's session to its end; raise what it raised."""
        query = self.start_here(options)
        started = time.monotonic()
        try:
            await_query(query, QUERY_TIMEOUT)
        finally:
            print(f"run_here: {time.monotonic() - started:.1f} s")
            self.remember_sink_id()

    def run_through_fault(self, options: Options | None = None) -> BaseException | None:
        """Run in the test's session with a fault armed: the run fails (returned), or the
        sink's client retried the call and it succeeds (None: S3's PUT after a lost
        answer gets 412 and recognises its own write)."""
        try:
            self.run_here(options)
        except Exception as error:
            print(f"the run failed: {str(error)[:300]}")
            return error
        return None

    def leave_batch_one_decided(self, call_faults: Path) -> None:
        """Batch 0 committed, batch 1 decided with every piece still prepared: batch 1's
        piece commit fails before it applies, in Spark's commit and again in its abort's
        roll forward (S3's client sends each call 5 times), so the run fails there."""
        self.add_batches(1)
        self.run_here()
        self.add_batches(1)
        commit_piece = self.sink.adapter.calls.commit_piece
        assert commit_piece is not None, "the sink commits no pieces of its own"
        attempts = 5 if self.sink.adapter.sink_format == "2pc-s3" else 1
        faults.arm(call_faults, commit_piece, "before", batch_id=1, times=2 * attempts)
        assert self.run_through_fault() is not None, "batch 1's commit did not fail"

    def run_driver(
        self,
        fault_point: str | None = None,
        master: str = "local[2]",
        fault_directory: Path | None = None,
    ) -> DriverRun:
        """Run the query in a driver process of its own (killed at ``fault_point``)."""
        arguments = [
            "--sink",
            self.sink.adapter.name,
            "--source",
            str(self.source),
            "--checkpoint",
            str(self.checkpoint),
            "--options",
            json.dumps(self.options),
            "--master",
            master,
        ]
        environment = (
            {faults.FAULT_DIRECTORY_VARIABLE: str(fault_directory)} if fault_directory else None
        )
        try:
            return run_driver(
                DRIVER,
                arguments,
                timeout=DRIVER_TIMEOUT,
                fault_point=fault_point,
                environment=environment,
            )
        finally:
            self.remember_sink_id()

    def query_id(self) -> str | None:
        metadata = self.checkpoint / "metadata"
        if not metadata.exists():
            return None
        return str(json.loads(metadata.read_text().splitlines()[0])["id"])

    def remember_sink_id(self) -> None:
        """Add the sink id of the options in effect (if the sink accepts them at all)."""
        query_id = self.query_id()
        if query_id is None:
            return
        try:
            self.sink_ids.add(self.sink.sink_id(self.options, query_id))
        except Exception as error:  # options the sink refuses: no run, no id
            print(f"no sink id for {self.options}: {error}")

    def prepare_piece_by_hand(
        self, sink_id: str, batch_id: int, partition_id: int, rows: list[tuple[int, str]]
    ) -> tuple[Any, PreparedPiece]:
        """Prepare a piece as a task of ``sink_id`` would, outside Spark, and return the
        writer with it: what a speculative copy (or another sink) leaves when it prepared
        and Spark never received its message."""
        writer = self.sink.stream_writer(self.options)
        ids = [row_id for row_id, _ in rows]
        groups = [group for _, group in rows]
        if self.sink.adapter.as_kafka_records:
            columns = {"key": groups, "value": [str(row_id) for row_id in ids]}
        else:
            columns = {
                "id": pa.array(ids, pa.int64()),
                "grp": groups,
                "version": pa.array([batch_id] * len(ids), pa.int64()),
            }
        # the query's id, as Spark gives every task of it: a piece of another query is
        # that query's to recover (2pc-kafka's pooled ids name their query)
        task = TaskIdentity(
            sink_id,
            batch_id,
            partition_id,
            attempt_string(1, "handmade"),
            query_id=self.query_id(),
        )
        piece = writer.prepare(task, iter(pa.table(columns).to_batches()))
        return writer, piece

    def roll_back_by_hand(self, writer: Any, piece: PreparedPiece) -> None:
        resource = writer.open_resource()
        try:
            resource.rollback_piece(piece)
        finally:
            resource.close()

    # Checks ----------------------------------------------------------------------------

    def assert_nothing_doubled(
        self, also_expected: Rows | None = None, at_least_once: Rows | None = None
    ) -> None:
        """At any moment: no row visible twice (but rows of ``at_least_once``, replayed by
        an at-least-once run, at most twice), no row that was never input."""
        rows = self.sink.rows(self.options)
        allowed_twice = set(at_least_once or ())
        doubled = sorted(
            row for row, count in rows.items() if count > (2 if row in allowed_twice else 1)
        )
        assert doubled == [], f"{self.sink.adapter.name}: rows applied twice: {doubled[:10]}"
        allowed = set(self.expected()) | set(also_expected or ())
        assert set(rows) <= allowed, f"rows never input: {sorted(set(rows) - allowed)[:10]}"

    def assert_each_row_once(
        self, also: ContractRun | None = None, at_least_once: Rows | None = None
    ) -> None:
        """After a clean run: each row once (rows of ``at_least_once``: once or twice), no
        leftovers, every decision done."""
        expected = self.expected() + (also.expected() if also else Counter())
        sink_ids = self.sink_ids | (also.sink_ids if also else set())
        rows = self.sink.rows(self.options)
        for row in at_least_once or ():
            if rows[row] == 2:
                rows[row] = 1
        missing = sorted((expected - rows).elements())
        extra = sorted((rows - expected).elements())
        assert not missing and not extra, (
            f"{self.sink.adapter.name}: {len(missing)} rows missing {missing[:10]},"
            f" {len(extra)} extra {extra[:10]}"
        )
        assert self.sink.leftovers(sink_ids, self.options) == []
        pending = {
            key: status
            for key, status in self.sink.decisions(sink_ids, self.options).items()
            if status == "pending"
        }
        assert pending == {}, f"decisions not done: {pending}"
        self.assert_inspection_clean(sink_ids)

    def assert_inspection_clean(self, sink_ids: set[str]) -> None:
        """The sink's own report (``TransactionalResource.inspect``, read only) agrees with
        the store read above: nothing left behind and no decision waiting, for each id."""
        for sink_id in sorted(sink_ids):
            options = {**self.options, "sinkId": sink_id}
            state = inspect_sink(self.sink.adapter.sink_format, SINK_ID_GIVEN, options)
            assert state.is_clean, (
                f"{self.sink.adapter.name} sink {sink_id}: inspection reports"
                f" {[leftover.what for leftover in state.leftovers]} left behind and batches"
                f" {[decision.batch_id for decision in state.unfinished]} not done"
            )
