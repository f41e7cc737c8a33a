"""2pc-kafka's record in the checkpoint (``checkpoint_record``): where it lives, that it is
written once and atomically, and that another ledgerTopic is refused in one line."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from eospack.connectors.kafka.errors import KafkaSinkOptionError
from eospack.connectors.kafka.sink import checkpoint_record
from eospack.connectors.kafka.sink.checkpoint_record import (
    check_against_record,
    read_record,
    record_path,
    write_record,
)
from eospack.connectors.kafka.sink.options import (
    DEFAULT_LEDGER_TOPIC,
    KafkaSinkOptions,
    parse_options,
)


def options(checkpoint: str | None, **extra: str) -> KafkaSinkOptions:
    """Parsed as Spark hands them over: the checkpoint option lower-cased."""
    given = {"kafka.bootstrap.servers": "b1:9092", "topic": "out", **extra}
    if checkpoint is not None:
        given["checkpointlocation"] = checkpoint
    return parse_options(given)


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        ("/data/checkpoints/q1", "/data/checkpoints/q1/eospack/2pc-kafka.json"),
        ("file:///data/checkpoints/q1", "/data/checkpoints/q1/eospack/2pc-kafka.json"),
        ("file:/data/checkpoints/q1", "/data/checkpoints/q1/eospack/2pc-kafka.json"),
        ("file://localhost/data/q%201", "/data/q 1/eospack/2pc-kafka.json"),
    ],
)
def test_the_record_lives_under_a_local_checkpoint(location: str, expected: str) -> None:
    assert record_path(location) == Path(expected)


@pytest.mark.parametrize(
    "location",
    [
        None,
        "",
        "checkpoints/q1",
        "hdfs://namenode/checkpoints/q1",
        "s3a://bucket/q1",
        "file://host/q1",
    ],
)
def test_no_record_where_this_process_cannot_keep_one(location: str | None) -> None:
    assert record_path(location) is None


def test_the_first_exactly_once_start_records_the_ledger_topic_and_identity(
    tmp_path: Path,
) -> None:
    given = options(str(tmp_path), ledgerTopic="ledger_a")
    check_against_record(given)

    path = tmp_path / "eospack" / "2pc-kafka.json"
    assert json.loads(path.read_text()) == {
        "version": 2,
        "ledger_topic": "ledger_a",
        "identity": {"sink_id": None, "target": given.target},
    }
    check_against_record(options(str(tmp_path), ledgerTopic="ledger_a"))  # the same: accepted
    assert json.loads(path.read_text())["ledger_topic"] == "ledger_a"


def test_a_restart_with_another_ledger_topic_is_refused_in_one_line(tmp_path: Path) -> None:
    check_against_record(options(tmp_path.as_uri()))

    with pytest.raises(KafkaSinkOptionError) as raised:
        check_against_record(options(str(tmp_path), ledgerTopic="ledger_b"))

    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(
        f"Option ledgerTopic is 'ledger_b': this query's earlier runs kept their decisions in"
        f" '{DEFAULT_LEDGER_TOPIC}' (recorded in {tmp_path}/eospack/2pc-kafka.json)"
    )
    assert f"set ledgerTopic={DEFAULT_LEDGER_TOPIC}" in message


def test_at_least_once_records_nothing_but_is_refused_another_ledger_topic(
    tmp_path: Path,
) -> None:
    """An at-least-once run decides nothing, but recovers from the recorded ledger."""
    at_least_once = {"deliveryGuarantee": "at-least-once"}
    check_against_record(options(str(tmp_path), ledgerTopic="ledger_a", **at_least_once))
    assert not (tmp_path / "eospack").exists()

    check_against_record(options(str(tmp_path), ledgerTopic="ledger_a"))
    with pytest.raises(KafkaSinkOptionError, match="Option ledgerTopic is 'ledger_b'"):
        check_against_record(options(str(tmp_path), ledgerTopic="ledger_b", **at_least_once))


def test_without_a_usable_checkpoint_the_check_is_skipped_with_one_info_log(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoint_record, "_skipped_logged", False)
    with caplog.at_level(logging.INFO, logger=checkpoint_record.__name__):
        check_against_record(options(None))
        check_against_record(options("hdfs://namenode/q1", ledgerTopic="other"))

    skipped = [r for r in caplog.records if "keeps no record of ledgerTopic" in r.getMessage()]
    assert len(skipped) == 1 and skipped[0].levelno == logging.INFO


def test_the_record_is_replaced_whole_or_not_at_all(tmp_path: Path) -> None:
    path = tmp_path / "eospack" / "2pc-kafka.json"
    write_record(path, {"version": 1, "ledger_topic": "a"})

    with pytest.raises(TypeError):
        write_record(path, {"version": 1, "ledger_topic": object()})

    assert read_record(path) == {"version": 1, "ledger_topic": "a"}
    assert [entry.name for entry in path.parent.iterdir()] == ["2pc-kafka.json"]


def test_an_unreadable_record_is_refused_rather_than_guessed(tmp_path: Path) -> None:
    path = tmp_path / "eospack" / "2pc-kafka.json"
    path.parent.mkdir()
    path.write_text("{not json")

    with pytest.raises(KafkaSinkOptionError, match="cannot read its record"):
        check_against_record(options(str(tmp_path)))


@pytest.mark.parametrize(
    "change",
    [{"sinkId": "named"}, {"topic": "elsewhere"}, {"kafka.bootstrap.servers": "other:9092"}],
    ids=["sinkId-added", "topic-changed", "cluster-changed"],
)
def test_a_restart_under_another_sink_identity_is_refused_in_one_line(
    tmp_path: Path, change: dict[str, str]
) -> None:
    """Another sinkId or target is another sink, which would not find the last decision."""
    check_against_record(options(str(tmp_path)))
    with pytest.raises(KafkaSinkOptionError) as refused:
        check_against_record(options(str(tmp_path), **change))
    message = str(refused.value)
    assert message.startswith("Option sinkId is") and "\n" not in message
    assert "keep sinkId, the topic option and the cluster as they were" in message


def test_a_version_1_record_gains_the_identity_at_the_next_exactly_once_start(
    tmp_path: Path,
) -> None:
    path = tmp_path / "eospack" / "2pc-kafka.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"version": 1, "ledger_topic": "ledger_a"}))
    check_against_record(options(str(tmp_path), ledgerTopic="ledger_a"))
    assert json.loads(path.read_text())["identity"]["sink_id"] is None
    with pytest.raises(KafkaSinkOptionError, match="^Option sinkId is 'named'"):
        check_against_record(options(str(tmp_path), ledgerTopic="ledger_a", sinkId="named"))
