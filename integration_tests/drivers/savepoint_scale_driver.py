"""A savepoint of a state larger than the driver may receive, created and restored.

Runs in a process of its own with ``spark.driver.maxResultSize`` below the state's size:
any step that brought the state to the driver (``collect``, ``toArrow``) fails there. A
running_count over ``--keys`` keys is savepointed, restored into a new checkpoint with
another ``key_groups``, and given every tenth key once more; the restored state is checked
with Spark aggregations (never collected). Prints one JSON line with what it found.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pyspark.sql import functions as F

from eospack.lab.testing import count_keys_to_noop
from eospack.stateful_ops.state_reader import state_frame
from eospack.tools.savepoint import (
    Manifest,
    RestoredCheckpoint,
    create_savepoint,
    restore_savepoint,
)
from eospack.tools.spark import local_session

KEY_PADDING = 48


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--work", required=True, help="a new directory for inputs and checkpoints")
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--max-result-size", default="1m")
    arguments = parser.parse_args()
    work = Path(arguments.work)
    spark = local_session(
        "eospack-savepoint-scale", conf={"spark.driver.maxResultSize": arguments.max_result_size}
    )
    keys = spark.range(arguments.keys).select(
        F.concat(F.lit("user-"), F.lpad(F.col("id").cast("string"), KEY_PADDING, "0")).alias("key")
    )
    keys.write.parquet(str(work / "input-1"))
    spark.range(arguments.keys).where("id % 10 = 0").select(
        F.concat(F.lit("user-"), F.lpad(F.col("id").cast("string"), KEY_PADDING, "0")).alias("key")
    ).write.parquet(str(work / "input-2"))

    def run(input_directory: str, checkpoint: Path, key_groups: int) -> None:
        initial_state = RestoredCheckpoint(checkpoint).initial_state()
        count_keys_to_noop(
            spark, str(work / input_directory), str(checkpoint), key_groups, initial_state, 600
        )

    run("input-1", work / "checkpoint-1", key_groups=8)
    create_savepoint(spark, work / "checkpoint-1", work / "savepoint")
    manifest = Manifest.read(work / "savepoint")
    restore_savepoint(work / "savepoint", work / "checkpoint-2", spark=spark)
    run("input-2", work / "checkpoint-2", key_groups=16)
    state = state_frame(spark, str(work / "checkpoint-2"))
    assert state is not None
    totals = state.frame.agg(
        F.count("*").alias("keys"),
        F.sum("count").alias("total"),
        F.sum(F.when(F.col("count") == 2, 1).otherwise(0)).alias("twice"),
        F.countDistinct("key").alias("distinct_keys"),
    ).first()
    print(
        json.dumps(
            {
                "savepoint_rows": sum(operator.rows for operator in manifest.operators),
                "keys": totals["keys"],
                "distinct_keys": totals["distinct_keys"],
                "total": totals["total"],
                "twice": totals["twice"],
                "key_groups": state.key_groups,
            }
        )
    )
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
