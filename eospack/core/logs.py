"""Make the sinks' INFO lines (one per committed batch, the protocol chosen) visible."""

from __future__ import annotations

import logging
import sys


def make_logs_visible() -> None:
    """Spark's Python workers configure no logging: show eospack's INFO lines on stderr.

    Does nothing when the application (or eospack) already configured a handler.
    """
    root = logging.getLogger("eospack")
    if root.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.INFO)
