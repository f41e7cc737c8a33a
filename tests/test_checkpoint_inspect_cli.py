"""``eospack checkpoint inspect --format F --option k=v --option-file FILE``.

The sink's options are parsed by the sink's own parser (``eospack.tools.formats``) before the
checkpoint or the sink is read; the deprecated sink flags are aliases onto the same path;
a later ``--option`` wins over the file, as in Spark's options; secrets never reach output
or errors.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from eospack.cli import build_parser, inspected_sinks, main, option_file
from eospack.connectors.jdbc.options import parse_options as parse_jdbc_options
from eospack.tools import checkpoint
from eospack.tools.checkpoint import CheckpointInspectError

SECRET = "S3cretValue"


def sinks_of(*arguments: str) -> dict[str, dict[str, str]]:
    return inspected_sinks(build_parser().parse_args(["checkpoint", "inspect", "/c", *arguments]))


@pytest.fixture
def never_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails the test if the checkpoint or a sink would be read."""

    def refuse(*arguments: object, **keywords: object) -> None:
        raise AssertionError("inspect_checkpoint was called")

    monkeypatch.setattr(checkpoint, "inspect_checkpoint", refuse)


def test_an_option_file_is_key_value_lines_with_comments_and_a_later_line_wins(
    tmp_path: Path,
) -> None:
    file = tmp_path / "sink.options"
    file.write_text(
        "# the orders sink\n\nurl = jdbc:postgresql://db:5432/shop\ndbtable=orders\n"
        "  # indented comment\ndbtable=public.orders\npassword=a=b#c\n"
    )

    assert option_file(str(file)) == {
        "url": "jdbc:postgresql://db:5432/shop",
        "dbtable": "public.orders",
        "password": "a=b#c",
    }


def test_a_bad_option_file_line_is_named_by_number_never_quoted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], never_read: None
) -> None:
    file = tmp_path / "sink.options"
    file.write_text(f"url=jdbc:sqlite:/x.db\n{SECRET}\n")

    assert (
        main(["checkpoint", "inspect", "/c", "--format", "2pc-jdbc", "--option-file", str(file)])
        == 2
    )

    assert capsys.readouterr().err == (
        f"eospack checkpoint inspect: {file} line 2 is not key=value: write one sink option"
        " per line (# starts a comment)\n"
    )


def test_a_later_option_wins_over_the_file_and_an_earlier_option(tmp_path: Path) -> None:
    file = tmp_path / "sink.options"
    file.write_text("url=jdbc:sqlite:/a.db\ndbtable=from_file\nuser=app\n")

    sinks = sinks_of(
        "--format", "2pc-jdbc", "--option-file", str(file),
        "--option", "dbtable=first", "--option", "dbtable=second",
    )  # fmt: skip

    assert sinks == {"2pc-jdbc": {"url": "jdbc:sqlite:/a.db", "dbtable": "second", "user": "app"}}


@pytest.mark.parametrize(
    ("deprecated", "options"),
    [
        (
            ["--jdbc-url", "jdbc:sqlite:/x.db", "--table", "t", "--user", "app",
             "--ledger-table", "ops.l", "--sink-id", "s1"],
            ["--format", "2pc-jdbc", "--option", "url=jdbc:sqlite:/x.db", "--option",
             "dbtable=t", "--option", "user=app", "--option", "ledgerTable=ops.l",
             "--option", "sinkId=s1"],
        ),
        (
            ["--s3-path", "s3://b/p", "--s3-endpoint-url", "http://s3:9000",
             "--s3-region", "eu-west-1", "--sink-id", "s1"],
            ["--format", "2pc-s3", "--option", "path=s3://b/p", "--option",
             "endpointUrl=http://s3:9000", "--option", "region=eu-west-1",
             "--sink-id", "s1"],
        ),
        (
            ["--kafka-bootstrap-servers", "b:9092", "--topic", "out",
             "--ledger-topic", "ledger"],
            ["--format", "2pc-kafka", "--option", "kafka.bootstrap.servers=b:9092",
             "--option", "topic=out", "--option", "ledgerTopic=ledger"],
        ),
    ],
    ids=["2pc-jdbc", "2pc-s3", "2pc-kafka"],
)  # fmt: skip
def test_each_deprecated_flag_gives_the_options_of_its_format_and_option(
    deprecated: list[str], options: list[str]
) -> None:
    assert sinks_of(*deprecated) == sinks_of(*options)
    assert len(sinks_of(*deprecated)) == 1


def test_the_kafka_command_config_is_an_option_file_of_kafka_prefixed_keys(
    tmp_path: Path,
) -> None:
    properties = tmp_path / "client.properties"
    properties.write_text("security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\n")
    options = tmp_path / "sink.options"
    options.write_text(
        "kafka.bootstrap.servers=b:9093\nkafka.security.protocol=SASL_SSL\n"
        "kafka.sasl.mechanism=PLAIN\n"
    )

    assert sinks_of(
        "--kafka-bootstrap-servers", "b:9093", "--kafka-command-config", str(properties)
    ) == sinks_of("--format", "2pc-kafka", "--option-file", str(options))


@pytest.mark.parametrize("name", ["2pc-jbdc", "replayable-kafka", "jdbc"])
def test_a_format_inspect_cannot_read_is_refused_naming_the_sinks_it_reads(
    name: str, capsys: pytest.CaptureFixture[str], never_read: None
) -> None:
    assert main(["checkpoint", "inspect", "/c", "--format", name, "--option", "a=b"]) == 2

    assert capsys.readouterr().err == (
        f"eospack checkpoint inspect: --format {name!r} is not a sink that inspect reads:"
        " use one of 2pc-jdbc, 2pc-s3, 2pc-kafka\n"
    )


def test_a_bad_option_is_the_sinks_own_error_before_anything_is_read(
    capsys: pytest.CaptureFixture[str], never_read: None
) -> None:
    options = {"url": "jdbc:sqlite:/x.db", "dbtable": "t", "batchsize": "zero"}
    with pytest.raises(ValueError) as sinks_own:
        parse_jdbc_options(options)
    arguments = [f"--option={key}={value}" for key, value in options.items()]

    assert main(["checkpoint", "inspect", "/c", "--format", "2pc-jdbc", *arguments]) == 2

    error = capsys.readouterr().err
    assert error == f"eospack checkpoint inspect: {sinks_own.value}\n"
    assert error.startswith("eospack checkpoint inspect: Option batchsize is 'zero': use ")


def test_a_deprecated_flag_goes_through_the_same_parsing(
    capsys: pytest.CaptureFixture[str], never_read: None
) -> None:
    arguments = ["--jdbc-url", "mysql://db/shop", "--table", "t"]

    assert main(["checkpoint", "inspect", "/c", *arguments]) == 2

    assert capsys.readouterr().err.startswith(
        "eospack checkpoint inspect: url scheme 'mysql' is not supported: use "
    )


def test_a_missing_required_option_is_named(
    capsys: pytest.CaptureFixture[str], never_read: None
) -> None:
    assert main(["checkpoint", "inspect", "/c", "--format", "2pc-s3"]) == 2

    assert capsys.readouterr().err.startswith(
        "eospack checkpoint inspect: Option path is required: set path to "
    )


def test_an_option_without_a_format_or_an_equals_sign_is_refused(
    capsys: pytest.CaptureFixture[str], never_read: None
) -> None:
    assert main(["checkpoint", "inspect", "/c", "--option", "dbtable=t"]) == 2
    assert "--option and --option-file need --format" in capsys.readouterr().err

    arguments = ["--format", "2pc-jdbc", "--option", "url=jdbc:sqlite:/x.db", "--option", SECRET]
    assert main(["checkpoint", "inspect", "/c", *arguments]) == 2
    error = capsys.readouterr().err
    assert error == (
        "eospack checkpoint inspect: --option number 2 is not KEY=VALUE: give one sink option"
        " each, e.g. --option dbtable=orders\n"
    )


@pytest.mark.parametrize(
    "options",
    [
        {"url": "jdbc:sqlite:/x.db", "dbtable": "t", "password": SECRET, "batchsize": "-1"},
        {
            "url": f"jdbc:postgresql://app:{SECRET}@db/shop",
            "dbtable": "t",
        },
        {
            "kafka.bootstrap.servers": "b:9092",
            "kafka.sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule"
            f' required username="u" password="{SECRET}";',
            "kafka.sasl.mechanism": "NOPE",
        },
        {"path": "s3://b/p", "accessKeyId": SECRET, "secretAccessKey": SECRET, "sinkId": "-"},
    ],
    ids=["jdbc password", "jdbc url", "kafka jaas", "s3 keys"],
)
def test_a_secret_given_as_an_option_never_reaches_the_error(
    options: dict[str, str], capsys: pytest.CaptureFixture[str], never_read: None
) -> None:
    sink = (
        "2pc-jdbc"
        if "url" in options
        else "2pc-kafka"
        if "kafka.sasl.jaas.config" in options
        else "2pc-s3"
    )
    arguments = [f"--option={key}={value}" for key, value in options.items()]

    assert main(["checkpoint", "inspect", "/c", "--format", sink, *arguments]) == 2

    output = capsys.readouterr()
    assert SECRET not in output.err and SECRET not in output.out
    assert output.err.count("\n") == 1


def test_a_secret_from_the_option_file_never_reaches_a_failed_inspection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The options reach inspection whole (the password included); its one-line failure
    is printed without them."""
    seen: dict[str, object] = {}

    def capture(path: object, *, spark: object, sink_options: dict[str, object]) -> None:
        seen.update(sink_options)
        raise CheckpointInspectError("2pc-jdbc sink cannot be read: connection refused")

    monkeypatch.setattr(checkpoint, "inspect_checkpoint", capture)
    file = tmp_path / "sink.options"
    file.write_text(f"url=jdbc:postgresql://db:5432/shop\ndbtable=t\npassword={SECRET}\n")

    assert (
        main(["checkpoint", "inspect", "/c", "--format", "2pc-jdbc", "--option-file", str(file)])
        == 1
    )

    assert seen == {
        "2pc-jdbc": {"url": "jdbc:postgresql://db:5432/shop", "dbtable": "t", "password": SECRET}
    }
    output = capsys.readouterr()
    assert SECRET not in output.err + output.out


def test_the_help_marks_each_old_sink_flag_deprecated(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["checkpoint", "--help"])
    help_text = capsys.readouterr().out
    for flag in (
        "--jdbc-url", "--table", "--ledger-table", "--user", "--s3-path", "--s3-endpoint-url",
        "--s3-region", "--kafka-bootstrap-servers", "--topic", "--ledger-topic",
        "--kafka-command-config",
    ):  # fmt: skip
        assert f"{flag} " in help_text
    assert "deprecated sink flags" in help_text
    assert help_text.count("deprecated: --format") == 11
