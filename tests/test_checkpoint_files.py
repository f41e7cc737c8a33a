"""``eospack.core.checkpoint_files`` without Spark: which locations are local, and the local
backend every local checkpoint is read with (no JVM round trip)."""

from __future__ import annotations

from pathlib import Path

import pytest

from eospack.cli import spark_settings
from eospack.core.checkpoint_files import (
    CheckpointFilesError,
    LocalFiles,
    checkpoint_files,
    is_local,
    join,
)
from eospack.core.errors import EospackError


@pytest.mark.parametrize(
    ("location", "local"),
    [
        ("/tmp/checkpoint", True),
        ("relative/checkpoint", True),
        ("file:///tmp/checkpoint", True),
        ("file:/tmp/checkpoint", True),
        ("C:/checkpoints/query", True),
        ("s3a://bucket/prefix", False),
        ("abfss://container@account.dfs.core.windows.net/prefix", False),
        ("gs://bucket/prefix", False),
        ("hdfs://namenode:8020/checkpoints", False),
    ],
)
def test_plain_paths_and_file_uris_are_read_locally_and_other_schemes_through_hadoop(
    location: str, local: bool
) -> None:
    assert is_local(location) is local


def test_a_local_checkpoint_is_read_and_written_without_spark(tmp_path: Path) -> None:
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "0").write_text("v1\n{}\n")
    (tmp_path / "state" / "0" / "1").mkdir(parents=True)
    (tmp_path / "state" / "0" / "1" / "2.delta").write_bytes(b"12345")
    files = checkpoint_files(tmp_path.as_uri())
    assert isinstance(files, LocalFiles) and files.location == str(tmp_path)
    assert files.read_text("offsets/0") == "v1\n{}\n"
    assert files.read_text("offsets/9") is None
    assert files.read_text("commits/0") is None
    assert files.names("offsets") == ["0"] and files.names("commits") == []
    assert dict(files.file_sizes("state/0")) == {"1/2.delta": 5}
    assert files.is_directory("state") and not files.is_file("state")
    files.write_text("eospack/record.json", "{}")
    assert files.read_text("eospack/record.json") == "{}"
    assert files.names("eospack") == ["record.json"]  # no temporary file left


def test_a_hadoop_location_without_a_spark_session_is_one_line_naming_it() -> None:
    from pyspark.sql import SparkSession

    if SparkSession.getActiveSession() is not None:
        pytest.skip("a SparkSession is active in this process")
    with pytest.raises(CheckpointFilesError) as caught:
        checkpoint_files("s3a://bucket/checkpoint")
    assert isinstance(caught.value, EospackError) and isinstance(caught.value, OSError)
    assert "s3a://bucket/checkpoint" in str(caught.value) and "\n" not in str(caught.value)


def test_join_keeps_a_uri_a_uri() -> None:
    assert join("s3a://bucket/prefix/", "offsets", "3") == "s3a://bucket/prefix/offsets/3"
    assert join("/tmp/c", "", "metadata") == "/tmp/c/metadata"


def test_a_conf_argument_without_a_value_is_refused_without_quoting_it() -> None:
    assert spark_settings(["spark.hadoop.fs.s3a.endpoint=http://h:1", "a=b=c"]) == {
        "spark.hadoop.fs.s3a.endpoint": "http://h:1",
        "a": "b=c",
    }
    with pytest.raises(ValueError, match="not KEY=VALUE"):
        spark_settings(["spark.hadoop.fs.s3a.secret.key"])
