"""What a user sees after installing eospack into a fresh virtual environment.

Two installs of a copy of the project, each in its own new venv, checked from a working
directory outside the project (the current directory is on ``sys.path`` of Spark's Python
workers and would hide the difference):

- plain ``pip install -e`` (pip's default editable mode, an import hook): Spark's
  automatic lookup misses the formats, ``eospack doctor`` says so, a session that calls
  ``eospack.register`` writes with 2pc-jdbc, and ``eospack demo`` (whose sessions come
  from ``eospack.spark.local_session``, which registers) runs to VERIFIED;
- a wheel: the lookup finds the formats, and a plain ``SparkSession`` writes with them.

The venvs reuse this interpreter's dependencies (pyspark, pyarrow, ...) through a ``.pth``
line naming its site-packages: such a path is appended to ``sys.path`` but the ``.pth``
files inside it are not processed, so this project's own install does not leak in (checked
by ``test_*_install_is_served_from_the_fresh_install``). Only eospack is built, with
``--no-deps``, in pip's isolated build environment with the ``setuptools>=68`` and
``setuptools-rust`` that pyproject.toml requires, as users' pip does: this needs the package
index (pip caches the wheels). The Rust extension compiles once per test session (a shared
``CARGO_TARGET_DIR``); a third install builds on a PATH without cargo, as on a machine
without Rust. ``--no-build-isolation`` would build with this venv's setuptools, 65.5
here, which cannot build wheels without the ``wheel`` package.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import sysconfig
import zipfile
from dataclasses import dataclass
from pathlib import Path
from pkgutil import walk_packages
from typing import Any

import pytest

import eospack
from eospack.doctor import FORMAT_MODULES, FORMATS_FOUND, FORMATS_NOT_FOUND

pytestmark = pytest.mark.timeout(600)

PROJECT = Path(__file__).resolve().parents[1]
# pyproject.toml's [tool.setuptools.packages.find] include (its py-modules: FORMAT_MODULES);
# eospack/connectors, commit_protocols and stateful_ops are links, copied as folders
PACKAGES = ("eospack",)
FORMATS = tuple(FORMAT_MODULES.values())
ROWS = [(1, "one"), (2, "two"), (3, "three")]
PIP_TIMEOUT = 300
SPARK_TIMEOUT = 240
DEMO_TIMEOUT = 540
RESULT_PREFIX = "RESULT "

# Where eospack and its pyspark_* modules come from, and how they are served.
IMPORT_PROBE = """
import json, sys
import eospack, pyspark_2pc_jdbc, pyspark_2pc_s3, pyspark_replayable_kafka
print("RESULT " + json.dumps({
    "files": [module.__file__ for module in (
        eospack, pyspark_replayable_kafka, pyspark_2pc_jdbc, pyspark_2pc_s3)],
    "sys_path": sys.path,
    "meta_path": [getattr(finder, "__module__", "") for finder in sys.meta_path],
}))
"""

# Every module of the project's eospack package, imported by name: one a package move
# added and the wheel left out would otherwise fail first in a user's Spark worker.
MODULES_PROBE = """
import importlib, json, sys
modules = [importlib.import_module(name) for name in json.loads(sys.argv[1])]
import pyspark_2pc_kafka
print("RESULT " + json.dumps({
    "files": [module.__file__ for module in (*modules, pyspark_2pc_kafka)],
    "sys_path": sys.path,
}))
"""

# The reference path decodes a record batch it encoded, where the extension is missing.
REFERENCE_PROBE = """
import json
import pyarrow as pa
from eospack.connectors.kafka import record_batches as rb
rows = pa.RecordBatch.from_pydict({"value": pa.array([b"a", b"b", None], pa.binary())})
settings = rb.EncodeSettings(1, 1 << 16, 1 << 20, "gzip", 1_700_000_000_000)
(encoded,), _ = rb.encode(rows, settings, 0)
decoded = rb.decode(bytes(encoded.data), 0, "t", 0, read_committed=True, include_headers=False)
print("RESULT " + json.dumps({"native": rb.NATIVE is not None, "rows": decoded.batch.num_rows}))
"""

# A Spark job as a user writes it: ``plain`` is SparkSession.builder without
# eospack.register, ``plain-then-register`` calls eospack.register after the first check
# (as eospack.spark.local_session does, which the demo test runs). It reports the error
# condition ``spark.read.format(name).load()`` raises for each format (an unknown format
# raises DATA_SOURCE_NOT_FOUND before any option is checked, from the JVM as a
# Py4JJavaError) and, given an input directory, a database and a checkpoint, streams the
# input through 2pc-jdbc into SQLite.
SPARK_JOB = """
import json, re, sys
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

session_kind = sys.argv[1]
spark = (
    SparkSession.builder.master("local[1]")
    .config("spark.ui.enabled", "false")
    .config("spark.sql.shuffle.partitions", "1")
    .getOrCreate()
)


def load_each_format():
    loaded = {}
    for name in ("replayable-kafka", "2pc-jdbc", "2pc-s3", "2pc-kafka"):
        try:
            spark.read.format(name).load()
            loaded[name] = "loaded"
        except Exception as error:
            condition = error.getCondition() if isinstance(error, PySparkException) else None
            match = re.search(r"\\[([A-Z][A-Z0-9_.]*)\\]", str(error))
            loaded[name] = condition or (match.group(1) if match else type(error).__name__)
    return loaded


result = {"load": load_each_format()}
if session_kind == "plain-then-register":
    import eospack

    eospack.register(spark)
    result["load_registered"] = load_each_format()
if len(sys.argv) > 2:
    from eospack.testing import await_query

    input_directory, database, checkpoint = sys.argv[2:5]
    query = (
        spark.readStream.schema("id BIGINT, name STRING").json(input_directory)
        .writeStream.format("2pc-jdbc")
        .option("url", "jdbc:sqlite:" + database)
        .option("dbtable", "numbers")
        .option("createTableIfNotExists", "true")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    await_query(query, 180)
    result["written"] = True
spark.stop()
print("RESULT " + json.dumps(result))
"""


@dataclass(frozen=True)
class FreshInstall:
    """A new venv with eospack installed from ``source``; commands run in ``workdir``."""

    venv: Path
    source: Path
    workdir: Path
    cargo_target: Path
    """Shared by the installs of one test session: the crate compiles once."""
    compiler: bool = True
    """False: a machine without Rust (cargo is taken off PATH)."""

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def site_packages(self) -> Path:
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        return self.venv / "lib" / version / "site-packages"

    def environment(self) -> dict[str, str]:
        """This process's environment as an activated venv sees it, without Python overrides."""
        environment = {
            key: value
            for key, value in os.environ.items()
            if key not in {"PYTHONPATH", "PYTHONHOME", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"}
        }
        environment["VIRTUAL_ENV"] = str(self.venv)
        path = environment.get("PATH", "").split(os.pathsep)
        if not self.compiler:
            path = [entry for entry in path if not (Path(entry) / "cargo").exists()]
        environment["PATH"] = os.pathsep.join([str(self.venv / "bin"), *path])
        environment["CARGO_TARGET_DIR"] = str(self.cargo_target)
        environment.pop("EOSPACK_NATIVE", None)
        return environment

    def run(self, arguments: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            arguments,
            cwd=self.workdir,
            env=self.environment(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def run_python(self, script: str, *arguments: str, timeout: float) -> dict[str, Any]:
        """Run ``script`` with the venv's python; return the JSON of its RESULT line."""
        path = self.workdir / "job.py"
        path.write_text(script)
        completed = self.run([str(self.python), str(path), *arguments], timeout)
        results = [
            line[len(RESULT_PREFIX) :]
            for line in completed.stdout.splitlines()
            if line.startswith(RESULT_PREFIX)
        ]
        assert completed.returncode == 0 and results, (
            f"{path.name} {' '.join(arguments)} exited {completed.returncode}:\n"
            f"{completed.stdout[-3000:]}\n{completed.stderr[-5000:]}"
        )
        return dict(json.loads(results[-1]))

    def write_rows(
        self, session_kind: str, directory: Path
    ) -> tuple[dict[str, Any], list[tuple[Any, ...]]]:
        """Stream ROWS through 2pc-jdbc into a new SQLite file.

        Returns the job's result (what loading each format raised) and the table's rows.
        """
        input_directory = directory / "input"
        input_directory.mkdir(parents=True)
        (input_directory / "part-0.json").write_text(
            "".join(json.dumps({"id": key, "name": name}) + "\n" for key, name in ROWS)
        )
        database = directory / "sink.db"
        result = self.run_python(
            SPARK_JOB,
            session_kind,
            str(input_directory),
            str(database),
            str(directory / "checkpoint"),
            timeout=SPARK_TIMEOUT,
        )
        assert result["written"] is True
        with sqlite3.connect(database) as connection:
            rows = connection.execute("SELECT id, name FROM numbers ORDER BY id").fetchall()
        return result, rows


def copy_project(destination: Path) -> Path:
    """Copy what the build needs, so that building never writes into the repository."""
    destination.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md", *(f"{module}.py" for module in FORMAT_MODULES)):
        shutil.copy2(PROJECT / name, destination / name)
    for package in PACKAGES:
        shutil.copytree(
            PROJECT / package,
            destination / package,
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "*.so"),
        )
    shutil.copytree(
        PROJECT / "native", destination / "native", ignore=shutil.ignore_patterns("target")
    )
    return destination


def create_venv(root: Path, cargo_target: Path, compiler: bool = True) -> FreshInstall:
    """A new venv that sees this interpreter's site-packages, and its own working directory."""
    venv = root / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", str(venv)], check=True, timeout=PIP_TIMEOUT, cwd=root
    )
    workdir = root / "work"
    workdir.mkdir()
    install = FreshInstall(
        venv=venv,
        source=copy_project(root / "source"),
        workdir=workdir,
        cargo_target=cargo_target,
        compiler=compiler,
    )
    (install.site_packages / "eospack-test-dependencies.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n"
    )
    return install


def pip(install: FreshInstall, *arguments: str) -> None:
    completed = install.run([str(install.python), "-m", "pip", *arguments], PIP_TIMEOUT)
    assert completed.returncode == 0, (
        f"pip {' '.join(arguments)}:\n{completed.stdout[-3000:]}\n{completed.stderr[-3000:]}"
    )


@pytest.fixture(scope="module")
def cargo_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cargo-target")


@pytest.fixture(scope="module")
def editable_install(tmp_path_factory: pytest.TempPathFactory, cargo_target: Path) -> FreshInstall:
    install = create_venv(tmp_path_factory.mktemp("editable"), cargo_target)
    pip(install, "install", "--no-deps", "-e", str(install.source))
    return install


def install_wheel(install: FreshInstall) -> Path:
    """``pip wheel .`` of the copy, installed; returns the wheel."""
    wheels = install.workdir.parent / "wheels"
    pip(install, "wheel", "--no-deps", "--wheel-dir", str(wheels), str(install.source))
    (wheel,) = wheels.glob("eospack-*.whl")
    pip(install, "install", "--no-deps", str(wheel))
    return wheel


@pytest.fixture(scope="module")
def wheel_install(tmp_path_factory: pytest.TempPathFactory, cargo_target: Path) -> FreshInstall:
    install = create_venv(tmp_path_factory.mktemp("wheel"), cargo_target)
    install_wheel(install)
    return install


def assert_not_from_the_project(probe: dict[str, Any]) -> None:
    """The project's own install (a path .pth naming the project) must not have leaked in."""
    assert str(PROJECT) not in probe["sys_path"]
    for file in probe["files"]:
        assert not Path(file).is_relative_to(PROJECT), file


def doctor_lines(install: FreshInstall) -> tuple[int, list[str]]:
    completed = install.run([str(install.venv / "bin" / "eospack"), "doctor"], timeout=120)
    assert completed.stderr == "", completed.stderr
    return completed.returncode, completed.stdout.splitlines()


def test_editable_install_is_served_from_the_fresh_install_by_an_import_hook(
    editable_install: FreshInstall,
) -> None:
    probe = editable_install.run_python(IMPORT_PROBE, timeout=120)
    assert_not_from_the_project(probe)
    for file in probe["files"]:
        assert Path(file).is_relative_to(editable_install.source), file
    assert str(editable_install.source) not in probe["sys_path"]
    assert any(module.startswith("__editable__") for module in probe["meta_path"]), probe


def test_doctor_says_spark_cannot_see_an_editable_install(editable_install: FreshInstall) -> None:
    exit_code, lines = doctor_lines(editable_install)
    assert exit_code == 1
    assert len(lines) == 3 and lines[0].startswith("java: Java "), lines
    assert lines[1] == FORMATS_NOT_FOUND


def test_a_plain_session_finds_the_formats_of_an_editable_install_once_registered(
    editable_install: FreshInstall, tmp_path: Path
) -> None:
    result, rows = editable_install.write_rows("plain-then-register", tmp_path)
    assert result["load"] == dict.fromkeys(FORMATS, "DATA_SOURCE_NOT_FOUND")
    assert result["load_registered"] == dict.fromkeys(FORMATS, "PYTHON_DATA_SOURCE_ERROR")
    assert rows == ROWS


def test_wheel_install_is_served_from_the_fresh_install(wheel_install: FreshInstall) -> None:
    probe = wheel_install.run_python(IMPORT_PROBE, timeout=120)
    assert_not_from_the_project(probe)
    for file in probe["files"]:
        assert Path(file).is_relative_to(wheel_install.site_packages), file


def test_every_module_of_the_project_imports_from_a_wheel_install(
    wheel_install: FreshInstall,
) -> None:
    names = sorted(module.name for module in walk_packages(eospack.__path__, "eospack."))
    assert "eospack.connectors.kafka.sink" in names
    probe = wheel_install.run_python(MODULES_PROBE, json.dumps(names), timeout=120)
    assert_not_from_the_project(probe)
    assert len(probe["files"]) == len(names) + 1
    for file in probe["files"]:
        assert Path(file).is_relative_to(wheel_install.site_packages), file


def test_doctor_finds_everything_in_a_wheel_install(wheel_install: FreshInstall) -> None:
    exit_code, lines = doctor_lines(wheel_install)
    assert exit_code == 0
    assert len(lines) == 3 and lines[0].startswith("java: Java "), lines
    assert lines[1] == FORMATS_FOUND.format(formats=", ".join(FORMATS))
    assert lines[2] == "kafka data path: native (eospack._native 0.1.0, Rust)"


def test_the_wheel_holds_the_native_extension(wheel_install: FreshInstall) -> None:
    (wheel,) = (wheel_install.workdir.parent / "wheels").glob("eospack-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        assert [name for name in archive.namelist() if "_native" in name] == [
            "eospack/_native.abi3.so",
            "eospack/_native.pyi",
        ]


def test_without_a_rust_compiler_the_wheel_runs_the_reference_path_and_says_so(
    tmp_path_factory: pytest.TempPathFactory, cargo_target: Path
) -> None:
    """A machine without cargo: the build skips the optional extension, the install works,
    ``eospack doctor`` names the path and the fix, and both paths read the same records."""
    install = create_venv(tmp_path_factory.mktemp("no-rust"), cargo_target, compiler=False)
    wheel = install_wheel(install)
    with zipfile.ZipFile(wheel) as archive:
        assert not [name for name in archive.namelist() if name.endswith(".so")]
    exit_code, lines = doctor_lines(install)
    assert exit_code == 0
    assert lines[2].startswith(
        "kafka data path: pure Python (reference): the extension eospack._native is not built"
    ), lines
    assert lines[2].endswith(
        "install a Rust compiler (https://rustup.rs) and reinstall eospack (pip install .)"
    )
    probe = install.run_python(REFERENCE_PROBE, timeout=120)
    assert probe == {"native": False, "rows": 3}


def test_plain_session_finds_and_writes_with_a_wheel_install(
    wheel_install: FreshInstall, tmp_path: Path
) -> None:
    result, rows = wheel_install.write_rows("plain", tmp_path)
    # found: the error is eospack's own (no options given, or no reader), raised in Python
    assert result["load"] == dict.fromkeys(FORMATS, "PYTHON_DATA_SOURCE_ERROR")
    assert rows == ROWS


def test_demo_runs_to_verified_from_an_editable_install(editable_install: FreshInstall) -> None:
    """The issue's first-run check: plain ``pip install -e .`` then ``eospack demo``.

    Small (3,000 events, one crash) to keep CI short; the full default run is in docs/demo.md.
    """
    demo = [str(editable_install.venv / "bin" / "eospack"), "demo", "--crashes", "1"]
    demo += ["--events", "3000", "--produce-seconds", "10"]
    completed = editable_install.run(demo, timeout=DEMO_TIMEOUT)
    output = completed.stdout
    assert completed.returncode == 0, f"{output[-4000:]}\n{completed.stderr[-4000:]}"
    assert "VERIFIED: both counters equal what was produced, exactly once" in output
    assert "SIGKILL count_1 (crash 1/1)" in output
    table = {line.split("  ")[0].strip(): line.split()[-2:] for line in output.splitlines()}
    assert table["counted"] == ["3000", "3000"]
    assert table["crashes"] == ["1", "0"]
