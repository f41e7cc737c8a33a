"""``eospack doctor`` without fresh venvs: the lookup check, its lines and the exit code."""

from __future__ import annotations

import io
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

import eospack
from eospack.cli import main
from eospack.tools import doctor
from eospack.tools.doctor import (
    FORMAT_MODULES,
    FORMATS_NOT_FOUND,
    data_path_check,
    formats_check,
    formats_visible_to_spark,
    run_doctor,
)


def test_formats_are_visible_to_spark_in_this_environment() -> None:
    assert formats_visible_to_spark()


@pytest.mark.parametrize(
    ("files", "visible"),
    [(list(FORMAT_MODULES), True), (list(FORMAT_MODULES)[:2], False), ([], False)],
)
def test_visibility_follows_what_sys_path_lists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: list[str], visible: bool
) -> None:
    for module in files:
        (tmp_path / f"{module}.py").write_text("")
    # the real modules stay importable (already imported), as under an import hook
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    assert formats_visible_to_spark() is visible


def test_format_names_are_those_the_modules_register() -> None:
    import pyspark_2pc_jdbc
    import pyspark_2pc_kafka
    import pyspark_2pc_s3
    import pyspark_replayable_kafka

    modules = (pyspark_replayable_kafka, pyspark_2pc_jdbc, pyspark_2pc_s3, pyspark_2pc_kafka)
    assert {module.__name__: module.DefaultSource.name() for module in modules} == FORMAT_MODULES


def test_found_formats_are_named_in_one_line() -> None:
    assert formats_check(True) == (
        True,
        "formats: found by Spark's automatic lookup"
        " (replayable-kafka, 2pc-jdbc, 2pc-s3, 2pc-kafka)",
    )


def test_unseen_formats_give_one_line_with_the_remedies() -> None:
    passed, line = formats_check(False)
    assert not passed
    assert line == FORMATS_NOT_FOUND
    assert "\n" not in line
    assert line.startswith("formats: Spark's automatic lookup cannot see")
    for remedy in ("eospack.register(spark)", "--config-settings editable_mode=compat", "wheel"):
        assert remedy in line


def test_doctor_fails_when_spark_cannot_see_the_formats(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doctor, "formats_visible_to_spark", lambda: False)
    output = io.StringIO()
    assert run_doctor(output) == 1
    lines = output.getvalue().splitlines()
    assert len(lines) == 5
    assert lines[0].startswith("java: Java ")
    assert lines[1] == FORMATS_NOT_FOUND


def test_doctor_fails_with_one_line_when_java_is_missing(tmp_path: Path) -> None:
    output = io.StringIO()
    assert run_doctor(output, java_home=str(tmp_path)) == 1
    assert output.getvalue().splitlines()[0] == (
        "java: Java was not found: install Java 17 or 21"
        " (e.g. apt-get install openjdk-17-jre-headless) or set JAVA_HOME to one"
    )


def test_cli_doctor_passes_in_this_environment(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 5
    assert lines[0].startswith("java: Java ")
    assert lines[1].startswith("formats: found by Spark's automatic lookup")
    from eospack.connectors.kafka.records import record_batches

    assert lines[2] == f"kafka data path: {record_batches.active_path()}"
    assert [line.line for line in doctor.platform_checks()] == lines[3:]


@pytest.mark.skipif(
    shutil.which("cargo") is None or os.environ.get("EOSPACK_NATIVE") == "0",
    reason="no Rust compiler here: the reference path is the one that runs",
)
def test_a_machine_with_a_rust_compiler_runs_the_native_path() -> None:
    """`make install` builds the extension wherever cargo is: CI runs the native path."""
    from eospack.connectors.kafka.records import native_path, record_batches

    assert record_batches.NATIVE is not None, native_path.NATIVE_MISSING
    assert record_batches.active_path().startswith("native (eospack._native ")


@pytest.mark.skipif(
    shutil.which("cargo") is None or os.environ.get("EOSPACK_NATIVE") == "0",
    reason="no Rust compiler here: the reference path is the one that runs",
)
def test_make_install_builds_the_native_path_optimised() -> None:
    """The extension this venv runs (built by `make install`, an editable install, which
    setuptools-rust compiles in debug mode unless told otherwise) is a release build, as
    the benchmarks measure it."""
    from eospack.connectors.kafka.records import native_path

    assert native_path.NATIVE is not None, native_path.NATIVE_MISSING
    assert native_path.NATIVE.build_profile() == "release"
    assert native_path.active_path() == (
        f"native (eospack._native {native_path.NATIVE.__version__}, Rust, release build)"
    )


def test_doctor_says_when_the_native_path_is_a_debug_build(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from types import SimpleNamespace

    from eospack.connectors.kafka.records import native_path

    debug_build = SimpleNamespace(__version__="0.1.0", build_profile=lambda: "debug")
    monkeypatch.setattr(native_path, "NATIVE", debug_build)
    monkeypatch.setattr(native_path, "_warned", False)
    line = (
        "kafka data path: native (eospack._native 0.1.0, Rust, debug build): not optimised,"
        " reads Kafka 1.3-1.7x slower than a release build; reinstall eospack (pip install .),"
        " which compiles it optimised"
    )
    assert data_path_check() == (True, line)
    with caplog.at_level(logging.WARNING):
        native_path.warn_if_reference_path()
        native_path.warn_if_reference_path()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"eospack's Kafka data path is {line.removeprefix('kafka data path: ')}"]


def test_a_release_build_is_not_warned_about(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from types import SimpleNamespace

    from eospack.connectors.kafka.records import native_path

    release_build = SimpleNamespace(__version__="0.1.0", build_profile=lambda: "release")
    monkeypatch.setattr(native_path, "NATIVE", release_build)
    monkeypatch.setattr(native_path, "_warned", False)
    with caplog.at_level(logging.WARNING):
        native_path.warn_if_reference_path()
    assert [r for r in caplog.records if r.levelno == logging.WARNING] == []


def test_doctor_names_the_reference_path_and_what_is_missing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from eospack.connectors.kafka.records import native_path

    monkeypatch.setattr(native_path, "NATIVE", None)
    monkeypatch.setattr(native_path, "NATIVE_MISSING", "the extension is not built")
    monkeypatch.setattr(native_path, "_warned", False)
    assert data_path_check() == (
        True,
        "kafka data path: pure Python (reference): the extension is not built",
    )
    with caplog.at_level(logging.WARNING):
        native_path.warn_if_reference_path()
        native_path.warn_if_reference_path()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "eospack's Kafka data path is pure Python (reference): the extension is not built"
    ]


def test_eospack_native_0_selects_the_reference_path_in_a_new_process() -> None:
    """The documented switch: the decision is taken at import, so a new interpreter."""
    import subprocess

    probe = (
        "from eospack.connectors.kafka.records import native_path, record_batches;"
        "print(native_path.active_path()); print(record_batches.NATIVE is None)"
    )
    completed = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, "EOSPACK_NATIVE": "0"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert completed.stdout.splitlines() == [
        "pure Python (reference): EOSPACK_NATIVE=0 selects the reference path",
        "True",
    ]


LOCAL_SESSION_SETTINGS = {"spark.python.daemon.module": "eospack.python_daemon"}


def test_the_settings_local_session_makes_pass(tmp_path: Path) -> None:
    results = doctor.session_checks(LOCAL_SESSION_SETTINGS, str(tmp_path))
    assert [result.passed for result in results] == [True, True, True]
    assert [result.line for result in results] == [
        "python workers: reused between tasks",
        "python daemon: eospack.python_daemon",
        "spark home: Python workers import the installed pyspark",
    ]


def test_each_costly_setting_gets_one_line_naming_the_fix(tmp_path: Path) -> None:
    (tmp_path / "python" / "lib").mkdir(parents=True)
    (tmp_path / "python" / "lib" / "pyspark.zip").write_bytes(b"")
    settings = {"spark.python.worker.reuse": "false"}
    results = doctor.session_checks(settings, str(tmp_path))
    assert [result.passed for result in results] == [False, False, False]
    fixes = (
        "set spark.python.worker.reuse=true",
        "set spark.python.daemon.module=eospack.python_daemon",
        "eospack.tools.spark.local_session",
    )
    for result, fix in zip(results, fixes, strict=True):
        assert fix in result.line and "\n" not in result.line


def test_doctor_reports_a_running_session(spark: Any) -> None:
    output = io.StringIO()
    assert run_doctor(output, spark=spark) == 0
    lines = output.getvalue().splitlines()
    assert lines[3].startswith("spark: Spark ") and lines[4].startswith("python: Python ")
    assert lines[5:] == [
        f"worker python: {sys.executable} imports eospack",
        "python workers: reused between tasks",
        "python daemon: eospack.python_daemon",
        "spark home: Python workers import the installed pyspark",
    ]


def test_cli_doctor_session_checks_the_running_session(
    spark: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["doctor", "--session"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[3].startswith("spark: Spark ") and lines[4].startswith("python: Python ")
    assert lines[5:] == [
        f"worker python: {sys.executable} imports eospack",
        "python workers: reused between tasks",
        "python daemon: eospack.python_daemon",
        "spark home: Python workers import the installed pyspark",
    ]
    assert not spark.sparkContext._jsc.sc().isStopped()  # a session it did not start


def test_the_workers_python_is_pysparks_decision_else_the_setting_then_the_variable() -> None:
    setting = {"spark.pyspark.python": "/opt/setting/python"}
    variable = {"PYSPARK_PYTHON": "/opt/variable/python"}
    assert doctor.worker_python("/opt/context/python", setting, variable) == "/opt/context/python"
    assert doctor.worker_python(None, setting, variable) == "/opt/setting/python"
    assert doctor.worker_python(None, {}, variable) == "/opt/variable/python"
    assert doctor.worker_python(None, {}, {}) == "python3"


def python_without_eospack(tmp_path: Path) -> str:
    """This interpreter started isolated and without site-packages: what a venv-less system
    Python is to Spark's workers (it runs, but cannot import eospack)."""
    wrapper = tmp_path / "python-without-site-packages"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def test_a_workers_python_that_cannot_import_eospack_gets_one_line_naming_the_fix(
    tmp_path: Path,
) -> None:
    python = python_without_eospack(tmp_path)
    result = doctor.worker_python_check(python)
    assert result == doctor.CheckResult(
        False,
        f"worker python: {python} (what Spark's workers start) cannot import eospack:"
        f" set PYSPARK_PYTHON={sys.executable} before the session starts"
        f" (or spark.pyspark.python={sys.executable} with spark-submit)",
    )
    missing = doctor.worker_python_check(str(tmp_path / "no-such-python"))
    assert not missing.passed and "\n" not in missing.line
    assert f"set PYSPARK_PYTHON={sys.executable}" in missing.line


def test_the_current_python_passes_without_starting_a_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(*arguments: Any, **options: Any) -> None:
        raise AssertionError("no subprocess for the current interpreter")

    monkeypatch.setattr(doctor.subprocess, "run", refuse)
    assert doctor.worker_python_check(sys.executable) == doctor.CheckResult(
        True, f"worker python: {sys.executable} imports eospack"
    )


def test_register_refuses_a_local_session_whose_workers_cannot_import_eospack(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    python = python_without_eospack(tmp_path)
    monkeypatch.setattr(spark.sparkContext, "pythonExec", python)
    with pytest.raises(doctor.WorkerPythonError) as raised:
        eospack.register(spark)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"worker python: {python} ")
    assert f"set PYSPARK_PYTHON={sys.executable}" in message
    output = io.StringIO()
    assert run_doctor(output, spark=spark) == 1
    assert message in output.getvalue().splitlines()


def test_register_accepts_a_local_session_whose_workers_run_this_python(spark: Any) -> None:
    assert spark.sparkContext.pythonExec == sys.executable
    eospack.register(spark)
