"""``OptionReader`` without Spark: what each kind of value accepts, the exact one-line refusal
of what it does not, case-insensitive names, secrets never shown, and a plain dict read as
Spark's ``CaseInsensitiveDict``; the duration and size grammars checked on generated input."""

from __future__ import annotations

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.datasource import CaseInsensitiveDict

from eospack.core.errors import EospackError
from eospack.core.options import OptionReader, option_error

FAST = settings(max_examples=200, deadline=None)


class ExampleOptionError(EospackError, ValueError):
    """The error class a connector passes to its reader."""


def reader(**options: str) -> OptionReader:
    return OptionReader(options, ExampleOptionError)


def refusal(call: object, *arguments: object) -> str:
    assert callable(call)
    with pytest.raises(ExampleOptionError) as raised:
        call(*arguments)
    message = str(raised.value)
    assert "\n" not in message
    return message


def test_text_is_stripped_and_blank_counts_as_unset() -> None:
    options = reader(topic="  orders ", blank="  ", empty="")
    assert options.text("topic") == "orders"
    assert options.text("blank") is None and options.text("empty") is None
    assert options.text("missing") is None
    assert options.text("blank", "fallback") == "fallback"
    assert options.text("topic", "fallback") == "orders"


def test_names_are_case_insensitive_whichever_case_either_side_uses() -> None:
    options = reader(maxTriggerDelay="30s", FAILONDATALOSS="false")
    assert options.duration_ms("MAXTRIGGERDELAY", 0) == 30_000
    assert options.duration_ms("maxtriggerdelay", 0) == 30_000
    assert options.boolean("failOnDataLoss", True) is False


def test_a_plain_dict_reads_like_sparks_case_insensitive_dict() -> None:
    raw = {"subscribePattern": "orders_.*", "kafka.Client.Id": "reporting", "gone": None}
    spark = CaseInsensitiveDict({key: value for key, value in raw.items() if value is not None})
    for options in (raw, spark):
        read = OptionReader(options, ExampleOptionError)
        assert read.text("subscribepattern") == "orders_.*"
        assert read.text("SUBSCRIBEPATTERN") == "orders_.*"
        assert read.with_prefix("KAFKA.") == [("client.id", "reporting")]
        assert read.text("gone") is None


def test_required() -> None:
    assert reader(url=" jdbc:sqlite:/x.db ").required("url", "a URL") == "jdbc:sqlite:/x.db"
    for options in (reader(), reader(url="  ")):
        assert refusal(options.required, "url", "jdbc:sqlite:PATH") == (
            "Option url is required: set url to jdbc:sqlite:PATH"
        )


@pytest.mark.parametrize(
    ("value", "expected"), [("true", True), ("FALSE", False), (" True ", True)]
)
def test_boolean_accepts_true_and_false_in_any_case(value: str, expected: bool) -> None:
    assert reader(flag=value).boolean("flag", not expected) is expected


@pytest.mark.parametrize("value", ["yes", "1", "on", "t"])
def test_boolean_refuses_anything_else(value: str) -> None:
    assert refusal(reader(flag=value).boolean, "flag", True) == (
        f"Option flag is '{value}': use true or false"
    )
    assert reader(flag=" ").boolean("flag", True) is True


def test_choice_returns_the_canonical_choice_and_names_the_default() -> None:
    choices = ("auto", "prepared", "staging")
    assert reader(protocol=" Staging ").choice("protocol", choices, "auto") == "staging"
    assert reader().choice("protocol", choices, "auto") == "auto"
    assert reader().choice("protocol", choices, None) is None
    assert refusal(reader(protocol="xa").choice, "protocol", choices, "auto") == (
        "Option protocol is 'xa': use auto (default), prepared or staging"
    )
    assert refusal(reader(mode="x").choice, "mode", ("append", "upsert"), None) == (
        "Option mode is 'x': use append or upsert"
    )


def test_positive_int() -> None:
    assert reader(batchsize=" 500 ").positive_int("batchsize", 10) == 500
    assert reader().positive_int("batchsize", 10) == 10
    assert reader().positive_int("batchsize", None) is None
    for value in ("0", "-5", "1.5", "ten"):
        assert refusal(reader(batchsize=value).positive_int, "batchsize", 10) == (
            f"Option batchsize is '{value}': use a positive integer"
        )


@pytest.mark.parametrize(
    ("value", "milliseconds"),
    [
        ("250", 250),
        ("500ms", 500),
        ("30s", 30_000),
        ("30 S", 30_000),
        ("2m", 120_000),
        ("2min", 120_000),
        ("1h", 3_600_000),
        ("1d", 86_400_000),
        ("2500us", 2),
        ("0", 0),
    ],
)
def test_duration_units(value: str, milliseconds: int) -> None:
    assert reader(delay=value).duration_ms("delay", 7) == milliseconds


@pytest.mark.parametrize("value", ["soon", "5 minutes", "1.5s", "-1s", "s", "10 ms extra"])
def test_duration_refusals(value: str) -> None:
    assert refusal(reader(lockTimeout=value).duration_ms, "lockTimeout", 7) == (
        f"Option lockTimeout is '{value}': use a duration such as 500ms, 30s, 2min or 1h"
    )


@pytest.mark.parametrize("value", ["0", "0s", "999us"])
def test_a_positive_duration_refuses_less_than_a_millisecond(value: str) -> None:
    options = reader(lockTimeout=value)
    assert options.duration_ms("lockTimeout", 7) == 0
    with pytest.raises(ExampleOptionError) as raised:
        options.duration_ms("lockTimeout", 7, positive=True)
    assert str(raised.value) == (
        f"Option lockTimeout is '{value}': use a positive duration such as 500ms, 30s, 2min or 1h"
    )


@pytest.mark.parametrize(
    ("value", "size"),
    [
        ("134217728", 134217728),
        ("512k", 512 * 1024),
        ("128m", 128 * 1024**2),
        ("128MB", 128 * 1024**2),
        ("1 gib", 1024**3),
        ("2t", 2 * 1024**4),
    ],
)
def test_byte_sizes(value: str, size: int) -> None:
    assert reader(targetFileSize=value).byte_size("targetFileSize", 1) == size


@pytest.mark.parametrize("value", ["big", "1.5g", "-1m", "12p", "m"])
def test_byte_size_refusals(value: str) -> None:
    assert refusal(reader(targetFileSize=value).byte_size, "targetFileSize", 1) == (
        f"Option targetFileSize is '{value}': use a size in bytes or with k, m, g or t,"
        " such as 128m"
    )


def test_a_secret_is_returned_but_never_shown_in_an_error() -> None:
    options = reader(password=" hunter2-secret ", user="bob")
    assert options.secret("password") == "hunter2-secret"
    message = str(options.refuse("password", "a password without spaces"))
    assert message == "Option password is not valid: use a password without spaces"
    assert "hunter2" not in message
    # Reading it later as another kind of value still keeps it out of the message.
    assert "hunter2" not in refusal(options.boolean, "PASSWORD", False)
    assert str(options.refuse("user", "someone else")) == "Option user is 'bob': use someone else"
    assert reader().secret("password") is None


def test_refuse_and_option_error_share_the_one_style() -> None:
    assert str(reader(topic="out").refuse("topic", "another topic")) == (
        "Option topic is 'out': use another topic"
    )
    assert str(reader().refuse("topic", "another topic", value="x")) == (
        "Option topic is 'x': use another topic"
    )
    error = option_error(ExampleOptionError, "kafka.linger.ms", "a\nb", "a number")
    assert isinstance(error, ExampleOptionError)
    assert str(error) == "Option kafka.linger.ms is 'a\\nb': use a number"
    hidden = option_error(ExampleOptionError, "kafka.ssl.password", "pw", "text", secret=True)
    assert str(hidden) == "Option kafka.ssl.password is not valid: use text"


def test_with_prefix_passes_values_as_given() -> None:
    options = reader(
        **{"kafka.ssl.endpoint.identification.algorithm": "", "kafka.b": " 1 ", "other": "x"}
    )
    assert options.with_prefix("kafka.") == [
        ("b", " 1 "),
        ("ssl.endpoint.identification.algorithm", ""),
    ]


# --- the grammars on generated input ---------------------------------------------------------

DURATION_UNITS_MS = {
    "": 1,
    "ms": 1,
    "s": 1000,
    "m": 60_000,
    "min": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
}
spaces = st.sampled_from(["", " ", "  "])


@FAST
@given(
    st.integers(min_value=0, max_value=10**12),
    st.sampled_from(sorted(DURATION_UNITS_MS)),
    spaces,
    st.booleans(),
)
def test_duration_is_amount_times_unit(amount: int, unit: str, gap: str, upper: bool) -> None:
    text = f" {amount}{gap if unit else ''}{unit} "
    read = reader(delay=text.upper() if upper else text)
    assert read.duration_ms("delay", -1) == amount * DURATION_UNITS_MS[unit]


@FAST
@given(st.integers(min_value=0, max_value=10**15))
def test_duration_in_milliseconds_reads_back(milliseconds: int) -> None:
    for unit, size in DURATION_UNITS_MS.items():
        if milliseconds % size == 0:
            text = f"{milliseconds // size}{unit}"
            assert reader(delay=text).duration_ms("delay", -1) == milliseconds


@FAST
@given(
    st.integers(min_value=0, max_value=10**9),
    st.sampled_from(["", "k", "m", "g", "t"]),
    st.sampled_from(["", "b", "ib"]),
    spaces,
    st.booleans(),
)
def test_byte_size_is_amount_times_power_of_1024(
    amount: int, unit: str, suffix: str, gap: str, upper: bool
) -> None:
    if not unit and suffix == "ib":
        suffix = ""  # "5ib" is no size anyone writes
    text = f" {amount}{gap}{unit}{suffix} "
    power = ["", "k", "m", "g", "t"].index(unit)
    read = reader(size=text.upper() if upper else text)
    assert read.byte_size("size", -1) == amount * 1024**power


@FAST
@given(st.text(alphabet=string.ascii_letters + string.punctuation + " -", min_size=1))
def test_byte_size_and_duration_without_digits_are_refused_or_unset(text: str) -> None:
    read = reader(value=text)
    if not text.strip():
        assert read.byte_size("value", -1) == read.duration_ms("value", -1) == -1
        return
    with pytest.raises(ExampleOptionError):
        read.byte_size("value", -1)
    with pytest.raises(ExampleOptionError):
        read.duration_ms("value", -1)
