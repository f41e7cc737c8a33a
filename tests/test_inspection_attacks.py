"""Attacks on sink inspection's promises, pure logic (issue 29 session): "nothing to
clean" is said only when the inspected sink id is known to have left nothing; a finished
sink counts no leftover; a directory that is not a query's checkpoint is one line; no
secret in what inspection says. The same promises against the real services are in
``integration_tests/sinks/test_sink_inspection_reads_only_any_address.py``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from eospack.cli import main
from eospack.commit_protocols import BatchDecision
from eospack.commit_protocols.inspection import (
    NOTHING_TO_CLEAN,
    DecisionState,
    SinkState,
)
from eospack.commit_protocols.pieces import ABORTED, DONE
from eospack.tools import checkpoint
from eospack.tools.checkpoint import CheckpointInspectError, inspect_sink

FAKE_FORMAT = "2pc-fake"


def no_decision_found(query_id: str, options: Mapping[str, str]) -> SinkState:
    """What every resource reports for a sink id it has never seen: nothing at all."""
    return SinkState(FAKE_FORMAT, "derived0000", "somewhere", (), (), (), NOTHING_TO_CLEAN)


def test_a_sink_id_without_any_decision_is_never_reported_as_nothing_to_clean(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The options addressed the sink another way than the query did (``public.t`` for
    ``t``, ``--topic`` left out, another ``ledgerTable``...), so the derived id is not the
    sink's and nothing is found under it: saying "nothing to clean" would hide whatever
    the real sink left behind. Inspection says what it did not find and how to fix it."""
    monkeypatch.setitem(
        checkpoint.SINK_INSPECTORS, FAKE_FORMAT, f"{__name__}:{no_decision_found.__name__}"
    )

    state = inspect_sink(FAKE_FORMAT, "query-1", {})

    assert state.cleanup != NOTHING_TO_CLEAN
    assert "\n" not in state.cleanup
    assert "no decision of sink derived0000" in state.cleanup
    assert "sinkId" in state.cleanup and "options" in state.cleanup


def test_a_sink_whose_batches_are_all_done_or_fenced_counts_no_leftover() -> None:
    """Spark's abort fences the batch's slot (``aborted (fence)``) and rolls its pieces
    back: a finished outcome that stays in the ledger for good. Counting it as "not done"
    made the demo's verification report a leftover forever after any Spark abort."""
    fence = DecisionState.of(BatchDecision("s1", 3, (), ABORTED))
    done = DecisionState.of(BatchDecision("s1", 4, (), DONE))
    state = SinkState("2pc-x", "s1", "x", (fence, done), (), (), NOTHING_TO_CLEAN)

    assert state.is_clean
    assert state.leftover_count() == 0


@pytest.mark.parametrize("metadata", ["", "{}\n", '{"queryId": "x"}\n', "not json\n"], ids=repr)
def test_a_directory_whose_metadata_is_not_a_querys_is_one_line_not_a_traceback(
    tmp_path: Path, metadata: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "metadata").write_text(metadata)

    assert main(["checkpoint", "inspect", str(tmp_path)]) == 1

    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "checkpointLocation" in error, error


@pytest.mark.parametrize(
    "url",
    [
        "jdbc:postgresql://db.example:5432/shop?user=app&password=S3cretInUrl",
        "postgresql://app:S3cretInUrl@db.example/shop",
        "jdbc:postgresql://app:S3cretInUrl@db.example/shop",
    ],
)
def test_a_password_in_the_inspected_url_never_appears_in_the_error(url: str) -> None:
    with pytest.raises(CheckpointInspectError) as raised:
        inspect_sink("2pc-jdbc", "query-1", {"url": url, "dbtable": "t"})

    assert "S3cretInUrl" not in str(raised.value) and "\n" not in str(raised.value)
    assert "password" in str(raised.value)


def test_the_cli_passes_a_2pc_jdbc_sinks_ledger_table_to_inspection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A query that set ``ledgerTable`` keeps its decisions there: without a way to name it,
    ``eospack checkpoint inspect`` read ``eospack_commits`` and could never see them."""
    seen: dict[str, object] = {}

    def capture(path: object, *, spark: object, sink_options: dict[str, object]) -> None:
        seen["jdbc"] = sink_options["2pc-jdbc"]
        raise CheckpointInspectError("captured")

    monkeypatch.setattr(checkpoint, "inspect_checkpoint", capture)
    arguments = ["--jdbc-url", "jdbc:sqlite:/x.db", "--table", "t", "--ledger-table", "ops.l"]

    assert main(["checkpoint", "inspect", str(tmp_path), *arguments]) == 1

    assert seen["jdbc"] == {"url": "jdbc:sqlite:/x.db", "dbtable": "t", "ledgerTable": "ops.l"}


def test_the_cli_passes_a_secured_kafka_clusters_client_settings_from_a_command_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 2pc-kafka sink on a SASL/SSL cluster could not be inspected: the command had no way
    to pass ``kafka.*`` client settings. As Kafka's own tools do (``--command-config``), they
    come from a properties file, so a secret is never an argument, and never printed."""
    seen: dict[str, object] = {}

    def capture(path: object, *, spark: object, sink_options: dict[str, object]) -> None:
        seen["kafka"] = sink_options["2pc-kafka"]
        raise CheckpointInspectError("captured")

    monkeypatch.setattr(checkpoint, "inspect_checkpoint", capture)
    config = tmp_path / "client.properties"
    config.write_text(
        "# the cluster's client settings\n"
        "security.protocol=SASL_SSL\n"
        "sasl.mechanism = PLAIN\n"
        'sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="s3cret";\n'  # noqa: E501
    )
    arguments = ["--kafka-bootstrap-servers", "b:9093", "--kafka-command-config", str(config)]

    assert main(["checkpoint", "inspect", str(tmp_path), *arguments]) == 1

    assert seen["kafka"] == {
        "kafka.bootstrap.servers": "b:9093",
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "PLAIN",
        "kafka.sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule"
        ' required username="u" password="s3cret";',
    }
    assert "s3cret" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        (["--ledger-table", "ops.l"], "--ledger-table"),
        (["--kafka-command-config", "client.properties"], "--kafka-command-config"),
    ],
)
def test_a_sink_flag_without_its_sink_is_refused_not_ignored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], arguments: list[str], named: str
) -> None:
    assert main(["checkpoint", "inspect", str(tmp_path), *arguments]) == 2
    assert named in capsys.readouterr().err
