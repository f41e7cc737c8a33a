"""Where eospack keeps what it fetches or builds once per machine (Maven jars, the Spark
home a worker Python reads): ``$EOSPACK_CACHE_DIR``, else ``~/.cache/eospack``."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR_VARIABLE = "EOSPACK_CACHE_DIR"


def cache_directory() -> Path:
    """``$EOSPACK_CACHE_DIR``, else ``~/.cache/eospack`` (not created here)."""
    configured = os.environ.get(CACHE_DIR_VARIABLE, "").strip()
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "eospack"
