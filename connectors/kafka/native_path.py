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


def active_path() -> str:
    """One line for ``eospack doctor`` and the query-start warning."""
    if NATIVE is not None:
        return f"native (eospack._native {NATIVE.__version__}, Rust)"
    return f"pure Python (reference): {NATIVE_MISSING}"


_warned = False


def warn_if_reference_path() -> None:
    """Once per process: say the data path is the slow reference, and what is missing."""
    global _warned
    if NATIVE is None and not _warned:
        _warned = True
        log.warning("eospack's Kafka data path is %s", active_path())
