"""2pc-s3 against a real S3 endpoint (moto server, or MinIO in Docker mode).

Streaming writes in both formats, partitioned and rolled over into several files, read
back by ``format("2pc-s3")`` with exact row sets; the reader ignoring stray objects,
incomplete uploads and half-committed batches; a new checkpoint on the same path never
skipped; the protocol's S3 operations (invisible until completed, idempotent commit and
rollback, recovery listings); and every bad input refused before data moves, without
credentials in the message.
"""

from __future__ import annotations

import io
import json
import os
import random
import re
import string
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eospack.commit_protocols import BatchDecision, TaskIdentity, TwoPhaseCommitCoordinator
from eospack.connectors.s3 import writer as writer_module
from eospack.connectors.s3.client import s3_client
from eospack.connectors.s3.errors import S3AccessError, S3OptionError, S3WriteError
from eospack.connectors.s3.multipart import MIN_PART_SIZE
from eospack.connectors.s3.options import S3Connection, parse_sink_options
from eospack.connectors.s3.resource import S3Resource
from eospack.connectors.s3.sink import TwoPhaseS3DataSource
from eospack.connectors.s3.writer import TaskWriter
from eospack.lab.services.base import free_port, port_accepts_connections, wait_until_ready
from eospack.lab.services.embedded import _ChildProcess, moto_server_binary
from eospack.lab.testing import await_query
from integration_tests.s3_parts import (
    QUERY_TIMEOUT,
    SCHEMA_DDL,
    arrow_batches,
    connection_options,
    open_uploads,
    read_committed,
    rows_of,
    run_stream,
    write_source,
)

pytestmark = pytest.mark.integration


def object_keys(s3: Any, prefix: str) -> list[str]:
    pages = s3.endpoint.client().get_paginator("list_objects_v2")
    return [
        entry["Key"]
        for page in pages.paginate(Bucket=s3.endpoint.bucket, Prefix=f"{prefix}/")
        for entry in page.get("Contents", ())
    ]


def manifests(s3: Any, prefix: str) -> dict[str, dict[str, Any]]:
    client = s3.endpoint.client()
    return {
        key: json.loads(client.get_object(Bucket=s3.endpoint.bucket, Key=key)["Body"].read())
        for key in object_keys(s3, f"{prefix}/_eospack/manifests")
    }


def test_partitioned_parquet_batches_are_read_back_exactly_once(
    spark: Any, s3: Any, tmp_path: Path, unique_name: str
) -> None:
    source = tmp_path / "source"
    source.mkdir()
    batches = [rows_of(0, 300), rows_of(300, 300)]
    expected = write_source(spark, source, batches)
    path = f"s3://{s3.endpoint.bucket}/{unique_name}"
    options = {**connection_options(s3), "partitionBy": "grp,day"}

    run_stream(spark, source, tmp_path / "checkpoint", path, options)

    assert read_committed(spark, s3, path) == expected
    written = manifests(s3, unique_name)
    assert sorted(manifest["batch_id"] for manifest in written.values()) == [0, 1]
    data_keys = sorted(key for key in object_keys(s3, unique_name) if "/_eospack/" not in key)
    named = sorted(file["key"] for m in written.values() for file in m["files"])
    assert data_keys == named
    assert all(key.split("/")[1].startswith("grp=g") for key in data_keys)
    assert all(key.split("/")[2] in ("day=2024-01-01", "day=2024-01-02") for key in data_keys)
    assert open_uploads(s3, unique_name) == []

    # Stray objects, someone's incomplete upload and a half-committed batch stay unseen.
    client = s3.endpoint.client()
    bucket = s3.endpoint.bucket
    stray = io.BytesIO()
    pq.write_table(pa.table({"id": [-1], "amount": [0.0]}), stray)
    client.put_object(
        Bucket=bucket, Key=f"{unique_name}/grp=g0/day=2024-01-01/x.parquet", Body=stray.getvalue()
    )
    client.create_multipart_upload(
        Bucket=bucket,
        Key=f"{unique_name}/grp=g1/day=2024-01-01/eospack-other-0-0-0x1.00001.parquet",
    )
    in_progress = {**next(iter(written.values())), "sink_id": "other", "batch_id": 7}
    in_progress["files"] = [
        {
            "key": f"{unique_name}/grp=g2/eospack-other-7-0-0x1.00001.parquet",
            "rows": 5,
            "bytes": 100,
        }
    ]
    client.put_object(
        Bucket=bucket,
        Key=f"{unique_name}/_eospack/manifests/other/7.json",
        Body=json.dumps(in_progress).encode(),
    )
    assert read_committed(spark, s3, path) == expected

    # A new checkpoint on the same path is a new sink: its batch 0 is not "already done".
    run_stream(spark, source, tmp_path / "checkpoint2", path, options, files_per_trigger=2)
    assert read_committed(spark, s3, path) == sorted(expected + expected)
    sink_ids = {m["sink_id"] for m in manifests(s3, unique_name).values()} - {"other"}
    assert len(sink_ids) == 2


def test_jsonl_at_least_once_round_trips_every_column_type_partitioned_by_boolean(
    spark: Any, s3: Any, tmp_path: Path, unique_name: str
) -> None:
    """at-least-once: tasks complete their files and name them in per-task manifests."""
    source = tmp_path / "source"
    source.mkdir()
    rows = [*rows_of(0, 50), (50, 'quote " and ü', None, None, None, None)]
    expected = write_source(spark, source, [rows])
    path = f"s3://{s3.endpoint.bucket}/{unique_name}"
    options = {
        **connection_options(s3),
        "fileFormat": "jsonl",
        "partitionBy": "flag",
        "deliveryGuarantee": "at-least-once",
    }

    run_stream(spark, source, tmp_path / "checkpoint", path, options)

    assert read_committed(spark, s3, path) == expected
    names = [key.rsplit("/", 1)[1] for key in manifests(s3, unique_name)]
    task_manifest = r"0\.[01]\.0x[0-9a-z]+x[0-9a-f]+\.json"  # <batch>.<partition>.<attempt>
    assert len(names) == 2 and all(re.fullmatch(task_manifest, name) for name in names)
    keys = [key for key in object_keys(s3, unique_name) if key.endswith(".jsonl")]
    assert {key.split("/")[1] for key in keys} == {
        "flag=true",
        "flag=false",
        "flag=__HIVE_DEFAULT_PARTITION__",
    }
    body = s3.endpoint.client().get_object(Bucket=s3.endpoint.bucket, Key=keys[0])["Body"]
    lines = body.read().decode().splitlines()
    assert lines and all(
        set(json.loads(line)) == {"id", "grp", "day", "amount", "at"} for line in lines
    )


def test_large_task_output_rolls_over_into_several_files(
    spark: Any, s3: Any, tmp_path: Path, unique_name: str
) -> None:
    source = tmp_path / "source"
    source.mkdir()
    rng = random.Random(7)
    count = 40_000
    table = pa.table(
        {
            "id": pa.array(range(count), pa.int64()),
            "payload": ["".join(rng.choices(string.ascii_letters, k=100)) for _ in range(count)],
        }
    )
    pq.write_table(table, source / "big.parquet")
    path = f"s3://{s3.endpoint.bucket}/{unique_name}"
    options = {**connection_options(s3), "targetFileSize": "1m"}

    query = (
        spark.readStream.schema("id BIGINT, payload STRING")
        .parquet(str(source))
        .writeStream.format("2pc-s3")
        .options(**options)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start(path)
    )
    await_query(query, QUERY_TIMEOUT)

    (manifest,) = manifests(s3, unique_name).values()
    (piece,) = [piece for piece in manifest["pieces"] if piece["rows"]]
    sizes = [file["bytes"] for file in piece["handle"]["files"]]
    assert len(sizes) >= 3 and all(size >= 1024**2 for size in sizes[:-1])
    assert sum(file["rows"] for file in manifest["files"]) == count
    frame = spark.read.format("2pc-s3").options(**connection_options(s3)).load(path)
    assert frame.count() == count
    assert frame.selectExpr("count(distinct id)", "min(id)", "max(id)").first() == (
        count,
        0,
        count - 1,
    )


def test_prepared_files_are_invisible_until_committed_and_every_step_is_idempotent(
    s3: Any, unique_name: str
) -> None:
    options = parse_sink_options(
        {
            "path": f"s3://{s3.endpoint.bucket}/{unique_name}",
            **{k.lower(): v for k, v in connection_options(s3).items()},
        }
    )
    client = s3_client(options.connection)
    writer = TaskWriter(options, client, part_size=MIN_PART_SIZE)
    piece = writer.prepare(TaskIdentity("sinkA", 4, 0, "0xa"), arrow_batches(12_000))
    (file,) = piece.handle["files"]
    parts = client.list_parts(
        Bucket=s3.endpoint.bucket, Key=file["key"], UploadId=file["upload_id"]
    )["Parts"]
    assert len(parts) == 3 and all(part["Size"] == MIN_PART_SIZE for part in parts[:-1])
    assert object_keys(s3, unique_name) == []
    other = writer.prepare(TaskIdentity("sinkA", 4, 1, "0xb"), arrow_batches(10))
    stale = writer.prepare(TaskIdentity("sinkA", 3, 0, "0xc"), arrow_batches(10))
    later = writer.prepare(TaskIdentity("sinkA", 5, 0, "0xd"), arrow_batches(10))
    foreign = writer.prepare(TaskIdentity("sinkB", 4, 0, "0xe"), arrow_batches(10))
    empty = writer.prepare(TaskIdentity("sinkA", 4, 2, "0xf"), iter(()))
    assert empty.handle["files"] == [] and empty.rows == 0

    resource = S3Resource(options, '{"type":"struct","fields":[]}', client)
    decision = BatchDecision("sinkA", 4, (piece, empty))
    assert resource.record_decision(decision) == decision
    rival = BatchDecision("sinkA", 4, (other,))
    assert S3Resource(options, "{}", client).record_decision(rival) == decision  # slot kept
    assert S3Resource(options, "{}", client).find_decision("sinkA", 4) == decision
    assert list(resource.unfinished_decisions("sinkA")) == [decision]
    prepared = {p.transaction_id for p in resource.prepared_pieces("sinkA")}
    assert prepared == {
        piece.transaction_id,
        other.transaction_id,
        stale.transaction_id,
        later.transaction_id,
    }

    TwoPhaseCommitCoordinator(resource, "test").recover("sinkA", up_to_batch=4)

    assert list(resource.unfinished_decisions("sinkA")) == []
    assert [p.transaction_id for p in resource.prepared_pieces("sinkA")] == [later.transaction_id]
    assert [p.transaction_id for p in resource.prepared_pieces("sinkB")] == [foreign.transaction_id]
    resource.commit_piece(piece)  # again: already completed
    resource.rollback_piece(piece)  # a completed file is not an upload any more
    resource.rollback_piece(other)  # already aborted
    stored = client.get_object(Bucket=s3.endpoint.bucket, Key=file["key"])["Body"].read()
    table = pq.read_table(io.BytesIO(stored))
    assert table.num_rows == 12_000 and table.column("id").to_pylist() == list(range(12_000))
    for leftover in (later, foreign):
        resource.rollback_piece(leftover)
    assert open_uploads(s3, unique_name) == []
    assert object_keys(s3, unique_name) == [
        f"{unique_name}/_eospack/manifests/sinkA/3.json",  # the fence of the stale batch 3
        f"{unique_name}/_eospack/manifests/sinkA/4.json",
        file["key"],
    ]
    fence = S3Resource(options, "{}", client).find_decision("sinkA", 3)
    assert fence is not None and fence.status == "aborted"
    assert fence.transaction_ids() == {stale.transaction_id}


def test_many_open_partition_files_are_closed_early_to_bound_memory(
    s3: Any, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = parse_sink_options(
        {
            "path": f"s3://{s3.endpoint.bucket}/{unique_name}",
            "partitionby": "k",
            **{k.lower(): v for k, v in connection_options(s3).items()},
        }
    )
    monkeypatch.setattr(writer_module, "MAX_BUFFERED_BYTES", 1)
    batches = [
        pa.record_batch({"id": pa.array(range(i * 10, i * 10 + 10), pa.int64()), "k": [i % 3] * 10})
        for i in range(6)
    ]
    client = s3_client(options.connection)
    piece = TaskWriter(options, client).prepare(TaskIdentity("sinkM", 0, 0, "0xa"), iter(batches))
    files = piece.handle["files"]
    assert len(files) > 3 and sum(file["rows"] for file in files) == 60 == piece.rows
    S3Resource(options, "{}", client).commit_piece(piece)
    ids = []
    for file in files:
        body = client.get_object(Bucket=s3.endpoint.bucket, Key=file["key"])["Body"].read()
        ids += pq.read_table(io.BytesIO(body)).column("id").to_pylist()
        assert file["key"].split("/")[1] in ("k=0", "k=1", "k=2")
    assert sorted(ids) == list(range(60))


def test_an_unreachable_endpoint_fails_the_task_without_leaking_credentials(
    unique_name: str,
) -> None:
    connection = S3Connection(
        f"http://127.0.0.1:{free_port()}", "us-east-1", "AKIANEVERSHOWN", "secret-never-shown"
    )
    options = replace(
        parse_sink_options({"path": f"s3://bucket/{unique_name}"}), connection=connection
    )
    writer = TaskWriter(options, s3_client(connection, max_attempts=1))
    with pytest.raises(S3WriteError) as caught:
        writer.prepare(TaskIdentity("sinkA", 0, 0, "0xa"), arrow_batches(10))
    message = str(caught.value)
    assert message.startswith(f"2pc-s3 could not start the upload of s3://bucket/{unique_name}/")
    assert message.endswith(
        "(endpoint unreachable): the task fails and Spark may retry it; nothing of it is visible"
    )
    assert "NEVERSHOWN" not in message and "never-shown" not in message


SECRET = "secret-value-never-shown"


def stream_writer_error(options: dict[str, str], overwrite: bool = False) -> str:
    from pyspark.sql.types import _parse_datatype_string

    schema = _parse_datatype_string(SCHEMA_DDL)
    source = TwoPhaseS3DataSource({k.lower(): v for k, v in options.items()})
    with pytest.raises((S3OptionError, S3AccessError)) as caught:
        source.streamWriter(schema, overwrite)
    message = str(caught.value)
    assert SECRET not in message and "AKIANEVERSHOWN" not in message
    return message


def bad_input_options(s3: Any, **extra: str) -> dict[str, str]:
    return {
        "path": f"s3://{s3.endpoint.bucket}/bad",
        "endpointUrl": s3.endpoint.endpoint_url,
        "accessKeyId": "AKIANEVERSHOWN",
        "secretAccessKey": SECRET,
        **extra,
    }


def test_bad_inputs_are_refused_at_query_start_with_one_clear_line(s3: Any) -> None:
    endpoint = s3.endpoint.endpoint_url
    assert stream_writer_error(bad_input_options(s3, path="s3://no-such-bucket-x/out")) == (
        f"bucket 'no-such-bucket-x' of path s3://no-such-bucket-x/out does not exist at"
        f" {endpoint}: create it, or fix path/endpointUrl"
    )
    assert stream_writer_error(bad_input_options(s3, path="/tmp/out")) == (
        "path '/tmp/out' is not an S3 location: use s3://bucket/prefix"
    )
    assert stream_writer_error(bad_input_options(s3, fileFormat="avro")) == (
        "Option fileFormat is 'avro': use parquet (default) or jsonl"
    )
    assert stream_writer_error(bad_input_options(s3, partitionBy="country")) == (
        "partitionBy column 'country' is not in the DataFrame: use one of id, grp, day,"
        " amount, at, flag"
    )
    assert stream_writer_error(bad_input_options(s3), overwrite=True) == (
        "outputMode complete is not supported by 2pc-s3: use append"
    )
    unreachable = f"http://127.0.0.1:{free_port()}"
    assert stream_writer_error(bad_input_options(s3, endpointUrl=unreachable)) == (
        f"cannot reach S3 at {unreachable} for path s3://{s3.endpoint.bucket}/bad"
        " (endpoint unreachable): check endpointUrl and region"
    )


class AuthenticatingS3(_ChildProcess):
    """A moto server that checks credentials: every request with unknown keys is denied."""

    name = "s3 endpoint (moto, authenticating)"

    def __init__(self) -> None:
        super().__init__()
        self.port = free_port()
        self._launch(
            [moto_server_binary(), "-H", "127.0.0.1", "-p", str(self.port)],
            env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "0"},
        )
        wait_until_ready(
            self.name,
            lambda: port_accepts_connections("127.0.0.1", self.port),
            self._exit_code,
            self.log_file,
        )


def test_denied_access_is_refused_at_query_start_without_the_secret() -> None:
    with AuthenticatingS3() as server:
        options = {
            "path": "s3://locked-bucket/out",
            "endpointUrl": f"http://127.0.0.1:{server.port}",
            "accessKeyId": "AKIANEVERSHOWN",
            "secretAccessKey": SECRET,
        }
        assert stream_writer_error(options) == (
            "access to bucket 'locked-bucket' of path s3://locked-bucket/out was denied (403):"
            " check accessKeyId/secretAccessKey (or boto3's default credential chain) and the"
            " bucket policy"
        )


def test_a_bad_query_fails_before_any_data_moves(
    spark: Any, s3: Any, tmp_path: Path, unique_name: str
) -> None:
    source = tmp_path / "source"
    source.mkdir()
    write_source(spark, source, [rows_of(0, 10)])
    options = {**connection_options(s3), "partitionBy": "country"}
    with pytest.raises(Exception, match="partitionBy column 'country' is not in the DataFrame"):
        run_stream(
            spark,
            source,
            tmp_path / "checkpoint",
            f"s3://{s3.endpoint.bucket}/{unique_name}",
            options,
        )
    assert object_keys(s3, unique_name) == [] and open_uploads(s3, unique_name) == []


def test_reading_a_prefix_without_committed_data_says_so(
    spark: Any, s3: Any, unique_name: str
) -> None:
    path = f"s3://{s3.endpoint.bucket}/{unique_name}"
    with pytest.raises(Exception, match=f"no committed 2pc-s3 data under {path}: check path"):
        spark.read.format("2pc-s3").options(**connection_options(s3)).load(path).collect()
    frame = spark.read.format("2pc-s3").options(**connection_options(s3)).schema("id BIGINT")
    assert frame.load(path).collect() == []
