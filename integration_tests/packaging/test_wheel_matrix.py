"""The binary wheel on each supported Python, installed as a user without Rust installs it.

On demand (``make test-wheel``, a few minutes; marked ``chaos``, so also in the release
checks of ``pytest -m chaos``): ``make test`` runs ``test_fresh_install.py`` instead, which
checks the same wheel on this Python with the dependencies borrowed from this venv.

The wheel is ``EOSPACK_WHEEL`` (e.g. what ``make wheel`` left in ``dist/``), else one built
here by ``scripts/build_wheel.py`` (Rust reusing ``native/target``). For Python 3.11, 3.12
and 3.13 (pyenv's, ``~/.pyenv/versions/<v>/bin/python<major.minor>``): a new venv, a PATH
without cargo and rustc, pyspark installed first (a platform's own pyspark, as on
Databricks or EMR; the package index serves pyspark as an sdist only, which
``--only-binary :all:`` refuses), then ``pip install --only-binary :all: <wheel>``: eospack
and every other dependency from wheels, nothing compiled. Then the native path runs there:
a record batch decoded through ``eospack._native``, a release build, and ``eospack doctor``
says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from integration_tests.packaging.native_probe_parts import EXPECTED_VALUES, NATIVE_PROBE

# A release check, as the chaos lane's: make test (-m "not chaos") leaves it out.
pytestmark = [pytest.mark.timeout(1200), pytest.mark.chaos]

PROJECT = Path(__file__).resolve().parents[2]
PYENV_VERSIONS = Path.home() / ".pyenv" / "versions"
PYTHONS = ("3.11", "3.12", "3.13")
PIP_TIMEOUT = 900
RESULT_PREFIX = "RESULT "


def pyenv_python(version: str) -> Path:
    """The newest pyenv patch release of ``version`` (e.g. 3.12 -> 3.12.1)."""
    candidates = sorted(
        PYENV_VERSIONS.glob(f"{version}.*/bin/python{version}"),
        key=lambda path: tuple(int(part) for part in path.parents[1].name.split(".")),
    )
    if not candidates:
        pytest.skip(f"no Python {version} at {PYENV_VERSIONS}/{version}.*/bin/python{version}")
    return candidates[-1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("EOSPACK_WHEEL")
    if given:
        return Path(given).resolve()
    dist = tmp_path_factory.mktemp("dist")
    script = [sys.executable, str(PROJECT / "scripts" / "build_wheel.py"), "--dist", str(dist)]
    completed = subprocess.run(script, capture_output=True, text=True, timeout=PIP_TIMEOUT)
    assert completed.returncode == 0, f"{completed.stdout[-3000:]}\n{completed.stderr[-3000:]}"
    (built,) = dist.glob("eospack-*.whl")
    return built


def pyspark_requirement(wheel: Path) -> str:
    """The wheel's own pyspark requirement (its Requires-Dist without extras)."""
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
        lines = archive.read(metadata).decode().splitlines()
    (requirement,) = [
        line.removeprefix("Requires-Dist: ")
        for line in lines
        if line.startswith("Requires-Dist: pyspark") and "extra ==" not in line
    ]
    return requirement


def environment_without_rust(venv: Path) -> dict[str, str]:
    """An activated venv's environment on a PATH where neither cargo nor rustc is found."""
    environment = {
        key: value
        for key, value in os.environ.items()
        if key not in {"PYTHONPATH", "PYTHONHOME", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"}
        and not key.startswith(("CARGO", "RUSTUP"))
    }
    environment.pop("EOSPACK_NATIVE", None)
    path = [
        entry
        for entry in environment.get("PATH", "").split(os.pathsep)
        if not ((Path(entry) / "cargo").exists() or (Path(entry) / "rustc").exists())
    ]
    environment["PATH"] = os.pathsep.join([str(venv / "bin"), *path])
    environment["VIRTUAL_ENV"] = str(venv)
    return environment


def run(arguments: list[str], environment: dict[str, str], cwd: Path, timeout: float) -> str:
    completed = subprocess.run(
        arguments,
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert completed.returncode == 0, (
        f"{' '.join(arguments)} exited {completed.returncode}:\n"
        f"{completed.stdout[-3000:]}\n{completed.stderr[-5000:]}"
    )
    return completed.stdout


@pytest.mark.parametrize("version", PYTHONS)
def test_the_wheel_installs_from_binaries_only_and_runs_the_release_native_path(
    wheel: Path, tmp_path: Path, version: str
) -> None:
    python = pyenv_python(version)
    venv = tmp_path / "venv"
    subprocess.run([str(python), "-m", "venv", str(venv)], check=True, timeout=PIP_TIMEOUT)
    environment = environment_without_rust(venv)
    workdir = tmp_path / "work"
    workdir.mkdir()
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    started = time.monotonic()
    run([*pip, "install", pyspark_requirement(wheel)], environment, workdir, PIP_TIMEOUT)
    pyspark_seconds = time.monotonic() - started
    started = time.monotonic()
    run([*pip, "install", "--only-binary", ":all:", str(wheel)], environment, workdir, PIP_TIMEOUT)
    wheel_seconds = time.monotonic() - started
    print(
        f"python {version} ({python}): pyspark in {pyspark_seconds:.0f} s, then"
        f" pip install --only-binary :all: {wheel.name} in {wheel_seconds:.0f} s",
        file=sys.stderr,
    )

    script = workdir / "probe.py"
    script.write_text(NATIVE_PROBE)
    output = run([str(venv / "bin" / "python"), str(script)], environment, workdir, 120)
    (result,) = [line for line in output.splitlines() if line.startswith(RESULT_PREFIX)]
    probe = json.loads(result.removeprefix(RESULT_PREFIX))
    site_packages = venv / "lib" / f"python{version}" / "site-packages"
    assert Path(probe["file"]) == site_packages / "eospack" / "_native.abi3.so"
    assert probe["build"] == "release"
    assert probe["selected"] is True
    assert probe["values"] == EXPECTED_VALUES and probe["next_offset"] == 3

    doctor = subprocess.run(
        [str(venv / "bin" / "eospack"), "doctor"],
        cwd=workdir,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "kafka data path: native (eospack._native 0.1.0, Rust, release build)" in (
        doctor.stdout.splitlines()
    ), f"{doctor.stdout}\n{doctor.stderr}"
