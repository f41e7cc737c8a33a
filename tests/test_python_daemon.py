"""eospack.python_daemon in a real session: reused workers freeze what their first task left,
and what a later task leaves in reference cycles is still collected."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from eospack.lab.testing import wait_until


@pytest.mark.timeout(120)
def test_a_reused_worker_freezes_after_its_first_task_and_still_collects(spark: Any) -> None:
    assert spark.sparkContext.getConf().get("spark.python.daemon.module") == (
        "eospack.python_daemon"
    )

    # Defined here so that cloudpickle ships it by value (workers cannot import tests).
    def worker_report(_: Iterator[int]) -> Iterator[tuple[int, int, int]]:
        """(pid, frozen objects, cyclic objects alive from earlier tasks); leave a cycle."""
        import gc
        import os
        import sys
        import weakref

        class Cyclic:
            def __init__(self) -> None:
                self.me = self

        alive = getattr(sys, "_eospack_test_left_behind", None)  # kept across tasks
        if alive is None:
            alive = weakref.WeakSet()
            sys._eospack_test_left_behind = alive  # type: ignore[attr-defined]
        yield os.getpid(), gc.get_freeze_count(), len(alive)
        left = Cyclic()
        alive.add(left)
        del left

    seen: dict[int, list[tuple[int, int]]] = {}

    def some_worker_ran_twice() -> bool:
        for pid, frozen, alive in (
            spark.sparkContext.parallelize(range(2), 2).mapPartitions(worker_report).collect()
        ):
            seen.setdefault(pid, []).append((frozen, alive))
        return any(len(reports) >= 2 for reports in seen.values())

    wait_until(some_worker_ran_twice, 90, "a Python worker to run a second task", poll=0.0)
    for reports in seen.values():
        for frozen, alive in reports[1:]:
            assert frozen > 0, f"a reused worker froze nothing: {reports}"
            assert alive == 0, f"a cycle an earlier task left was not collected: {reports}"
