"""Which Kafka data path runs: the native extension ``eospack._native`` or the pure-Python
reference (``record_batches``). Imports nothing heavy, so a query's driver side can warn
at its start without loading pyarrow into Spark's planner processes."""

from __future__ import annotations

import logging
import os
from types import ModuleType

log = logging.getLogger(__name__)


def _load_native() -> tuple[ModuleType | None, str]:
    if os.environ.get("EOSPACK_NATIVE", "1").strip().lower() in ("0", "false", "no", "off"):
        return None, "EOSPACK_NATIVE=0 selects the reference path"
    try:
        import eospack._native as _native
    except ImportError as error:
        return None, (
            f"the extension eospack._native is not built ({error}): install a Rust compiler"
            " (https://rustup.rs) and reinstall eospack (pip install .)"
        )
    return _native, ""


NATIVE, NATIVE_MISSING = _load_native()


def build_profile() -> str | None:
    """How the loaded extension was compiled: ``"release"`` (what every install builds),
    ``"debug"`` (debug assertions, reads Kafka 1.3-1.7x slower), ``"unknown"`` (an
    extension from before it said so); None on the reference path."""
    if NATIVE is None:
        return None
    profile = getattr(NATIVE, "build_profile", None)
    return str(profile()) if profile is not None else "unknown"


def active_path() -> str:
    """One line for ``eospack doctor`` and the query-start warning."""
    if NATIVE is not None:
        build = build_profile()
        line = f"native (eospack._native {NATIVE.__version__}, Rust, {build} build)"
        if build != "release":
            line += (
                ": not optimised, reads Kafka 1.3-1.7x slower than a release build;"
                " reinstall eospack (pip install .), which compiles it optimised"
            )
        return line
    return f"pure Python (reference): {NATIVE_MISSING}"


_warned = False


def warn_if_reference_path() -> None:
    """Once per process: say the data path is the slow reference, and what is missing, or
    a native extension that is not a release build."""
    global _warned
    if (NATIVE is None or build_profile() != "release") and not _warned:
        _warned = True
        log.warning("eospack's Kafka data path is %s", active_path())
