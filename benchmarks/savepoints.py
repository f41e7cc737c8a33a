"""16. Savepoints at scale: create, restore and rescale against a full scan of the state.

Each size runs in a process of its own (``python -m benchmarks.savepoints --keys N``), so
its memory figures start from an idle session: a ``running_count`` query builds the state
of N keys (one row each) in RocksDB (what a state of millions of keys runs on: Spark's
default store holds it on the JVM heap), then, timed one after the other:

- the baseline: a full scan of that state by Spark's state data source (``statestore``
  rows into the ``noop`` sink), what any reader of the state pays;
- ``create_savepoint`` (executors decode the key groups and write Parquet);
- a restore: ``restore_savepoint`` (a copy) and the restored query's first batch (one new
  row), which splits the savepoint by key group and loads every key group;
- a rescale: the same restore with twice the key groups and shuffle partitions.

A sampler thread records the peak resident memory of the Python driver and of Spark's JVM
(in ``local[2]`` the JVM also runs the executors, so its figure is an upper bound of the
driver's), each above the idle session's. Goals (issue 41): create and restore within 2x the
full scan; the driver's peak under 1 GiB above idle.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.harness import Comparison, Figure, Report, say

KEY_GROUPS = 32
MiB = 1024 * 1024


class PeakMemory:
    """The peak RSS of this process and of its Java children, sampled every 50 ms."""

    def __init__(self) -> None:
        import psutil

        self.process = psutil.Process()
        self.python_peak = 0
        self.java_peak = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)

    def current(self) -> tuple[int, int]:
        import psutil

        java = 0
        for child in self.process.children(recursive=True):
            try:
                if "java" in child.name():
                    java += child.memory_info().rss
            except psutil.Error:  # a Python worker that ended meanwhile
                continue
        return self.process.memory_info().rss, java

    def sample(self) -> None:
        while not self.stopped.wait(0.05):
            python, java = self.current()
            self.python_peak = max(self.python_peak, python)
            self.java_peak = max(self.java_peak, java)

    def __enter__(self) -> PeakMemory:
        self.python_peak, self.java_peak = self.current()
        self.thread = threading.Thread(target=self.sample, daemon=True)
        self.stopped.clear()
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join()


def measure_size(keys: int, work: Path) -> dict[str, float]:
    """One size's figures (seconds, bytes), in this process."""
    from pyspark.sql import functions as F

    from eospack.lab.testing import count_keys_to_noop, session_settings
    from eospack.stateful_ops.state_store import state_store_conf
    from eospack.tools.savepoint import RestoredCheckpoint, create_savepoint, restore_savepoint
    from eospack.tools.spark import local_session

    spark = local_session(
        "eospack-savepoint-benchmark", conf=state_store_conf("rocksdb", changelog=True)
    )
    idle = PeakMemory().current()
    key = F.concat(F.lit("user-"), F.col("id").cast("string")).alias("key")
    spark.range(keys).select(key).write.parquet(str(work / "input-1"))
    spark.range(1).select(key).write.parquet(str(work / "input-2"))

    def run(input_directory: str, checkpoint: Path, key_groups: int) -> None:
        initial_state = RestoredCheckpoint(checkpoint).initial_state()
        count_keys_to_noop(
            spark, str(work / input_directory), str(checkpoint), key_groups, initial_state
        )

    say(f"savepoints: building the state of {keys:,} keys")
    run("input-1", work / "checkpoint", KEY_GROUPS)
    figures: dict[str, float] = {}
    memory = PeakMemory()

    def timed(name: str, action: object) -> None:
        say(f"savepoints: {keys:,} keys: {name}")
        with memory:
            started = time.perf_counter()
            action()  # type: ignore[operator]
            figures[f"{name}_seconds"] = time.perf_counter() - started
        figures[f"{name}_python_peak_mib"] = (memory.python_peak - idle[0]) / MiB
        figures[f"{name}_java_peak_mib"] = (memory.java_peak - idle[1]) / MiB

    timed(
        "scan",
        lambda: (
            spark.read.format("statestore")
            .load(str(work / "checkpoint"))
            .write.format("noop")
            .mode("overwrite")
            .save()
        ),
    )
    timed("create", lambda: create_savepoint(spark, work / "checkpoint", work / "savepoint"))
    figures["savepoint_bytes"] = sum(
        path.stat().st_size for path in (work / "savepoint").rglob("*") if path.is_file()
    )

    def restore(checkpoint: Path, key_groups: int, partitions: int) -> None:
        restore_savepoint(work / "savepoint", checkpoint, spark=spark)
        with session_settings(spark, {"spark.sql.shuffle.partitions": str(partitions)}):
            run("input-2", checkpoint, key_groups)

    timed("restore", lambda: restore(work / "restored", KEY_GROUPS, 2))
    timed("rescale", lambda: restore(work / "rescaled", KEY_GROUPS * 2, 4))
    spark.stop()
    return figures


def run(report: Report, sizes: list[int]) -> None:
    """Each size in a child process; its figures become the report's rows."""
    for keys in sizes:
        work = Path(tempfile.mkdtemp(prefix="eospack-savepoint-bench-"))
        figures_file = work / "figures.json"
        try:
            result = subprocess.run(
                [sys.executable, "-m", "benchmarks.savepoints", "--keys", str(keys)],
                cwd=Path(__file__).resolve().parent.parent,
                env={
                    **os.environ,
                    "EOSPACK_BENCH_WORK": str(work),
                    "EOSPACK_BENCH_FIGURES": str(figures_file),
                },
                stdout=sys.stdout,  # the child's progress lines
                stderr=subprocess.PIPE,
                text=True,
                check=False,
            )
            figures = json.loads(figures_file.read_text()) if result.returncode == 0 else None
        finally:
            shutil.rmtree(work, ignore_errors=True)
        if figures is None:
            error = result.stderr.strip().splitlines()[-1:] or ["no error output"]
            report.notes.append(f"savepoints {keys:,} keys: FAILED: {error[0][:300]}")
            say(f"savepoints {keys:,} keys: FAILED\n{result.stderr[-2000:]}")
            continue
        add_rows(report, keys, figures)


def add_rows(report: Report, keys: int, figures: dict[str, float]) -> None:
    size = f"{keys:,} keys"
    scan = Figure("state data source: full scan", (figures["scan_seconds"],), 1, "s")
    memory = []
    for name, label in (
        ("create", "savepoint create"),
        ("restore", "savepoint restore (copy, split, first batch)"),
        ("rescale", "restore with 2x key groups and shuffle partitions"),
    ):
        report.add(
            Comparison(
                "16. savepoint vs state scan",
                size,
                Figure(label, (figures[f"{name}_seconds"],), 1, "s"),
                scan,
                target=2.0,
                higher_is_better=False,
            )
        )
        memory.append(
            f"{name} Python {figures[f'{name}_python_peak_mib']:.0f} MiB,"
            f" JVM {figures[f'{name}_java_peak_mib']:.0f} MiB"
        )
    report.notes.append(
        f"savepoints {size} (one measurement each): {figures['savepoint_bytes'] / MiB:.1f} MiB"
        f" of savepoint; full scan {figures['scan_seconds']:.1f} s (JVM"
        f" {figures['scan_java_peak_mib']:.0f} MiB); peak memory above the idle session:"
        f" {'; '.join(memory)} (local[2]: the JVM runs the executors and RocksDB too, the"
        " Python process is the driver's own)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, required=True)
    arguments = parser.parse_args()
    work = Path(os.environ.get("EOSPACK_BENCH_WORK") or tempfile.mkdtemp())
    figures = json.dumps(measure_size(arguments.keys, work))
    target = os.environ.get("EOSPACK_BENCH_FIGURES")
    if target:
        Path(target).write_text(figures)
    else:
        print(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
