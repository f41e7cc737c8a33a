"""One adapter per two-phase-commit sink: everything the contract suite needs to know of it.

Decisions (why the adapters look the way they do):

- An adapter class holds what is known without services (its name, format, fixtures,
  crash points, resource call names, documented options, option changes, the cases that do
  not apply and why), so that pytest can parametrize and mark cases at collection time. A
  bound adapter (``open``) holds one test's target: a table, an S3 prefix or a topic named
  after the test, and reads that target's state straight from the service.
- The end state is read from the service, never from the sink's own code paths: output
  rows as a ``Counter`` (a row twice counts 2), leftovers as one readable line each
  (prepared transactions, staged rows, multipart uploads in progress, open Kafka
  transactions), decisions normalised to ``done`` / ``pending`` / ``aborted`` (a fence).
  Leftovers and decisions are asked for the sink ids a test's runs used (an option change
  that gives the sink another id must not hide the first id's leftovers); S3 uploads and
  staged rows are listed for the whole target, which belongs to the test.
- The sink id of a run is what the sink derives: the connector's own option parser gives
  the target, the checkpoint's metadata the query id (``derive_sink_id``).
- Option changes across a restart keep the target and change how it is addressed or how
  the sink runs; each is a pure function of a bound adapter's options, so the same change
  runs in the chained default-lane test and alone in the chaos lane.
- A case that cannot apply to a sink is not silently passed: the adapter names the reason
  and the case skips with it (``not_applicable``).
- Known holes of a sink (issue 25) are marks on the adapter's parameters
  (``pytest.mark.xfail(strict=True)``), so that a fix turns them into failures to remove.
- 2pc-kafka on Kafka as production runs it (issue 37: a 3-node cluster, a SASL_SSL broker
  with a least-privilege user) is the same adapter bound to another fixture
  (``PRODUCTION_ADAPTERS``), kept out of ``ADAPTERS`` so that ``make test`` never starts
  those brokers; ``test_sink_contract_production_kafka.py`` runs them.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import psycopg
import pytest
from pyspark.sql.types import StructType

from eospack.commit_protocols import ALL_FAULT_POINTS, derive_sink_id, sink_prefix

Options = dict[str, str]
Rows = Counter[tuple[int, str]]

EXACTLY_ONCE = "exactly-once"
AT_LEAST_ONCE = "at-least-once"


def hole(number: int, what: str) -> pytest.MarkDecorator:
    """A case that fails because of 2pc-kafka's hole ``number`` of issue 25 (being fixed)."""
    return pytest.mark.xfail(strict=True, reason=f"issue 25 hole {number}: {what}")


@dataclass(frozen=True)
class OptionChange:
    """One change a user could make across a restart, keeping the target."""

    name: str
    change: Callable[[BoundSink, Options], Options]
    """From the options of the run before to those of the restart."""
    mark: pytest.MarkDecorator | None = None
    refusal_allowed: str | None = None
    """If the sink may refuse the restart instead (a one-line error naming this option),
    after which the test restarts with the previous options; None: it must run."""
    follows: str | None = None
    """The change this one undoes (run first when this one runs alone)."""
    chaos_only: bool = False
    """Left out of the default lane's chain (a value that may differ, not another address
    of the target: the cost of a restart each, for what one real query rarely misses)."""


@dataclass(frozen=True)
class DocumentedOption:
    """One option of the sink's docs page table with a valid value (a function of the bound sink
    when the value depends on the service, e.g. a URL)."""

    name: str
    sample: str | Callable[[BoundSink], str]
    mark: pytest.MarkDecorator | None = None
    extra: Mapping[str, str] = field(default_factory=dict)
    """Options the sample needs with it (``upsertKeys`` with ``writeMode=upsert``)."""


@dataclass(frozen=True)
class CallFaults:
    """The sink's resource call names (``eospack.core.faults``)."""

    decide: str
    """The decision's write (for an atomic protocol, the commit itself)."""
    commit_piece: str | None
    """One piece's commit; None for a protocol that commits a batch in one transaction."""
    prepare: str | None
    """A task's last call before it reports its piece (a ``crash`` there kills its worker);
    None where the sink's task makes no named call (2pc-jdbc's staging protocol)."""
    every: tuple[str, ...]
    """Every call the chaos lane faults, before and after it applies."""


class BoundSink:
    """An adapter bound to one test's target (see the module docstring)."""

    adapter: type[SinkAdapter]

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path, name: str) -> None:
        self.request = request
        self.tmp_path = tmp_path
        self.name = name
        self.spark = request.getfixturevalue("spark")

    def base_options(self) -> Options:
        """The target and how to reach it: what every run of the test passes."""
        raise NotImplementedError

    def rows(self, options: Options) -> Rows:
        """The output rows as (id, grp), each as often as it is visible to readers."""
        raise NotImplementedError

    def stream_writer(self, options: Options) -> Any:
        """The sink's own stream writer for ``options``, as Spark makes it at query start
        (it says the target and sink id; tests use it to prepare a piece by hand)."""
        module, _, name = self.adapter.data_source.partition(":")
        source_class = getattr(importlib.import_module(module), name)
        source = source_class({key.lower(): value for key, value in options.items()})
        return source.streamWriter(StructType.fromDDL(self.adapter.schema), False)

    def sink_id(self, options: Options, query_id: str) -> str:
        """The id the sink derives: from the query id and the target its writer names."""
        writer = self.stream_writer(options)
        return writer.sink_id or derive_sink_id(query_id, writer.target)

    def leftovers(self, sink_ids: set[str], options: Options) -> list[str]:
        """Prepared, staged, in-progress or open work of these sinks, one line each."""
        raise NotImplementedError

    def decisions(self, sink_ids: set[str], options: Options) -> dict[tuple[str, int], str]:
        """Each decision of these sinks: ``done``, ``pending`` or ``aborted`` (a fence)."""
        raise NotImplementedError

    @contextlib.contextmanager
    def another_sink_mid_decision(self, options: Options) -> Iterator[None]:
        """While inside: another sink sharing this sink's ledger or prefix is stuck in the
        middle of writing a decision (it crashed, or hangs, with the write open)."""
        yield

    def slow_batch(self) -> tuple[Options, float]:
        """Options with a short timeout on prepared work, and how long a task must stall
        to outlive it; only for sinks whose ``timeout_not_applicable`` is None."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the bound adapter holds (clients, held transactions)."""


class SinkAdapter:
    """What the contract suite knows of one sink without services (see module docstring)."""

    name: ClassVar[str]
    sink_format: ClassVar[str]
    fixtures: ClassVar[tuple[str, ...]]
    data_source: ClassVar[str]
    """``module:Class`` of the sink's DataSource."""
    schema: ClassVar[str] = "id BIGINT, grp STRING, version BIGINT"
    """The schema the sink receives (``inputs.start_query``)."""
    as_kafka_records: ClassVar[bool] = False
    crash_points: ClassVar[tuple[str, ...]] = ALL_FAULT_POINTS
    default_crash_point: ClassVar[str] = "between_piece_commits"
    calls: ClassVar[CallFaults]
    documented_options: ClassVar[tuple[DocumentedOption, ...]]
    option_changes: ClassVar[tuple[OptionChange, ...]]
    timeout_not_applicable: ClassVar[str | None] = None
    """Why "a batch slower than the sink's timeout" cannot happen, or None."""
    marks: ClassVar[Mapping[str, pytest.MarkDecorator]] = {}
    """Per case (the test function's name): a known hole of this sink."""
    bound: ClassVar[type[BoundSink]]

    @classmethod
    def open(cls, request: pytest.FixtureRequest, tmp_path: Path, name: str) -> BoundSink:
        for fixture in cls.fixtures:
            request.getfixturevalue(fixture)
        sink = cls.bound(request, tmp_path, name)
        sink.adapter = cls
        return sink


# 2pc-jdbc ------------------------------------------------------------------------------


class JdbcSink(BoundSink):
    """Shared by the PostgreSQL and SQLite adapters: ledger and stage table are SQL."""

    table: str

    def parsed(self, options: Options) -> Any:
        from eospack.connectors.jdbc.options import parse_options

        return parse_options({key.lower(): value for key, value in options.items()})

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def table_exists(self, name: str) -> bool:
        raise NotImplementedError

    def rows(self, options: Options) -> Rows:
        if not self.table_exists(self.table):
            return Counter()
        return Counter(
            (int(row[0]), str(row[1])) for row in self.query(f'SELECT id, grp FROM "{self.table}"')
        )

    def staged_rows(self, sink_ids: set[str]) -> int:
        """Rows of these sinks in the table's stage (tagged with their piece ids)."""
        from eospack.connectors.jdbc.dialect import PIECE_COLUMN, TableName, stage_table

        stage = stage_table(TableName(None, self.table))
        if not self.table_exists(stage.name):
            return 0
        pieces = self.query(f'SELECT "{PIECE_COLUMN}" FROM {stage.sql()}')
        prefixes = tuple(sink_prefix(sink_id) for sink_id in sink_ids)
        return sum(1 for (piece,) in pieces if str(piece).startswith(prefixes))

    def decisions(self, sink_ids: set[str], options: Options) -> dict[tuple[str, int], str]:
        ledger = self.parsed(options).ledger_table
        if not self.table_exists(ledger.name) or not sink_ids:
            return {}
        marks = ", ".join("?" if isinstance(self, SqliteSink) else "%s" for _ in sink_ids)
        found = self.query(
            f"SELECT sink_id, batch_id, status FROM {ledger.sql()} WHERE sink_id IN ({marks})",
            tuple(sorted(sink_ids)),
        )
        statuses = {"done": "done", "aborted": "aborted"}
        return {(str(s), int(b)): statuses.get(str(status), "pending") for s, b, status in found}


class PostgresSink(JdbcSink):
    protocol: ClassVar[str]

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path, name: str) -> None:
        super().__init__(request, tmp_path, name)
        self.server = request.getfixturevalue("postgres")
        self.table = name

    def base_options(self) -> Options:
        endpoint = self.server.endpoint
        options = {
            "url": endpoint.jdbc_url,
            "user": endpoint.user,
            "dbtable": self.table,
            "createTableIfNotExists": "true",
            "protocol": self.protocol,
        }
        if endpoint.password:
            options["password"] = endpoint.password
        return options

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.server.endpoint.url) as connection:
            return connection.execute(sql, params).fetchall()  # type: ignore[arg-type]

    def table_exists(self, name: str) -> bool:
        return bool(self.query("SELECT to_regclass(%s)", (f'"{name}"',))[0][0])

    def leftovers(self, sink_ids: set[str], options: Options) -> list[str]:
        prepared = self.query("SELECT gid FROM pg_prepared_xacts ORDER BY gid")
        found = [
            f"prepared transaction {gid}"
            for (gid,) in prepared
            if any(str(gid).startswith(sink_prefix(sink_id)) for sink_id in sink_ids)
        ]
        staged = self.staged_rows(sink_ids)
        return [*found, *([f"{staged} staged rows"] if staged else [])]

    @contextlib.contextmanager
    def another_sink_mid_decision(self, options: Options) -> Iterator[None]:
        """Another sink's decision INSERT into the shared ledger, its transaction left open
        (a driver hung, or its session not yet ended by the server after a crash)."""
        ledger = self.parsed(options).ledger_table
        with psycopg.connect(self.server.endpoint.url) as connection:
            connection.execute(
                f"INSERT INTO {ledger.sql()} (sink_id, batch_id, target, protocol, rows, status,"
                " pieces) VALUES ('another_sink_mid_decision', 0, %s, %s, 0, 'decided', '[]')",
                (self.table, self.protocol),
            )
            try:
                yield
            finally:
                connection.rollback()


def _jdbc_url_forms(sink: BoundSink, options: Options, form: str) -> Options:
    endpoint = sink.server.endpoint  # type: ignore[attr-defined]
    urls = {
        "libpq": f"postgresql://{endpoint.host}:{endpoint.port}/{endpoint.database}",
        "parameters": f"{endpoint.jdbc_url}?application_name=contract&connect_timeout=7",
        "localhost": endpoint.jdbc_url.replace(endpoint.host, "localhost"),
    }
    return {**options, "url": urls[form]}


def _switch(name: str, value: str) -> Callable[[BoundSink, Options], Options]:
    return lambda _sink, options: {**options, name: value}


POSTGRES_OPTIONS: tuple[DocumentedOption, ...] = (
    DocumentedOption("url", lambda sink: sink.server.endpoint.jdbc_url),  # type: ignore[attr-defined]
    DocumentedOption("dbtable", lambda sink: sink.table),  # type: ignore[attr-defined]
    DocumentedOption("user", lambda sink: sink.server.endpoint.user),  # type: ignore[attr-defined]
    DocumentedOption("password", lambda sink: sink.server.endpoint.password or "unused"),  # type: ignore[attr-defined]
    DocumentedOption("batchsize", "7"),
    DocumentedOption("writeMode", "upsert", extra={"upsertKeys": "id"}),
    DocumentedOption("upsertKeys", "id", extra={"writeMode": "upsert"}),
    DocumentedOption("versionColumn", "version", extra={"writeMode": "upsert", "upsertKeys": "id"}),
    DocumentedOption("batchIdColumn", "written_by_batch"),
    DocumentedOption("deliveryGuarantee", EXACTLY_ONCE),
    DocumentedOption("protocol", "auto"),
    DocumentedOption("createTableIfNotExists", "true"),
    DocumentedOption("ledgerTable", "public.contract_ledger"),
    DocumentedOption("sinkId", "contract_documented_options"),
    DocumentedOption("lockTimeout", "30s"),
)


class PreparedPostgresSink(PostgresSink):
    protocol = "prepared"


class StagingPostgresSink(PostgresSink):
    protocol = "staging"


class JdbcPrepared(SinkAdapter):
    name = "jdbc-prepared"
    sink_format = "2pc-jdbc"
    data_source = "eospack.connectors.jdbc.sink:TwoPhaseJdbcDataSource"
    fixtures = ("postgres",)
    calls = CallFaults(
        decide="jdbc.decide",
        commit_piece="jdbc.commit_piece",
        prepare="jdbc.prepare",
        every=(
            "jdbc.prepare",
            "jdbc.find_decision",
            "jdbc.decide",
            "jdbc.fence",
            "jdbc.commit_piece",
        ),
    )
    documented_options = POSTGRES_OPTIONS
    option_changes = (
        OptionChange("url_libpq_form", lambda s, o: _jdbc_url_forms(s, o, "libpq")),
        OptionChange("url_with_parameters", lambda s, o: _jdbc_url_forms(s, o, "parameters")),
        OptionChange("url_localhost", lambda s, o: _jdbc_url_forms(s, o, "localhost")),
        OptionChange("batchsize", _switch("batchsize", "3"), chaos_only=True),
        OptionChange("lockTimeout", _switch("lockTimeout", "45s"), chaos_only=True),
        OptionChange("protocol_to_staging", _switch("protocol", "staging")),
        OptionChange(
            "protocol_back_to_prepared",
            _switch("protocol", "prepared"),
            follows="protocol_to_staging",
        ),
    )
    timeout_not_applicable = (
        "a PostgreSQL prepared transaction has no timeout: it waits for COMMIT PREPARED"
        " however slow the batch (lockTimeout bounds lock waits, not prepared work)"
    )
    bound = PreparedPostgresSink


class JdbcStaging(SinkAdapter):
    name = "jdbc-staging"
    sink_format = "2pc-jdbc"
    data_source = "eospack.connectors.jdbc.sink:TwoPhaseJdbcDataSource"
    fixtures = ("postgres",)
    crash_points = ("after_prepare", "before_decision", "after_decision", "after_commit")
    default_crash_point = "after_decision"
    calls = CallFaults(
        decide="jdbc.decide",
        commit_piece=None,
        prepare=None,
        every=("jdbc.find_decision", "jdbc.decide", "jdbc.fence"),
    )
    documented_options = POSTGRES_OPTIONS
    option_changes = (
        OptionChange("url_libpq_form", lambda s, o: _jdbc_url_forms(s, o, "libpq")),
        OptionChange("url_with_parameters", lambda s, o: _jdbc_url_forms(s, o, "parameters")),
        OptionChange("batchsize", _switch("batchsize", "3"), chaos_only=True),
        OptionChange("protocol_to_prepared", _switch("protocol", "prepared")),
        OptionChange(
            "protocol_back_to_staging",
            _switch("protocol", "staging"),
            follows="protocol_to_prepared",
        ),
    )
    timeout_not_applicable = (
        "staged rows are committed rows of a table: nothing times out between the tasks'"
        " COPY and the driver's move"
    )
    bound = StagingPostgresSink


class SqliteSink(JdbcSink):
    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path, name: str) -> None:
        super().__init__(request, tmp_path, name)
        self.database = tmp_path / "contract.sqlite"
        self.table = name

    def base_options(self) -> Options:
        return {
            "url": f"jdbc:sqlite:{self.database}",
            "dbtable": self.table,
            "createTableIfNotExists": "true",
        }

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        if not self.database.exists():
            return []
        with contextlib.closing(sqlite3.connect(self.database, timeout=60)) as connection:
            return connection.execute(sql, params).fetchall()

    def table_exists(self, name: str) -> bool:
        found = self.query("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,))
        return bool(found)

    def leftovers(self, sink_ids: set[str], options: Options) -> list[str]:
        staged = self.staged_rows(sink_ids)
        return [f"{staged} staged rows"] if staged else []


def _sqlite_path_form(sink: BoundSink, options: Options) -> Options:
    database: Path = sink.database  # type: ignore[attr-defined]
    return {**options, "url": f"jdbc:sqlite:{database.parent}/./{database.name}"}


class JdbcSqlite(SinkAdapter):
    name = "jdbc-sqlite"
    sink_format = "2pc-jdbc"
    data_source = "eospack.connectors.jdbc.sink:TwoPhaseJdbcDataSource"
    fixtures = ()
    crash_points = JdbcStaging.crash_points
    default_crash_point = "after_decision"
    calls = JdbcStaging.calls
    documented_options = (
        DocumentedOption("url", lambda sink: f"jdbc:sqlite:{sink.database}"),  # type: ignore[attr-defined]
        DocumentedOption("dbtable", lambda sink: sink.table),  # type: ignore[attr-defined]
        DocumentedOption("batchsize", "7"),
        DocumentedOption("writeMode", "upsert", extra={"upsertKeys": "id"}),
        DocumentedOption("batchIdColumn", "written_by_batch"),
        DocumentedOption("deliveryGuarantee", EXACTLY_ONCE),
        DocumentedOption("protocol", "staging"),
        DocumentedOption("createTableIfNotExists", "true"),
        DocumentedOption("ledgerTable", "contract_ledger"),
        DocumentedOption("sinkId", "contract_documented_options"),
    )
    option_changes = (
        OptionChange("url_same_file_another_path", _sqlite_path_form),
        OptionChange("batchsize", _switch("batchsize", "3"), chaos_only=True),
    )
    timeout_not_applicable = JdbcStaging.timeout_not_applicable
    bound = SqliteSink


# 2pc-s3 --------------------------------------------------------------------------------


class Bucket:
    """What a test inspects under one prefix, straight from S3."""

    def __init__(self, s3: Any, prefix: str) -> None:
        self.client = s3.endpoint.client()
        self.bucket = s3.endpoint.bucket
        self.prefix = prefix

    def manifests(self, sink_id: str | None = None) -> dict[int, dict[str, Any]]:
        """Each batch's decision manifest (of one sink, or of the only one), by batch id."""
        found = {}
        below = f"{self.prefix}/_eospack/manifests/{sink_id + '/' if sink_id else ''}"
        for key in self._keys(below):
            if key.rsplit("/", 1)[-1].count(".") != 1:
                continue  # at-least-once task manifests: <batch>.<partition>.<attempt>.json
            body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
            manifest = json.loads(body)
            found[manifest["batch_id"]] = manifest
        return dict(sorted(found.items()))

    def all_manifests(self) -> list[dict[str, Any]]:
        keys = self._keys(f"{self.prefix}/_eospack/manifests/")
        bodies = (
            self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read() for key in keys
        )
        return [json.loads(body) for body in bodies]

    def uploads(self) -> list[dict[str, Any]]:
        answer = self.client.list_multipart_uploads(Bucket=self.bucket, Prefix=f"{self.prefix}/")
        return list(answer.get("Uploads", ()))

    def upload_ids(self) -> set[str]:
        return {upload["UploadId"] for upload in self.uploads()}

    def data_keys(self) -> set[str]:
        return {key for key in self._keys(f"{self.prefix}/") if "/_eospack/" not in key}

    def _keys(self, prefix: str) -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix
        )
        return [entry["Key"] for page in pages for entry in page.get("Contents", ())]


def named_upload_ids(manifest: Mapping[str, Any]) -> set[str]:
    return {file["upload_id"] for piece in manifest["pieces"] for file in piece["handle"]["files"]}


class S3Sink(BoundSink):
    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path, name: str) -> None:
        super().__init__(request, tmp_path, name)
        self.s3 = request.getfixturevalue("s3")
        self.path = f"s3://{self.s3.endpoint.bucket}/{name}"
        self.bucket = Bucket(self.s3, name)

    def credentials(self) -> Options:
        endpoint = self.s3.endpoint
        return {
            "endpointUrl": endpoint.endpoint_url,
            "accessKeyId": endpoint.access_key_id,
            "secretAccessKey": endpoint.secret_access_key,
            "region": endpoint.region,
        }

    def base_options(self) -> Options:
        return {"path": self.path, "partitionBy": "grp", **self.credentials()}

    def rows(self, options: Options) -> Rows:
        frame = self.spark.read.format("2pc-s3").options(**self.credentials()).load(self.path)
        if not self.bucket.all_manifests():
            return Counter()
        return Counter((int(r[0]), str(r[1])) for r in frame.select("id", "grp").collect())

    def leftovers(self, sink_ids: set[str], options: Options) -> list[str]:
        return [
            f"upload in progress {upload['Key']}"
            for upload in self.bucket.uploads()
            if any(sink_prefix(sink_id) in upload["Key"] for sink_id in sink_ids)
        ]

    def decisions(self, sink_ids: set[str], options: Options) -> dict[tuple[str, int], str]:
        in_progress = self.bucket.upload_ids()
        found = {}
        for manifest in self.bucket.all_manifests():
            if manifest["sink_id"] not in sink_ids or "status" not in manifest:
                continue
            if manifest["status"] == "aborted":
                status = "aborted"
            elif named_upload_ids(manifest) & in_progress:
                status = "pending"
            else:
                status = "done"
            found[(manifest["sink_id"], int(manifest["batch_id"]))] = status
        return found


def _s3_path_form(form: str) -> Callable[[BoundSink, Options], Options]:
    def change(sink: BoundSink, options: Options) -> Options:
        path: str = sink.path  # type: ignore[attr-defined]
        forms = {"s3a": path.replace("s3://", "s3a://", 1), "trailing_slash": f"{path}/"}
        return {**options, "path": forms[form]}

    return change


def _s3_endpoint_localhost(sink: BoundSink, options: Options) -> Options:
    return {**options, "endpointUrl": options["endpointUrl"].replace("127.0.0.1", "localhost")}


class S3(SinkAdapter):
    name = "s3"
    sink_format = "2pc-s3"
    data_source = "eospack.connectors.s3.sink:TwoPhaseS3DataSource"
    fixtures = ("s3",)
    calls = CallFaults(
        decide="s3.PutObject",
        commit_piece="s3.CompleteMultipartUpload",
        prepare="s3.UploadPart",
        every=(
            "s3.CreateMultipartUpload",
            "s3.UploadPart",
            "s3.PutObject",
            "s3.GetObject",
            "s3.CompleteMultipartUpload",
            "s3.AbortMultipartUpload",
            "s3.ListMultipartUploads",
        ),
    )
    documented_options = (
        DocumentedOption("path", lambda sink: sink.path),  # type: ignore[attr-defined]
        DocumentedOption("fileFormat", "jsonl"),
        DocumentedOption("partitionBy", "grp"),
        DocumentedOption("targetFileSize", "1m"),
        DocumentedOption("endpointUrl", lambda sink: sink.s3.endpoint.endpoint_url),  # type: ignore[attr-defined]
        DocumentedOption("region", lambda sink: sink.s3.endpoint.region),  # type: ignore[attr-defined]
        DocumentedOption("accessKeyId", lambda sink: sink.s3.endpoint.access_key_id),  # type: ignore[attr-defined]
        DocumentedOption("secretAccessKey", lambda sink: sink.s3.endpoint.secret_access_key),  # type: ignore[attr-defined]
        DocumentedOption("sessionToken", "contract-session-token"),
        DocumentedOption("deliveryGuarantee", EXACTLY_ONCE),
        DocumentedOption("sinkId", "contract_documented_options"),
    )
    option_changes = (
        OptionChange("path_s3a", _s3_path_form("s3a")),
        OptionChange("path_trailing_slash", _s3_path_form("trailing_slash")),
        OptionChange("endpoint_localhost", _s3_endpoint_localhost),
        OptionChange("targetFileSize", _switch("targetFileSize", "2m"), chaos_only=True),
        OptionChange("fileFormat_jsonl", _switch("fileFormat", "jsonl"), chaos_only=True),
    )
    timeout_not_applicable = (
        "an S3 multipart upload has no timeout of its own (only a bucket lifecycle rule"
        " aborts it: test_s3_faults' decided-upload-aborted test)"
    )
    bound = S3Sink


# 2pc-kafka -----------------------------------------------------------------------------


class KafkaSink(BoundSink):
    broker_fixture: ClassVar[str] = "real_kafka"
    """The fixture of the broker the sink writes to (subclasses: a cluster, a secured one)."""

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path, name: str) -> None:
        super().__init__(request, tmp_path, name)
        self.kafka = request.getfixturevalue(self.broker_fixture)
        self.bootstrap = self.kafka.endpoint.bootstrap_servers
        self.topic = self.topic_name(name)
        self.ledger_topic = f"{self.topic}_ledger"
        self.create_output_topic()
        self.held: list[Any] = []

    def topic_name(self, name: str) -> str:
        return name

    def create_output_topic(self) -> None:
        from eospack.lab.services.kafka_tools import create_topic

        create_topic(self.bootstrap, self.topic, 2)

    def client(self) -> dict[str, Any]:
        """kafka-python settings (beyond the bootstrap list) of the test's own reads and
        writes: the end state is read as a user who sees everything."""
        return {}

    def base_options(self) -> Options:
        # a ledger topic of the test's own: an open ledger transaction of one test must
        # not pin the ledger of the next (hole 1)
        return {
            "kafka.bootstrap.servers": self.bootstrap,
            "topic": self.topic,
            "ledgerTopic": self.ledger_topic,
        }

    def parsed(self, options: Options) -> Any:
        from eospack.connectors.kafka.sink.options import parse_options

        return parse_options({key.lower(): value for key, value in options.items()})

    def config(self) -> dict[str, Any]:
        return {"bootstrap_servers": self.bootstrap, **self.client()}

    def rows(self, options: Options) -> Rows:
        from eospack.lab.services.kafka_tools import read_all

        records = read_all(
            self.bootstrap, self.topic, isolation_level="read_committed", client=self.client()
        )
        return Counter(
            (int(value.decode()), key.decode())
            for _, _, key, value in records
            if key is not None and value is not None
        )

    def leftovers(self, sink_ids: set[str], options: Options) -> list[str]:
        from eospack.connectors.kafka.client.transactions import open_transactions

        found = []
        for sink_id in sorted(sink_ids):
            for prefix in (sink_prefix(sink_id), f"eospack-ledger-{sink_id}"):
                found += [f"open transaction {t}" for t in open_transactions(self.config(), prefix)]
        return found

    def decisions(self, sink_ids: set[str], options: Options) -> dict[tuple[str, int], str]:
        from eospack.connectors.kafka.sink.ledger import read_slots

        found = {}
        ledgers = {self.ledger_topic, self.parsed(options).ledger_topic}
        for ledger in sorted(ledgers):
            for sink_id in sorted(sink_ids):
                for batch, slot in read_slots(self.config(), ledger, sink_id).items():
                    statuses = {"done": "done", "aborted": "aborted"}
                    found[(sink_id, batch)] = statuses.get(slot.status, "pending")
        return found

    @contextlib.contextmanager
    def another_sink_mid_decision(self, options: Options) -> Iterator[None]:
        """Another sink's ledger transaction, opened with a record on the shared ledger
        topic and neither committed nor aborted (a driver killed while writing its
        decision): it holds the ledger's last stable offset until the broker times it
        out."""
        from eospack.connectors.kafka.sink.ledger import ensure_ledger_topic
        from eospack.lab.services.kafka_tools import transactional_producer

        parsed = self.parsed(options)
        ensure_ledger_topic(parsed)
        producer = transactional_producer(
            self.bootstrap, "eospack-ledger-another_sink_mid_decision", **self.client()
        )
        try:
            producer.begin_transaction()
            producer.send(
                parsed.ledger_topic,
                key=b"another_sink_mid_decision/0",
                value=json.dumps({"pieces": [], "status": "decided"}).encode(),
                partition=0,
            ).get(timeout=30)
            yield
        finally:
            with contextlib.suppress(Exception):
                producer.abort_transaction()
            producer.close(timeout=5)

    def slow_batch(self) -> tuple[Options, float]:
        # the broker aborts a timed-out transaction at its next check, at most
        # transaction.abort.timed.out.transaction.cleanup.interval.ms (10 s) later
        return {"kafka.transaction.timeout.ms": "2000"}, 20.0


def _bootstrap_forms(form: str) -> Callable[[BoundSink, Options], Options]:
    def change(sink: BoundSink, options: Options) -> Options:
        address = sink.bootstrap  # type: ignore[attr-defined]
        other = address.replace("127.0.0.1", "localhost")
        forms = {
            "localhost": other,
            "two_addresses": f"{address},{other}",
            "reordered": f"{other},{address}",
            "with_spaces": f"{other}, {address}",
        }
        return {**options, "kafka.bootstrap.servers": forms[form]}

    return change


def _other_ledger(sink: BoundSink, options: Options) -> Options:
    return {**options, "ledgerTopic": f"{sink.ledger_topic}_moved"}  # type: ignore[attr-defined]


class Kafka(SinkAdapter):
    name = "kafka"
    sink_format = "2pc-kafka"
    data_source = "eospack.connectors.kafka.sink.data_source:TwoPhaseKafkaDataSource"
    schema = "key STRING, value STRING"
    fixtures = ("real_kafka",)
    as_kafka_records = True
    calls = CallFaults(
        decide="kafka_sink.decide",
        commit_piece="kafka_sink.commit_piece",
        prepare="kafka_sink.prepare",
        every=("kafka_sink.prepare", "kafka_sink.decide", "kafka_sink.commit_piece"),
    )
    documented_options = (
        DocumentedOption("kafka.bootstrap.servers", lambda sink: sink.bootstrap),  # type: ignore[attr-defined]
        DocumentedOption("topic", lambda sink: sink.topic),  # type: ignore[attr-defined]
        DocumentedOption("kafka.security.protocol", "PLAINTEXT"),
        DocumentedOption("kafka.linger.ms", "5"),
        DocumentedOption("kafka.compression.type", "gzip"),
        DocumentedOption("kafka.batch.size", "65536"),
        DocumentedOption("kafka.retry.backoff.ms", "20"),
        DocumentedOption("kafka.transaction.timeout.ms", "60000"),
        DocumentedOption("deliveryGuarantee", EXACTLY_ONCE),
        DocumentedOption("ledgerTopic", lambda sink: f"{sink.topic}_documented_ledger"),  # type: ignore[attr-defined]
        DocumentedOption("sinkId", "contract_documented_options"),
    )
    option_changes = (
        OptionChange("bootstrap_localhost", _bootstrap_forms("localhost")),
        OptionChange("bootstrap_two_addresses", _bootstrap_forms("two_addresses"), chaos_only=True),
        OptionChange("bootstrap_reordered", _bootstrap_forms("reordered")),
        OptionChange("bootstrap_with_spaces", _bootstrap_forms("with_spaces")),
        OptionChange("kafka_linger_ms", _switch("kafka.linger.ms", "5"), chaos_only=True),
        OptionChange(
            "kafka_retry_backoff_ms", _switch("kafka.retry.backoff.ms", "30"), chaos_only=True
        ),
        OptionChange(
            "kafka_transaction_timeout_ms",
            _switch("kafka.transaction.timeout.ms", "120000"),
            chaos_only=True,
        ),
        OptionChange("ledgerTopic", _other_ledger, refusal_allowed="ledgerTopic"),
    )
    marks = {
        "test_a_batch_slower_than_the_sinks_timeout_replays_instead_of_wedging": hole(
            5,
            "residual: a decision write that outlasts kafka.transaction.timeout.ms after the"
            " liveness check decides dead transactions (every restart: DecidedPieceLostError)",
        ),
    }
    bound = KafkaSink


ADAPTERS: dict[str, type[SinkAdapter]] = {
    adapter.name: adapter for adapter in (JdbcPrepared, JdbcStaging, JdbcSqlite, S3, Kafka)
}
"""Every two-phase-commit sink; adding a sink means adding its adapter here."""


# 2pc-kafka on Kafka as production runs it (issue 37) ---------------------------------


class KafkaClusterSink(KafkaSink):
    """2pc-kafka on the 3-node cluster (RF 3, min ISR 2). The output topic's two
    partitions are led by nodes 2 and 3, none by node 1, the first bootstrap address: a
    client that only ever talks to the first address passes nothing here by accident. The
    ledger topic is the sink's own (replicated 3 times by ``ensure_ledger_topic``)."""

    broker_fixture = "kafka_cluster"

    def create_output_topic(self) -> None:
        from integration_tests.production_kafka_parts import place_topic

        place_topic(self.kafka, self.topic, OUTPUT_LEADERS)

    def ledger_transactional_id(self, sink_id: str) -> str:
        from eospack.connectors.kafka.sink.ledger import LEDGER_ID_PREFIX

        return f"{LEDGER_ID_PREFIX}{sink_id}"


OUTPUT_LEADERS = (2, 3)
"""Partition p of a cluster adapter's output topic is led by node OUTPUT_LEADERS[p]."""


class SecuredKafkaSink(KafkaSink):
    """2pc-kafka on the SASL_SSL broker as user ``app`` with only the documented grant:
    topics ``app.*`` (the output and the ledger topic, which the sink creates itself:
    CREATE is in the grant), TransactionalIds ``eospack-*`` (pieces and the ledger). The
    test reads the end state as the super user ``admin``, who sees every transaction."""

    broker_fixture = "secured_kafka"

    def topic_name(self, name: str) -> str:
        from eospack.lab.services.kafka_cluster import APP_TOPIC_PREFIX

        return f"{APP_TOPIC_PREFIX}{name}"

    def create_output_topic(self) -> None:
        from kafka import KafkaConsumer
        from kafka.admin import NewTopic

        from eospack.lab.services.kafka_cluster import ADMIN_USER
        from eospack.lab.testing import wait_until

        admin = self.kafka.admin_client(ADMIN_USER)
        try:
            admin.create_topics([NewTopic(self.topic, num_partitions=2, replication_factor=1)])
        finally:
            admin.close()
        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, **self.client())
        try:
            wait_until(
                lambda: len(consumer.partitions_for_topic(self.topic) or ()) == 2,
                30,
                f"the partitions of {self.topic}",
            )
        finally:
            consumer.close()

    def client(self) -> dict[str, Any]:
        from eospack.lab.services.kafka_cluster import ADMIN_USER

        return dict(self.kafka.client_config(ADMIN_USER))

    def base_options(self) -> Options:
        return {**super().base_options(), **self.kafka.client_options("app")}


class KafkaCluster(Kafka):
    """The 2pc-kafka adapter on the 3-node cluster (``production_kafka`` only)."""

    name = "kafka-cluster"
    fixtures = ("kafka_cluster",)
    bound = KafkaClusterSink


class KafkaSecured(Kafka):
    """The 2pc-kafka adapter on the SASL_SSL broker, least privilege (``production_kafka``
    only). Its documented options leave out ``kafka.security.protocol=PLAINTEXT``, which
    this broker refuses."""

    name = "kafka-secured"
    fixtures = ("secured_kafka",)
    documented_options = tuple(
        option for option in Kafka.documented_options if option.name != "kafka.security.protocol"
    )
    bound = SecuredKafkaSink


PRODUCTION_ADAPTERS: dict[str, type[SinkAdapter]] = {
    adapter.name: adapter for adapter in (KafkaCluster, KafkaSecured)
}
"""2pc-kafka on Kafka as production runs it: collected only by the ``production_kafka``
module (``test_sink_contract_production_kafka.py``), never by ``make test``."""


def sink_params(case: str, adapters: Mapping[str, type[SinkAdapter]] = ADAPTERS) -> list[Any]:
    """One pytest parameter per adapter, with the adapter's mark for ``case`` if any."""
    return [
        pytest.param(name, marks=[adapter.marks[case]] if case in adapter.marks else [], id=name)
        for name, adapter in adapters.items()
    ]
