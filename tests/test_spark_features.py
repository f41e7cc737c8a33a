"""eospack.core.spark_features: what each Spark line offers, found by looking, as the table says."""

from __future__ import annotations

import sys

import pyspark
import pytest

from eospack.core import spark_features
from eospack.core.spark_features import (
    ADMISSION_CONTROL,
    ARROW_UDF,
    STREAM_ARROW_WRITER,
    TRIGGER_AVAILABLE_NOW,
    SparkFeatureError,
    python_supported,
    require,
    spark_supported,
    version_line,
)

# What each supported line has (docs/platforms.md), checked against the installed pyspark:
# make test-compat runs this on every line.
EXPECTED = {
    (4, 0): set(),
    (4, 1): {STREAM_ARROW_WRITER, ARROW_UDF},
    (4, 2): {STREAM_ARROW_WRITER, ARROW_UDF, ADMISSION_CONTROL, TRIGGER_AVAILABLE_NOW},
    (4, 3): {STREAM_ARROW_WRITER, ARROW_UDF, ADMISSION_CONTROL, TRIGGER_AVAILABLE_NOW},
}


@pytest.mark.compat
def test_the_installed_spark_has_exactly_the_features_its_line_has() -> None:
    line = version_line(pyspark.__version__)
    assert line in EXPECTED, f"pyspark {pyspark.__version__} is not a supported line"
    found = {feature for feature in spark_features.FEATURES if feature.available}
    assert found == EXPECTED[line]
    assert {f.since for f in spark_features.FEATURES} <= {"4.1", "4.2"}
    for feature in spark_features.FEATURES:
        assert feature.available == (line >= version_line(feature.since)), feature.name


@pytest.mark.compat
def test_a_missing_feature_is_refused_in_one_line_naming_the_spark_version() -> None:
    for feature in spark_features.FEATURES:
        if feature.available:
            require(feature, "something")
            continue
        with pytest.raises(SparkFeatureError) as raised:
            require(feature, "maxOffsetsPerTrigger")
        assert str(raised.value) == (
            f"maxOffsetsPerTrigger needs Spark {feature.since}+ ({feature.what}); this is"
            f" Spark {pyspark.__version__}"
        )


def test_versions_are_read_by_line() -> None:
    assert version_line("4.0.5") == (4, 0)
    assert version_line("4.1.0.dev0") == (4, 1)
    assert version_line("4.3.0rc1") == (4, 3)
    assert version_line("banana") is None
    assert [spark_supported(v) for v in ("3.5.4", "4.0.0", "4.2.1", "4.3.0", "4.4.0")] == [
        False,
        True,
        True,
        True,
        False,
    ]
    assert [python_supported(v) for v in ((3, 10), (3, 11), (3, 12), (3, 13), (3, 14))] == [
        False,
        True,
        True,
        True,
        False,
    ]
    assert python_supported(sys.version_info[:2])


@pytest.mark.compat
def test_doctor_names_the_spark_and_python_found_and_whether_each_is_supported() -> None:
    from eospack.tools.doctor import platform_checks

    spark, python = platform_checks()
    assert spark.passed and python.passed
    assert spark.line.startswith(f"spark: Spark {pyspark.__version__} (supported; ")
    minor = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert python.line == f"python: Python {minor} (supported: 3.11, 3.12, 3.13)"
    old_spark, old_python = platform_checks("3.5.4", (3, 10))
    assert old_spark == (
        False,
        "spark: Spark 3.5.4 is not supported: install pyspark of a supported line"
        " (4.0, 4.1, 4.2, 4.3)",
    )
    assert old_python == (
        False,
        "python: Python 3.10 is not supported: use Python 3.11, 3.12, 3.13",
    )
