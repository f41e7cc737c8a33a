"""Integration-test fixtures: the call-fault directory every Spark process of the session sees.

The directory is put into the environment at import, before the session's JVM starts, so
that Spark's Python workers (executor tasks and the driver-side commit worker) inherit it
(see ``eospack.core.faults``). The test process itself imported ``faults`` before, so
its own calls are never faulted. It is empty unless a test arms faults through
``call_faults``, which also makes sure that no armed fault outlives its test.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from eospack.core import faults

# Under pytest-xdist each worker is its own session with its own services and Spark, so
# each gets its own directory (a worker must never fire a fault another one armed).
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if _WORKER or faults.FAULT_DIRECTORY_VARIABLE not in os.environ:
    os.environ[faults.FAULT_DIRECTORY_VARIABLE] = tempfile.mkdtemp(
        prefix=f"eospack-test-faults-{_WORKER or 'main'}-"
    )
SESSION_FAULT_DIRECTORY = Path(os.environ[faults.FAULT_DIRECTORY_VARIABLE])


@pytest.fixture
def call_faults() -> Iterator[Path]:
    """The session's fault directory, emptied before and after the test."""
    _empty(SESSION_FAULT_DIRECTORY)
    yield SESSION_FAULT_DIRECTORY
    _empty(SESSION_FAULT_DIRECTORY)


def _empty(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True, exist_ok=True)
