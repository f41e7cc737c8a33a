"""Savepoints never pass through the driver: create and restore with Spark's executors.

The driver process runs with ``spark.driver.maxResultSize`` of 1 MiB and a state of about
7 MiB, so a create or restore that collected the state (as both did before) fails there.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

DRIVER = Path(__file__).resolve().parents[1] / "drivers" / "savepoint_scale_driver.py"
KEYS = 100_000


@pytest.mark.timeout(600)
def test_a_state_larger_than_the_driver_may_receive_is_savepointed_and_restored(
    tmp_path: Path,
) -> None:
    result = subprocess.run(
        [sys.executable, str(DRIVER), "--work", str(tmp_path), "--keys", str(KEYS)],
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found == {
        "savepoint_rows": KEYS,
        "keys": KEYS,
        "distinct_keys": KEYS,
        "total": KEYS + KEYS // 10,
        "twice": KEYS // 10,
        "key_groups": 16,
    }
