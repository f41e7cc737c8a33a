"""2pc-s3 without Spark or S3: option parsing and every option error (exact messages), the
object-key layout, partitionBy checks against a schema, and S3 error classification."""

from __future__ import annotations

import datetime

import pytest
from botocore.exceptions import ClientError
from pyspark.sql.types import (
    DateType,
    DoubleType,
    IntegerType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from eospack.connectors.s3.client import (
    error_code,
    is_denied,
    is_missing,
    is_no_such_upload,
    is_precondition_failed,
)
from eospack.connectors.s3.errors import S3OptionError
from eospack.connectors.s3.keys import (
    escape_path_name,
    object_key,
    partition_directory,
    partition_values_of_key,
    transaction_id_of_key,
    unescape_path_name,
)
from eospack.connectors.s3.options import (
    DEFAULT_TARGET_FILE_SIZE,
    S3Connection,
    S3Location,
    S3SinkOptions,
    parse_reader_options,
    parse_sink_options,
)
from eospack.connectors.s3.sink import check_schema

SECRET = "wJalrXUtnFEMI-never-shown"
KEY_ID = "AKIAEOSPACKNEVERSHOWN"
TOKEN = "session-token-never-shown"


def parse(**options: str) -> S3SinkOptions:
    # A plain dict: the options reader makes its names case-insensitive, as Spark's are.
    return parse_sink_options({"path": "s3://bkt/out", **options})


def error_of(**options: str) -> str:
    with pytest.raises(S3OptionError) as caught:
        parse(**options)
    return str(caught.value)


def test_defaults() -> None:
    options = parse()
    assert options.location == S3Location("bkt", "out")
    assert options.connection == S3Connection()
    assert options.file_format == "parquet"
    assert options.partition_by == ()
    assert options.target_file_size == DEFAULT_TARGET_FILE_SIZE == 128 * 1024**2
    assert options.exactly_once is True
    assert options.sink_id is None
    assert options.target == "s3://bkt/out"


def test_every_option_parsed_case_insensitively() -> None:
    options = parse_sink_options(
        {
            "PATH": "s3a://my.bucket-1/a/b/",
            "fileFormat": "JSONL",
            "partitionBy": " day , country ",
            "targetFileSize": "64m",
            "endpointUrl": "http://127.0.0.1:9000/",
            "Region": "eu-west-1",
            "accessKeyId": KEY_ID,
            "secretAccessKey": SECRET,
            "sessionToken": TOKEN,
            "deliveryGuarantee": "At-Least-Once",
            "sinkId": "orders_sink",
            "checkpointlocation": "/tmp/ignored",
        }
    )
    assert options.location == S3Location("my.bucket-1", "a/b")
    assert options.location.url == "s3://my.bucket-1/a/b"
    assert options.location.manifests_prefix == "a/b/_eospack/manifests/"
    assert options.file_format == "jsonl" and options.extension == "jsonl"
    assert options.partition_by == ("day", "country")
    assert options.target_file_size == 64 * 1024**2
    assert options.connection == S3Connection(
        "http://127.0.0.1:9000", "eu-west-1", KEY_ID, SECRET, TOKEN
    )
    assert options.exactly_once is False
    assert options.sink_id == "orders_sink"


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("1048576", 1024**2),
        ("128m", 128 * 1024**2),
        ("128MB", 128 * 1024**2),
        ("1g", 1024**3),
        ("2048k", 2 * 1024**2),
        ("5 MiB", 5 * 1024**2),
    ],
)
def test_target_file_size_accepts_spark_byte_strings(text: str, size: int) -> None:
    assert parse(targetFileSize=text).target_file_size == size


def test_credentials_never_in_repr() -> None:
    options = parse(accessKeyId=KEY_ID, secretAccessKey=SECRET, sessionToken=TOKEN)
    for text in (repr(options), str(options), repr(options.connection)):
        assert SECRET not in text and KEY_ID not in text and TOKEN not in text


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"path": ""},
            "Option path is required: set path to s3://bucket/prefix (or pass it to .start()"
            " or .load())",
        ),
        ({"path": "/tmp/out"}, "path '/tmp/out' is not an S3 location: use s3://bucket/prefix"),
        (
            {"path": "https://bkt/out"},
            "path 'https://bkt/out' is not an S3 location: use s3://bucket/prefix",
        ),
        (
            {"path": "s3://Bad_Bucket/out"},
            "path 's3://Bad_Bucket/out' names no valid bucket: use s3://bucket/prefix with a bucket"
            " of 3 to 63 lower-case letters, digits, dots or hyphens",
        ),
        (
            {"path": "s3://bkt"},
            "path 's3://bkt' has no prefix: use s3://bkt/prefix (the sink"
            " keeps its files and _eospack/ manifests below the prefix)",
        ),
        (
            {"path": "s3://bkt/a//b"},
            "path 's3://bkt/a//b' has an empty, '.' or '..' segment:"
            " use s3://bucket/prefix with plain segments",
        ),
        (
            {"path": "s3://bkt/out/_eospack"},
            "path 's3://bkt/out/_eospack' points inside the"
            " sink's own _eospack/ directory: use the prefix the sink writes to",
        ),
        ({"fileFormat": "csv"}, "Option fileFormat is 'csv': use parquet (default) or jsonl"),
        (
            {"partitionBy": "a,,b"},
            "partitionBy 'a,,b' has an empty column name: use comma-separated names",
        ),
        ({"partitionBy": "a,a"}, "partitionBy 'a,a' names a column twice: name each once"),
        (
            {"partitionBy": "a=b"},
            "partitionBy column 'a=b' contains '/' or '=': rename the"
            " column (it becomes a directory name column=value)",
        ),
        (
            {"targetFileSize": "big"},
            "Option targetFileSize is 'big': use a size in bytes or with k, m, g or t,"
            " such as 128m",
        ),
        (
            {"targetFileSize": "512k"},
            "Option targetFileSize is '512k': use at least 1m (default 128m)",
        ),
        (
            {"deliveryGuarantee": "twice"},
            "Option deliveryGuarantee is 'twice': use exactly-once (default) or at-least-once",
        ),
        (
            {"endpointUrl": "localhost:9000"},
            "endpointUrl 'localhost:9000' is not an HTTP URL:"
            " use e.g. http://localhost:9000 or https://s3.eu-west-1.amazonaws.com",
        ),
        (
            {"sinkId": "my-sink"},
            "Option sinkId is 'my-sink': use 1 to 64 letters, digits or underscores",
        ),
        (
            {"accessKeyId": KEY_ID},
            "accessKeyId is set but secretAccessKey is not: set both, or"
            " neither to use boto3's default credential chain",
        ),
        (
            {"secretAccessKey": SECRET},
            "secretAccessKey is set but accessKeyId is not: set both,"
            " or neither to use boto3's default credential chain",
        ),
        (
            {"sessionToken": TOKEN},
            "sessionToken is set without accessKeyId and secretAccessKey:"
            " set all three, or none to use boto3's default credential chain",
        ),
    ],
)
def test_option_errors_name_the_option_and_the_fix(options: dict[str, str], message: str) -> None:
    assert error_of(**options) == message


def test_option_errors_never_show_credentials() -> None:
    message = error_of(
        fileFormat="orc", accessKeyId=KEY_ID, secretAccessKey=SECRET, sessionToken=TOKEN
    )
    assert SECRET not in message and KEY_ID not in message and TOKEN not in message


def test_reader_options() -> None:
    options = parse_reader_options(
        {"path": "s3://bkt/out/", "endpointurl": "http://h:1", "fileformat": "ignored"}
    )
    assert options.location == S3Location("bkt", "out")
    assert options.connection.endpoint_url == "http://h:1"
    with pytest.raises(S3OptionError, match="is not an S3 location"):
        parse_reader_options({"path": "file:///tmp/x"})


def test_partition_directories_escape_like_spark_and_parse_back() -> None:
    values = ["a/b=c%", 7, None, True, datetime.date(2024, 2, 29), ""]
    columns = ["s", "i", "n", "b", "d", "e"]
    directory = partition_directory(columns, values)
    assert directory == (
        "s=a%2Fb%3Dc%25/i=7/n=__HIVE_DEFAULT_PARTITION__/b=true/d=2024-02-29/"
        "e=__HIVE_DEFAULT_PARTITION__/"
    )
    assert partition_values_of_key(directory + "file.parquet") == {
        "s": "a/b=c%",
        "i": "7",
        "n": None,
        "b": "true",
        "d": "2024-02-29",
        "e": None,
    }
    assert unescape_path_name(escape_path_name("x:\x01*?[]^{}#'\"\\")) == "x:\x01*?[]^{}#'\"\\"


def test_transaction_ids_are_read_from_data_keys_only() -> None:
    transaction = "eospack-abc_1-3-0-0x1234abcd"
    key = object_key("out", "day=1/", transaction, 2, "parquet")
    assert key == "out/day=1/eospack-abc_1-3-0-0x1234abcd.00002.parquet"
    assert transaction_id_of_key("out", key) == transaction
    assert transaction_id_of_key("out", "out/stray.parquet") is None
    assert transaction_id_of_key("out", "out/eospack-notanid.parquet") is None
    assert transaction_id_of_key("other", key) is None
    assert transaction_id_of_key("out", f"out/_eospack/manifests/{transaction}.json") is None


SCHEMA = StructType(
    [
        StructField("id", IntegerType()),
        StructField("day", DateType()),
        StructField("country", StringType()),
        StructField("amount", DoubleType()),
        StructField("at", TimestampType()),
    ]
)


def test_partition_by_columns_must_exist_fit_a_directory_and_leave_data() -> None:
    check_schema(parse(partitionBy="day,country"), SCHEMA)
    with pytest.raises(S3OptionError) as missing:
        check_schema(parse(partitionBy="region"), SCHEMA)
    assert str(missing.value) == (
        "partitionBy column 'region' is not in the DataFrame: use one of id, day, country,"
        " amount, at"
    )
    with pytest.raises(S3OptionError) as typed:
        check_schema(parse(partitionBy="at"), SCHEMA)
    assert str(typed.value) == (
        "partitionBy column 'at' has type timestamp: use string, integer, boolean or date"
        " columns (cast it first)"
    )
    with pytest.raises(S3OptionError) as everything:
        check_schema(parse(partitionBy="id"), StructType([StructField("id", IntegerType())]))
    assert str(everything.value) == (
        "partitionBy names every column: leave at least one column out to be written into the files"
    )


def client_error(code: str, status: int) -> ClientError:
    return ClientError(
        {
            "Error": {"Code": code, "Message": "text that is not parsed"},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        "Op",
    )


def test_s3_errors_are_classified_by_code() -> None:
    assert is_missing(client_error("NoSuchBucket", 404))
    assert is_missing(client_error("404", 404))
    assert is_denied(client_error("AccessDenied", 403))
    assert is_denied(client_error("InvalidAccessKeyId", 403))
    assert is_precondition_failed(client_error("PreconditionFailed", 412))
    assert is_no_such_upload(client_error("NoSuchUpload", 404))
    assert not is_missing(client_error("NoSuchUpload", 404))
    assert error_code(ClientError({"ResponseMetadata": {"HTTPStatusCode": 403}}, "Head")) == "403"


def test_a_blank_sink_id_is_refused_not_taken_for_the_derived_one() -> None:
    with pytest.raises(S3OptionError, match="^Option sinkId is blank: leave it unset or use 1 to"):
        parse(sinkId="  ")
