"""2pc-kafka's options and input columns: every refusal is one line naming the option and
the fix, before any data moves, and no secret value appears in it or in the repr."""

from __future__ import annotations

import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from eospack.connectors.kafka.errors import KafkaSinkOptionError
from eospack.connectors.kafka.sink.data_source import check_schema
from eospack.connectors.kafka.sink.options import DEFAULT_LEDGER_TOPIC, parse_options

BASE = {"kafka.bootstrap.servers": "b1:9092, b2:9092", "topic": "out"}
SECRET = "hunter2-secret"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"kafka.bootstrap.servers": ""}, "Option kafka.bootstrap.servers is required"),
        ({"deliveryGuarantee": "twice"}, "Option deliveryGuarantee is 'twice'"),
        ({"kafka.transactional.id": "mine"}, "gives each task its own transactional id"),
        ({"kafka.acks": "1"}, "the sink sets acks=all"),
        ({"kafka.no.such.setting": "1"}, "kafka.no.such.setting is not a producer setting"),
        ({"kafka.transaction.timeout.ms": "10"}, "use at least 1000"),
        ({"kafka.linger.ms": "soon"}, "Option kafka.linger.ms is 'soon': use a non-negative"),
        ({"ledgerTopic": "out"}, "Option ledgerTopic must name a topic of its own"),
        ({"sinkId": "no spaces"}, "Option sinkId is 'no spaces': use 1 to 64 letters"),
        (
            {"kafka.sasl.jaas.config": f'org.Nope required username="u" password="{SECRET}";'},
            "must be a PlainLoginModule or ScramLoginModule",
        ),
        (
            {
                "kafka.ssl.password": SECRET,
                "kafka.ssl.truststore.type": "JKS",
                "kafka.ssl.truststore.location": "/x.jks",
            },
            "needs a PEM file",
        ),
    ],
)
def test_bad_options_are_refused_in_one_line(options: dict[str, str], message: str) -> None:
    with pytest.raises(KafkaSinkOptionError) as raised:
        parse_options({**BASE, **options})
    text = str(raised.value)
    assert message in text and "\n" not in text and SECRET not in text


def test_options_parse_into_the_producer_settings_with_secrets_kept_out_of_the_repr() -> None:
    module = "org.apache.kafka.common.security.plain.PlainLoginModule"
    jaas = f'{module} required username="u" password="{SECRET}";'
    options = parse_options(
        {
            **{key.upper(): value for key, value in BASE.items()},
            "kafka.sasl.jaas.config": jaas,
            "kafka.security.protocol": "SASL_PLAINTEXT",
            "kafka.linger.ms": "5",
            "deliveryguarantee": "AT-LEAST-ONCE",
        }
    )
    assert options.topic == "out" and not options.exactly_once
    assert options.ledger_topic == DEFAULT_LEDGER_TOPIC
    config = options.producer_config()
    assert config["bootstrap_servers"] == ["b1:9092", "b2:9092"]
    assert config["acks"] == "all" and config["enable_idempotence"] is True
    assert config["linger_ms"] == 5 and config["sasl_plain_password"] == SECRET
    assert "transaction_timeout_ms" not in config
    assert SECRET not in repr(options) and SECRET not in options.describe()


def schema(*fields: StructField) -> StructType:
    return StructType(list(fields))


@pytest.mark.parametrize(
    ("options", "columns", "message"),
    [
        (BASE, schema(StructField("key", StringType())), "needs a value column"),
        (
            {"kafka.bootstrap.servers": "b:1"},
            schema(StructField("value", StringType())),
            "needs a topic: set the topic option, or write a topic column",
        ),
        (BASE, schema(StructField("value", LongType())), "column value has type bigint"),
        (
            BASE,
            schema(StructField("value", BinaryType()), StructField("partition", LongType())),
            "column partition has type bigint: use int",
        ),
        (
            BASE,
            schema(
                StructField("value", BinaryType()), StructField("headers", ArrayType(StringType()))
            ),
            "column headers",
        ),
    ],
)
def test_input_columns_are_checked_like_sparks_kafka_sink(
    options: dict[str, str], columns: StructType, message: str
) -> None:
    with pytest.raises(KafkaSinkOptionError, match=message):
        check_schema(parse_options(options), columns)


def test_the_columns_of_sparks_kafka_sink_are_accepted() -> None:
    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    check_schema(
        parse_options({"kafka.bootstrap.servers": "b:1"}),
        schema(
            StructField("key", BinaryType()),
            StructField("value", StringType()),
            StructField("topic", StringType()),
            StructField("partition", IntegerType()),
            StructField("headers", ArrayType(header)),
            StructField("other", LongType()),
        ),
    )


@pytest.mark.parametrize(
    ("name", "given"),
    [("sinkId", "sinkId"), ("ledgerTopic", "ledgerTopic"), ("sinkId", "SINKID")],
)
@pytest.mark.parametrize("blank", ["", "  "])
def test_a_blank_identity_option_is_refused_not_taken_for_the_default(
    name: str, given: str, blank: str
) -> None:
    """A blank sinkId or ledgerTopic would silently mean "derived" or the default ledger: a
    restart with it would look for its decisions elsewhere and apply a batch again."""
    with pytest.raises(KafkaSinkOptionError) as raised:
        parse_options({**BASE, given: blank})
    assert str(raised.value).startswith(f"Option {name} is blank: leave it unset or use")


@pytest.mark.parametrize(
    ("given", "setting"),
    [("none", None), ("NONE", None), ("gzip", "gzip"), ("LZ4", "lz4"), ("zstd", "zstd")],
)
def test_compression_type_is_taken_as_kafka_and_spark_spell_it(
    given: str, setting: str | None
) -> None:
    """kafka-python refuses "none" (it wants None) in every task; Spark's sink takes it."""
    options = parse_options({**BASE, "kafka.compression.type": given})
    assert options.producer_config()["compression_type"] == setting


def test_an_unknown_compression_type_is_refused_in_one_line() -> None:
    with pytest.raises(KafkaSinkOptionError) as raised:
        parse_options({**BASE, "kafka.compression.type": "brotli"})
    assert str(raised.value) == (
        "Option kafka.compression.type is brotli: use one of none, gzip, snappy, lz4, zstd"
    )
