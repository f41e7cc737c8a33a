"""``format("2pc-jdbc")``: an exactly-once streaming sink into PostgreSQL or SQLite.

Guarantee: with ``deliveryGuarantee=exactly-once`` (default) every row of every
micro-batch takes effect in ``dbtable`` exactly once, across crashes of the driver, of
executors and of database connections, provided the query restarts from its checkpoint
and nothing else writes the sink's ledger rows. Tasks prepare (a PostgreSQL prepared
transaction, or tagged rows in a staging table), the driver records the batch in the
ledger and commits (``commit_protocols``). Limits: ``prepared`` keeps a batch's row locks
until the driver commits, so two tasks of one batch upserting the same key wait for
each other until ``lockTimeout`` (120 s) fails the batch: repartition by ``upsertKeys``
or use ``protocol=staging``. ``complete`` output mode is not supported.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator, Sequence

import pyarrow as pa
import pymysql
from pyspark.sql.datasource import DataSource, WriterCommitMessage
from pyspark.sql.types import StructType

from eospack.core.logs import make_logs_visible

from ...commit_protocols import TaskIdentity, TransactionalResource, TwoPhaseCommitStreamWriter
from ...commit_protocols.pieces import PreparedPiece
from .errors import JdbcSinkOptionError, JdbcWriteError
from .options import JdbcSinkOptions, parse_options
from .planning import SinkPlan, plan_sink
from .resource import DATABASE_CONNECTION_ERRORS, open_resource
from .writer import TaskWriter

logger = logging.getLogger(__name__)
SINK_NAME = "2pc-jdbc"
LOCK_NOT_AVAILABLE = "55P03"
OUT_OF_MEMORY = "53200"
MYSQL_LOCK_WAIT_TIMEOUT = 1205
"""PostgreSQL's SQLSTATE for "maximum number of prepared transactions reached"."""
SERVER_SHUTDOWN = frozenset({"57P01", "57P02", "57P03"})


class TwoPhaseJdbcDataSource(DataSource):
    """``df.writeStream.format("2pc-jdbc")``: see the module docstring for the guarantee."""

    @classmethod
    def name(cls) -> str:
        return SINK_NAME

    def streamWriter(self, schema: StructType, overwrite: bool) -> JdbcStreamWriter:
        make_logs_visible()
        options = parse_options(self.options)
        if overwrite:
            raise JdbcSinkOptionError(
                "outputMode complete is not supported by 2pc-jdbc: use append (with"
                " writeMode=upsert and versionColumn to keep the latest value per key)"
            )
        return JdbcStreamWriter(options, plan_sink(options, schema))


class JdbcStreamWriter(TwoPhaseCommitStreamWriter):
    """Prepares on executors (``writer.TaskWriter``), commits on the driver (``resource``)."""

    sink_name = SINK_NAME

    def __init__(self, options: JdbcSinkOptions, plan: SinkPlan) -> None:
        super().__init__(options.sink_id, options.target, options.exactly_once)
        self.options = options
        self.plan = plan

    def __repr__(self) -> str:
        return f"JdbcStreamWriter({self.options.describe()}, protocol={self.plan.protocol})"

    def _task_writer(self) -> TaskWriter:
        return TaskWriter(self.options, self.plan)

    def prepare(self, task: TaskIdentity, batches: Iterator[pa.RecordBatch]) -> PreparedPiece:
        with self._failing_clearly(f"task {task.partition_id} of batch {task.batch_id}"):
            return self._task_writer().prepare(task, self._with_batch_id(task, batches))

    def write_directly(self, task: TaskIdentity, batches: Iterator[pa.RecordBatch]) -> int:
        with self._failing_clearly(f"task {task.partition_id} of batch {task.batch_id}"):
            return self._task_writer().write_directly(task, self._with_batch_id(task, batches))

    def _with_batch_id(
        self, task: TaskIdentity, batches: Iterator[pa.RecordBatch]
    ) -> Iterator[pa.RecordBatch]:
        """Adds ``batchIdColumn``: a replay of batch N writes N again, so it stays exact."""
        name = self.options.batch_id_column
        if name is None:
            return batches
        return (
            batch.append_column(name, pa.array([task.batch_id] * batch.num_rows, pa.int64()))
            for batch in batches
        )

    def open_resource(self) -> TransactionalResource:
        return open_resource(self.options, self.plan)

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        with self._failing_clearly(f"the commit of batch {batchId}"):
            super().commit(messages, batchId)

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        with self._failing_clearly(f"the abort of batch {batchId}"):
            super().abort(messages, batchId)

    def _failing_clearly(self, what: str) -> _ConnectionErrors:
        return _ConnectionErrors(f"{SINK_NAME} lost {self.options.describe()} during {what}")


class _ConnectionErrors:
    """Turns a dropped or refused database connection into one clear JdbcWriteError."""

    def __init__(self, context: str) -> None:
        self.context = context

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, error: BaseException | None, traceback: object) -> None:
        if not isinstance(error, DATABASE_CONNECTION_ERRORS):
            return
        detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if isinstance(error, sqlite3.Error):
            raise JdbcWriteError(
                f"{self.context}: SQLite error ({detail}); restart the query from its checkpoint"
                " once the file is writable: exactly-once holds"
            ) from error
        if isinstance(error, pymysql.err.MySQLError):
            if error.args and error.args[0] == MYSQL_LOCK_WAIT_TIMEOUT:
                raise JdbcWriteError(
                    f"{self.context}: waited longer than lockTimeout for a row lock ({detail}):"
                    " another writer holds it"
                ) from error
            raise JdbcWriteError(
                f"{self.context}: connection error ({detail}); once the database is back,"
                " restart the query from its checkpoint: exactly-once holds"
            ) from error
        sqlstate = getattr(error, "sqlstate", None)
        if sqlstate == LOCK_NOT_AVAILABLE:
            raise JdbcWriteError(
                f"{self.context}: waited longer than lockTimeout for a row lock ({detail}):"
                " two tasks of one batch write the same key (repartition by upsertKeys or use"
                " protocol=staging) or another writer holds it"
            ) from error
        if sqlstate == OUT_OF_MEMORY and "prepared transactions" in detail:
            raise JdbcWriteError(
                f"{self.context}: {detail}: raise max_prepared_transactions on the server above"
                " the tasks of one batch, coalesce the DataFrame, or use protocol=staging"
            ) from error
        if sqlstate is None or sqlstate.startswith("08") or sqlstate in SERVER_SHUTDOWN:
            raise JdbcWriteError(
                f"{self.context}: connection error ({detail}); once the database is back,"
                " restart the query from its checkpoint: exactly-once holds"
            ) from error
