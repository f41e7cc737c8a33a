"""Stress-test driver: two long-running queries over one Kafka topic, supervised.

- ``counts``: replayable-kafka -> running_count -> 2pc-jdbc upsert with versionColumn (a
  lost or doubled event shows in its key's count);
- ``files``: replayable-kafka -> 2pc-s3 Parquet (one row per event).

Each query has its own DataFrame and checkpoint under ``--checkpoint-root``. The driver
polls ``--control`` (JSON: generation, max_offsets_per_trigger, trigger_ms, protocol, stop):
a new generation stops every query and starts it again with the new settings (a restart
with other options); ``stop`` ends the driver cleanly. A query that fails is started again
from its checkpoint (a plain restart strategy), with its error logged. The S3 secret comes
from ``EOSPACK_STRESS_S3_SECRET``, never from the command line.

    python stress_driver.py --bootstrap-servers ... --topic ... --jdbc-url ... --control ...
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

POLL_SECONDS = 0.2


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    for name in (
        "--bootstrap-servers",
        "--topic",
        "--jdbc-url",
        "--jdbc-user",
        "--table-prefix",
        "--s3-endpoint",
        "--s3-path",
        "--s3-access-key",
        "--checkpoint-root",
        "--control",
    ):
        parser.add_argument(name, required=True)
    parser.add_argument("--master", default="local[2,2]")
    return parser.parse_args()


def clear_interrupted_first_offset_write(checkpoint: Path) -> bool:
    """Delete what a crash during the very first offset-log write leaves: ``offsets/.0.<uuid>.tmp``.

    Spark 4.3 refuses to start a query whose checkpoint has no committed batch but a non-empty
    ``offsets`` directory (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY), and counts that hidden
    temporary file, so one SIGKILL at that instant bricks the checkpoint. No batch was logged
    yet, so removing the temporary files loses nothing (the README's troubleshooting entry).
    """
    offsets = checkpoint / "offsets"
    if not offsets.is_dir() or any(not entry.name.startswith(".") for entry in offsets.iterdir()):
        return False
    for leftover in offsets.iterdir():
        leftover.unlink()
    return True


def read_control(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


class Pipelines:
    """Builds and (re)starts the queries for one generation of settings."""

    def __init__(self, spark: Any, arguments: argparse.Namespace) -> None:
        self.spark = spark
        self.arguments = arguments
        self.root = Path(arguments.checkpoint_root)

    def source(self, settings: dict[str, Any]) -> Any:
        arguments = self.arguments
        return (
            self.spark.readStream.format("replayable-kafka")
            .option("kafka.bootstrap.servers", arguments.bootstrap_servers)
            .option("subscribe", arguments.topic)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", str(settings["max_offsets_per_trigger"]))
            .option("kafkaConsumer.pollTimeoutMs", "20000")
            .load()
            .selectExpr("CAST(key AS STRING) AS key", "CAST(value AS STRING) AS id")
        )

    def jdbc_options(self, table: str, settings: dict[str, Any]) -> dict[str, str]:
        arguments = self.arguments
        return {
            "url": arguments.jdbc_url,
            "user": arguments.jdbc_user,
            "dbtable": f"{arguments.table_prefix}_{table}",
            "createTableIfNotExists": "true",
            "protocol": settings["protocol"],
            "lockTimeout": "20s",
        }

    def start(self, name: str, settings: dict[str, Any]) -> Any:
        from eospack.stateful_ops import running_count

        frame = self.source(settings)
        if name == "counts":
            counts = running_count(frame.select("key"), "key", output_mode="append")
            options = self.jdbc_options("counts", settings)
            options.update(writeMode="upsert", upsertKeys="key", versionColumn="version")
            writer = counts.writeStream.format("2pc-jdbc").options(**options)
        else:
            writer = (
                frame.writeStream.format("2pc-s3")
                .option("path", self.arguments.s3_path)
                .option("endpointUrl", self.arguments.s3_endpoint)
                .option("accessKeyId", self.arguments.s3_access_key)
                .option("secretAccessKey", os.environ["EOSPACK_STRESS_S3_SECRET"])
            )
        return (
            writer.queryName(name)
            .option("checkpointLocation", str(self.root / name))
            .trigger(processingTime=f"{int(settings['trigger_ms'])} milliseconds")
            .start()
        )


def main() -> int:
    arguments = parse_arguments()
    from eospack.spark import local_session

    spark = local_session(app_name="eospack-stress", master=arguments.master)
    pipelines = Pipelines(spark, arguments)
    control = Path(arguments.control)
    settings = read_control(control)
    names = ("counts", "files")
    queries = {name: pipelines.start(name, settings) for name in names}
    print(f"stress driver: generation {settings.get('generation')} started", flush=True)
    while True:
        wanted = read_control(control)
        if wanted.get("stop"):
            for query in queries.values():
                query.stop()
            print("stress driver: stopped", flush=True)
            spark.stop()
            return 0
        if wanted.get("generation") != settings.get("generation"):
            settings = wanted
            for query in queries.values():
                query.stop()
            queries = {name: pipelines.start(name, settings) for name in names}
            print(f"stress driver: generation {settings['generation']} started", flush=True)
        for name, query in list(queries.items()):
            if not query.isActive:
                error = query.exception()
                first_line = str(error).strip().splitlines()[0][:300] if error else "stopped"
                print(f"stress driver: query {name} failed, restarting: {first_line}", flush=True)
                if "STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY" in first_line:
                    cleared = clear_interrupted_first_offset_write(pipelines.root / name)
                    print(f"stress driver: cleared an interrupted first offset write: {cleared}")
                queries[name] = pipelines.start(name, settings)
        time.sleep(POLL_SECONDS)  # polling the control file, not synchronisation


if __name__ == "__main__":
    sys.exit(main())
