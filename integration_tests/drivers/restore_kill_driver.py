"""A restored query's first start killed (SIGKILL): in the restore's split or in its first
batch.

Runs in a process of its own: it starts running_count (key ``k``, ``--key-groups``) over
the JSON files of ``--input`` on ``--checkpoint``, a checkpoint ``eospack savepoint
restore`` prepared, with the savepoint's initial state. ``--kill-at split``: once the
executors have written the split by key group, before it is renamed into place complete.
``--kill-at batch``: in the sink of the first batch (state loaded, nothing committed).
``--state-layout segment-log``: the operator on the segment log (RocksDB state store).
It prints ``KILLING`` first; a start that is not killed prints ``NOT KILLED``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from eospack.stateful_ops import configure_state_store, running_count
from eospack.stateful_ops import initial_state as initial_state_module
from eospack.tools.savepoint import RestoredCheckpoint
from eospack.tools.spark import local_session
from integration_tests.stateful_parts import run, source


def kill() -> None:
    print("KILLING", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--key-groups", type=int, required=True)
    parser.add_argument("--kill-at", choices=("split", "batch"), required=True)
    parser.add_argument(
        "--state-layout", choices=("key-groups", "segment-log"), default="key-groups"
    )
    arguments = parser.parse_args()
    spark = local_session("eospack-restore-kill")
    if arguments.state_layout == "segment-log":
        configure_state_store(spark, "rocksdb")
    if arguments.kill_at == "split":
        rename = os.rename

        def killed_rename(source_path: Any, target: Any) -> None:
            if Path(str(target)).name.startswith("key-groups-"):
                kill()
            rename(source_path, target)

        initial_state_module.os.rename = killed_rename  # type: ignore[attr-defined]
    restored = RestoredCheckpoint(arguments.checkpoint, spark)
    counts = running_count(
        source(spark, arguments.input),
        "k",
        key_groups=arguments.key_groups,
        initial_state=restored.initial_state(),
        state_layout=arguments.state_layout,
    )

    def sink(batch: Any, batch_id: int) -> None:
        batch.collect()
        kill()

    run(counts, arguments.checkpoint, "update", sink)  # type: ignore[arg-type]
    print("NOT KILLED", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
