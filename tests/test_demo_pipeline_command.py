"""The demo pipeline's command line is written by ``PipelineCommand`` alone (the demo's
orchestrator, the crash tests and the benchmarks start the pipeline through it): what it
writes must be what ``parse_arguments`` reads back."""

from __future__ import annotations

from pathlib import Path

from eospack.lab.demo.pipeline import PipelineCommand, parse_arguments


def test_every_option_written_is_read_back_by_the_pipeline(tmp_path: Path) -> None:
    command = PipelineCommand(
        name="count_1",
        bootstrap_servers="127.0.0.1:9092",
        topic="events",
        checkpoint_dir=tmp_path / "count_1",
        done_file=tmp_path / "done",
        sink="jdbc",
        jdbc_url="jdbc:postgresql://127.0.0.1:5432/postgres",
        jdbc_user="postgres",
        guarantee="at-least-once",
        max_offsets_per_trigger=10_000,
        trigger_interval="2 seconds",
        more=("--tables", "history", "--source-option", "kafkaConsumer.pollTimeoutMs=10000"),
    )
    arguments = command.arguments()
    assert arguments[:2] == ["-m", "eospack.lab.demo.pipeline"]

    parsed = parse_arguments(arguments[2:])

    assert (parsed.name, parsed.bootstrap_servers, parsed.topic) == (
        "count_1",
        "127.0.0.1:9092",
        "events",
    )
    assert parsed.checkpoint_dir == tmp_path / "count_1"
    assert parsed.done_file == tmp_path / "done"
    assert (parsed.sink, parsed.jdbc_url, parsed.jdbc_user) == (
        "jdbc",
        "jdbc:postgresql://127.0.0.1:5432/postgres",
        "postgres",
    )
    assert (parsed.guarantee, parsed.max_offsets_per_trigger, parsed.trigger_interval) == (
        "at-least-once",
        10_000,
        "2 seconds",
    )
    assert parsed.tables == ["history"]
    assert parsed.source_option == [("kafkaConsumer.pollTimeoutMs", "10000")]


def test_options_left_unset_are_not_passed_so_the_pipeline_defaults_apply(
    tmp_path: Path,
) -> None:
    command = PipelineCommand(
        name="count_2",
        bootstrap_servers="127.0.0.1:9092",
        topic="events",
        checkpoint_dir=tmp_path / "count_2",
        done_file=tmp_path / "done",
        sink="kafka",
        output_topic="count_2_out",
    )

    parsed = parse_arguments(command.arguments()[2:])

    assert "--guarantee" not in command.arguments()
    assert (parsed.sink, parsed.output_topic, parsed.jdbc_url) == ("kafka", "count_2_out", None)
    assert (parsed.guarantee, parsed.max_offsets_per_trigger) == ("exactly-once", 2000)
    assert parsed.trigger_interval == "500 milliseconds"
