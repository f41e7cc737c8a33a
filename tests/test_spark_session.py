"""The Spark helper: interpreter, Java check and automatic registration of the formats."""

from __future__ import annotations

import sys
from pathlib import Path

import pyspark
import pytest

from eospack.core.java import JavaNotFoundError, check_java
from eospack.tools import registration
from eospack.tools.spark import worker_spark_home


def test_session_runs_python_workers_with_this_interpreter(spark):
    executables = spark.sparkContext.parallelize([0], 1).map(lambda _: sys.executable).collect()
    assert executables == [sys.executable]


def test_python_workers_import_the_installed_pyspark_not_its_zip(spark):
    """pyspark.zip keeps no bytecode: every fresh worker process would compile pyspark."""
    files = (
        spark.sparkContext.parallelize([0], 1)
        .map(lambda _: __import__("pyspark").__file__)
        .collect()
    )
    assert files == [pyspark.__file__]


def fake_pyspark_home(root: Path) -> Path:
    home = root / "pyspark"
    for folder in ("bin", "jars", "python/lib", "python/pyspark"):
        (home / folder).mkdir(parents=True)
    (home / "python" / "lib" / "pyspark.zip").write_bytes(b"")
    return home


def test_the_worker_spark_home_links_all_but_the_zipped_packages(tmp_path):
    home = fake_pyspark_home(tmp_path)
    made = worker_spark_home(home, tmp_path / "cache", configured="")
    assert made is not None
    assert sorted(entry.name for entry in made.iterdir()) == ["bin", "jars", "python"]
    assert (made / "jars").resolve() == home / "jars"
    assert [entry.name for entry in (made / "python").iterdir()] == ["pyspark"]
    # Made once; SPARK_HOME naming the package itself is served the same.
    assert worker_spark_home(home, tmp_path / "cache", configured=str(home)) == made


def test_another_spark_home_or_one_without_the_zip_is_left_alone(tmp_path):
    home = fake_pyspark_home(tmp_path)
    other = str(tmp_path / "spark-4.3.0-bin-hadoop3")
    assert worker_spark_home(home, tmp_path / "cache", configured=other) is None
    (home / "python" / "lib" / "pyspark.zip").unlink()
    assert worker_spark_home(home, tmp_path / "cache", configured="") is None


def test_formats_are_registered_without_a_register_call(spark):
    from pyspark.sql.datasource import DataSource

    import pyspark_2pc_jdbc
    import pyspark_2pc_kafka
    import pyspark_2pc_s3
    import pyspark_replayable_kafka

    names = {
        module.DefaultSource.name()
        for module in (
            pyspark_replayable_kafka,
            pyspark_2pc_jdbc,
            pyspark_2pc_s3,
            pyspark_2pc_kafka,
        )
        if issubclass(module.DefaultSource, DataSource)
    }
    assert names == {"replayable-kafka", "2pc-jdbc", "2pc-s3", "2pc-kafka"}
    registered = spark._jsparkSession.sessionState().dataSourceManager()
    for name in names:
        assert registered.dataSourceExists(name), name


def test_missing_java_is_reported_with_the_versions_needed(tmp_path):
    with pytest.raises(JavaNotFoundError, match="Java was not found: install Java 17 or 21"):
        check_java(java_home=str(tmp_path))


def test_wrong_java_version_is_reported(tmp_path):
    java = tmp_path / "bin" / "java"
    java.parent.mkdir()
    java.write_text("#!/bin/sh\necho 'openjdk version \"25.0.1\" 2025-10-21' >&2\n")
    java.chmod(0o755)
    with pytest.raises(JavaNotFoundError, match="needs Java 17 or 21 but found Java 25"):
        check_java(java_home=str(tmp_path))


def test_registration_fills_the_keys_concurrent_query_starts_would_insert(spark):
    """Spark's source runner puts these keys into the format's shared environment map at
    every query start; present beforehand, concurrent starts only overwrite values and the
    map never loses an entry (docs/spark-python-datasource-envvars-race.md)."""

    manager = spark._jsparkSession.sessionState().dataSourceManager()
    for name in ("replayable-kafka", "2pc-jdbc", "2pc-s3", "2pc-kafka"):
        environment = manager.lookupDataSource(name).dataSourceCls().envVars()
        present = set(environment.keySet().toArray())
        assert present >= set(registration.SOURCE_RUNNER_KEYS), name
        assert environment.get("SPARK_PYTHON_RUNTIME") == "PYTHON_WORKER"
        assert all(environment.get(key) for key in registration.SOURCE_RUNNER_KEYS), name
