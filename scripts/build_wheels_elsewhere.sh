#!/usr/bin/env bash
# eospack's binary wheels for the platforms `make wheel` (Linux x86_64) does not build:
# Linux aarch64 and macOS arm64. Each is one abi3 wheel (cp311-abi3: CPython 3.11 and
# later), its extension a release build, checked and retagged by the platform's repair tool
# (auditwheel on Linux, delocate on macOS), then installed and run on each of 3.11 and 3.13
# where the host can run them. Wheels go to DIST (default dist/).
#
#   scripts/build_wheels_elsewhere.sh linux-aarch64      # cibuildwheel in manylinux2014_aarch64
#   scripts/build_wheels_elsewhere.sh linux-aarch64-zig  # cross-compiled here with zig, no Docker
#   scripts/build_wheels_elsewhere.sh macos-arm64        # cibuildwheel on an Apple silicon Mac
#
# linux-aarch64 needs Docker; on an aarch64 host (GitHub's ubuntu-24.04-arm runners, a
# Graviton machine) it runs natively, on x86_64 under QEMU (register it once with
# `docker run --privileged --rm tonistiigi/binfmt --install arm64`; ~10x slower). Rust is
# installed inside the manylinux container (rustup), so the host needs none.
# linux-aarch64-zig needs cargo with the aarch64-unknown-linux-gnu target (rustup target add)
# and the build extra (cargo-zigbuild, ziglang, auditwheel): zig links against glibc 2.17 as
# on x86_64; the wheel cannot be run here (no aarch64 Python), only checked by auditwheel.
# macos-arm64 needs a Mac with Xcode's command line tools and rustup; MACOSX_DEPLOYMENT_TARGET
# 11.0 (the first arm64 macOS) gives a macosx_11_0_arm64 wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
platform=${1:?usage: $0 linux-aarch64|linux-aarch64-zig|macos-arm64 [DIST]}
dist=$(realpath -m "${2:-dist}")
python=${PYTHON:-.venv/bin/python}

# Imports the extension in the installed wheel: loads on this Python, release build, decodes.
probe='import eospack._native as n, eospack.connectors.kafka.records.native_path as p; assert n.build_profile() == "release", n.build_profile(); assert p.NATIVE is n; print(p.active_path())'

cibuildwheel() {
    "$python" -m pip install --progress-bar off 'cibuildwheel>=3.1'
    # One build (cp311, abi3); cibuildwheel's test step installs it with its dependencies
    # and runs the probe on that Python. pyspark is an sdist (pure Python) and builds there.
    CIBW_BUILD='cp311-*' \
    CIBW_SKIP='*-musllinux_*' \
    CIBW_BUILD_VERBOSITY=1 \
    CIBW_TEST_COMMAND="python -c '$probe'" \
        "$python" -m cibuildwheel --output-dir "$dist" "$@" .
}

case "$platform" in
linux-aarch64)
    CIBW_ARCHS_LINUX=aarch64 \
    CIBW_MANYLINUX_AARCH64_IMAGE=manylinux2014 \
    CIBW_BEFORE_ALL_LINUX='curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal' \
    CIBW_ENVIRONMENT_LINUX='PATH="$HOME/.cargo/bin:$PATH"' \
        cibuildwheel --platform linux
    ;;
linux-aarch64-zig)
    # make wheel's script: setuptools-rust builds for CARGO_BUILD_TARGET with cargo-zigbuild,
    # bdist_wheel's --plat-name tags it linux_aarch64, auditwheel checks manylinux_2_17_aarch64
    rustup target add aarch64-unknown-linux-gnu
    "$python" scripts/build_wheel.py --arch aarch64 --dist "$dist"
    ;;
macos-arm64)
    MACOSX_DEPLOYMENT_TARGET=11.0 \
    CIBW_ARCHS_MACOS=arm64 \
        cibuildwheel --platform macos
    ;;
*)
    echo "unknown platform $platform: linux-aarch64, linux-aarch64-zig or macos-arm64" >&2
    exit 2
    ;;
esac
ls -l "$dist"
