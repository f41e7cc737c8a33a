"""Write the installed layout of this checkout as links: ``python scripts/installed_layout.py
DESTINATION`` makes ``DESTINATION/eospack`` with connectors/, commit_protocols/ and
stateful_ops/ inside it, as a wheel installs them. ``make lint`` type-checks that tree
(mypy cannot read pyproject.toml's package-dir); nothing of it is committed."""

from __future__ import annotations

import sys
from pathlib import Path

from eospack.core.checkout_layout import write_installed_layout

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/installed_layout.py DESTINATION")
    print(write_installed_layout(Path(__file__).resolve().parent.parent, Path(sys.argv[1])))
