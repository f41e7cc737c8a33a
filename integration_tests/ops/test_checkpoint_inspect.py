"""``eospack checkpoint inspect`` on a real checkpoint: after a driver was SIGKILLed with
batch 1 prepared (2pc-jdbc) or decided (2pc-s3), and after the restart that cleaned up; the
sink given by ``--format``/``--option``/``--option-file`` and by the deprecated flags gives
the same report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eospack.cli import main
from eospack.tools.checkpoint import inspect_checkpoint
from integration_tests.jdbc_pipeline import Pipeline
from integration_tests.s3_pipeline import Pipeline as S3Pipeline

pytestmark = pytest.mark.integration


@pytest.mark.timeout(300)
def test_inspect_shows_a_crashed_querys_leftovers_then_a_clean_checkpoint(
    spark: Any,
    postgres: Any,
    tmp_path: Path,
    unique_name: str,
    call_faults: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pipeline = Pipeline(postgres, tmp_path, unique_name, call_faults)
    pipeline.crash("--protocol", "prepared", fault_point="after_prepare@1")
    checkpoint = tmp_path / "checkpoint"
    sink = {
        "url": postgres.endpoint.jdbc_url,
        "dbtable": unique_name,
        "user": postgres.endpoint.user,
    }

    crashed = inspect_checkpoint(checkpoint, sink)
    assert [(batch.batch_id, batch.committed) for batch in crashed.batches] == [
        (0, True),
        (1, False),
    ]
    assert all(batch.source_offsets for batch in crashed.batches)
    (ledger,) = crashed.sinks
    assert [
        (row["batch_id"], row["status"], row["rows"], row["pieces"]) for row in ledger.batches
    ] == [(0, "done", 6, 2)]
    # The first task past PREPARE kills the driver; the other one may not have prepared yet.
    prepared = len(ledger.prepared_transactions)
    assert prepared in (1, 2), ledger.prepared_transactions
    assert all(f"-{ledger.sink_id}-1-" in gid for gid in ledger.prepared_transactions)
    assert ledger.cleanup.startswith("start the query again from this checkpoint")
    text = crashed.to_text()
    assert "1: NOT committed (replayed at restart)" in text
    assert f"left behind: {prepared} prepared transactions, 0 staged rows" in text
    deprecated_flags = [
        "--jdbc-url", postgres.endpoint.jdbc_url, "--table", unique_name,
        "--user", postgres.endpoint.user,
    ]  # fmt: skip
    assert main(["checkpoint", "inspect", str(checkpoint), *deprecated_flags]) == 0
    assert capsys.readouterr().out == text + "\n"
    options = tmp_path / "sink.options"
    options.write_text(f"# the query's sink\nurl={postgres.endpoint.jdbc_url}\ndbtable=other\n")
    format_options = [
        "--format", "2pc-jdbc", "--option-file", str(options),
        "--option", f"dbtable={unique_name}", "--option", f"user={postgres.endpoint.user}",
    ]  # fmt: skip
    assert main(["checkpoint", "inspect", str(checkpoint), *format_options]) == 0
    assert capsys.readouterr().out == text + "\n"

    final = pipeline.run(spark, "--protocol", "prepared")
    assert final.succeeded, final.explain()
    exit_code = main(
        [
            "checkpoint",
            "inspect",
            checkpoint.as_uri(),
            "--json",
            "--jdbc-url",
            postgres.endpoint.jdbc_url,
            "--table",
            unique_name,
            "--user",
            postgres.endpoint.user,
        ]
    )
    assert exit_code == 0
    clean = json.loads(capsys.readouterr().out)
    assert [batch["committed"] for batch in clean["batches"]] == [True] * 4
    (sink_report,) = clean["sinks"]
    assert [row["status"] for row in sink_report["batches"]] == ["done"] * 4
    assert sink_report["prepared_transactions"] == [] and sink_report["staged_rows"] == 0
    assert sink_report["cleanup"] == "nothing to clean"


def test_inspect_refuses_a_directory_that_is_no_checkpoint_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["checkpoint", "inspect", str(tmp_path)]) == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "is not a streaming checkpoint" in error


@pytest.mark.timeout(300)
def test_inspect_shows_a_2pc_s3_sinks_decided_batch_and_its_uploads_then_nothing(
    spark: Any,
    s3: Any,
    tmp_path: Path,
    unique_name: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Killed after batch 1's decision, before its uploads completed: batch 1 shows as
    decided (not done) with its uploads in progress; after the restart, all done."""
    endpoint = s3.endpoint
    for variable, value in (
        ("AWS_ACCESS_KEY_ID", endpoint.access_key_id),
        ("AWS_SECRET_ACCESS_KEY", endpoint.secret_access_key),
        ("AWS_DEFAULT_REGION", endpoint.region),
    ):
        monkeypatch.setenv(variable, value)
    pipeline = S3Pipeline(s3, tmp_path, unique_name, batches=3)
    assert pipeline.run_driver(fault_point="after_decision@1").was_killed
    sink = {"path": pipeline.path, "endpointUrl": endpoint.endpoint_url}

    crashed = inspect_checkpoint(pipeline.checkpoint, s3_options=sink)
    (ledger,) = crashed.sinks
    assert [(row["batch_id"], row["status"]) for row in ledger.batches] == [
        (0, "done"),
        (1, "decided"),
    ]
    listed = {entry.rsplit(" (", 1)[1].rstrip(")") for entry in ledger.multipart_uploads}
    assert listed == pipeline.bucket.upload_ids()
    assert ledger.multipart_uploads and ledger.cleanup.startswith("start the query again")

    pipeline.restart_here(spark)
    arguments = [
        "checkpoint",
        "inspect",
        str(pipeline.checkpoint),
        "--s3-path",
        pipeline.path,
        "--s3-endpoint-url",
        endpoint.endpoint_url,
    ]
    assert main(arguments) == 0
    text = capsys.readouterr().out
    assert "2pc-s3 sink" in text and "left behind: 0 multipart uploads in progress" in text
    assert "nothing to clean" in text and endpoint.secret_access_key not in text
