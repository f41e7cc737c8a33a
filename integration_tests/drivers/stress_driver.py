"""Stress-test driver: up to three long-running queries over one Kafka topic, supervised.

- ``counts``: replayable-kafka -> running_count -> 2pc-jdbc upsert with versionColumn (a
  lost or doubled event shows in its key's count);
- ``files``: replayable-kafka -> 2pc-s3 Parquet (one row per event);
- ``events`` (with ``--kafka-output-topic``): replayable-kafka -> 2pc-kafka, one record per
  event (key, value = the event's id), under the explicit ``--kafka-sink-id`` so that the
  test finds its transactions and ledger slots.

Each query has its own DataFrame and checkpoint under ``--checkpoint-root``. The driver
polls ``--control`` (JSON: generation, max_offsets_per_trigger, trigger_ms, protocol, stop,
restore): a new generation stops every query and starts it again with the new settings (a
restart with other options); ``stop`` ends the driver cleanly; a higher ``restore.number``
moves ``counts`` to a new checkpoint through a savepoint (``restore_counts``). A query that
fails is started again from its checkpoint (a plain restart strategy), with its error
logged. The S3 secret comes from ``EOSPACK_STRESS_S3_SECRET``, never from the command line.

``counts`` runs on the checkpoint named in ``<checkpoint root>/counts-checkpoint.json``
(with the key groups and shuffle partitions it was restored with), written before the
restored query first starts, so a driver killed at any moment starts the checkpoint whose
output the table already holds.

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
COUNTS_STATE = "counts-checkpoint.json"
FIRST_COUNTS = {"checkpoint": "counts", "key_groups": 8, "shuffle_partitions": 2, "restores": 0}
FINISH_ATTEMPTS = 10
FINISH_SECONDS = 180
FINISH_MAX_OFFSETS = 5000


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
    parser.add_argument("--kafka-output-topic", help="also run events -> 2pc-kafka into it")
    parser.add_argument("--kafka-sink-id")
    parser.add_argument("--kafka-ledger-topic")
    parser.add_argument("--savepoint-root", help="where restores write their savepoints")
    parser.add_argument("--master", default="local[2,2]")
    return parser.parse_args()


def clear_interrupted_first_offset_write(checkpoint: Path) -> bool:
    """Delete what a crash during the very first offset-log write leaves: ``offsets/.0.<uuid>.tmp``.

    Spark 4.3 refuses to start a query whose checkpoint has no committed batch but a non-empty
    ``offsets`` directory (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY), and counts that hidden
    temporary file, so one SIGKILL at that instant bricks the checkpoint. No batch was logged
    yet, so removing the temporary files loses nothing (docs/operations.md's troubleshooting entry).
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


def write_atomically(path: Path, text: str) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def first_line(error: BaseException | None) -> str:
    return str(error).strip().splitlines()[0][:300] if error else "stopped"


class Pipelines:
    """Builds and (re)starts the queries for one generation of settings."""

    def __init__(self, spark: Any, arguments: argparse.Namespace) -> None:
        self.spark = spark
        self.arguments = arguments
        self.root = Path(arguments.checkpoint_root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.counts_state_path = self.root / COUNTS_STATE
        if self.counts_state_path.exists():
            self.counts = dict(json.loads(self.counts_state_path.read_text()))
        else:
            self.counts = dict(FIRST_COUNTS)

    @property
    def names(self) -> tuple[str, ...]:
        if self.arguments.kafka_output_topic:
            return ("counts", "files", "events")
        return ("counts", "files")

    def checkpoint(self, name: str) -> Path:
        return self.root / (self.counts["checkpoint"] if name == "counts" else name)

    def source(self, settings: dict[str, Any], starting_offsets: str = "earliest") -> Any:
        arguments = self.arguments
        return (
            self.spark.readStream.format("replayable-kafka")
            .option("kafka.bootstrap.servers", arguments.bootstrap_servers)
            .option("subscribe", arguments.topic)
            .option("startingOffsets", starting_offsets)
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

    def start(self, name: str, settings: dict[str, Any], available_now: bool = False) -> Any:
        writer = self.writer(name, settings)
        writer = writer.queryName(name).option("checkpointLocation", str(self.checkpoint(name)))
        if available_now:
            return writer.trigger(availableNow=True).start()
        return writer.trigger(processingTime=f"{int(settings['trigger_ms'])} milliseconds").start()

    def writer(self, name: str, settings: dict[str, Any]) -> Any:
        from eospack.stateful_ops import running_count
        from eospack.tools.savepoint import RestoredCheckpoint

        arguments = self.arguments
        if name == "counts":
            restored = RestoredCheckpoint(self.checkpoint("counts"))
            frame = self.source(settings, restored.starting_offsets("earliest"))
            counts = running_count(
                frame.select("key"),
                "key",
                key_groups=int(self.counts["key_groups"]),
                output_mode="append",
                initial_state=restored.initial_state(),
            )
            # Spark takes a checkpoint's own shuffle partitions; this counts for a new one.
            self.spark.conf.set(
                "spark.sql.shuffle.partitions", str(self.counts["shuffle_partitions"])
            )
            options = self.jdbc_options("counts", settings)
            options.update(writeMode="upsert", upsertKeys="key", versionColumn="version")
            return counts.writeStream.format("2pc-jdbc").options(**options)
        frame = self.source(settings)
        if name == "events":
            return (
                frame.selectExpr("key", "id AS value")
                .writeStream.format("2pc-kafka")
                .option("kafka.bootstrap.servers", arguments.bootstrap_servers)
                .option("topic", arguments.kafka_output_topic)
                .option("sinkId", arguments.kafka_sink_id)
                .option("ledgerTopic", arguments.kafka_ledger_topic)
            )
        return (
            frame.writeStream.format("2pc-s3")
            .option("path", arguments.s3_path)
            .option("endpointUrl", arguments.s3_endpoint)
            .option("accessKeyId", arguments.s3_access_key)
            .option("secretAccessKey", os.environ["EOSPACK_STRESS_S3_SECRET"])
        )

    def restart_failed(self, name: str, query: Any, settings: dict[str, Any]) -> Any:
        """Log why ``query`` ended and start it again from its checkpoint."""
        line = first_line(query.exception())
        print(f"stress driver: query {name} failed, restarting: {line}", flush=True)
        if "STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY" in line:
            cleared = clear_interrupted_first_offset_write(self.checkpoint(name))
            print(f"stress driver: cleared an interrupted first offset write: {cleared}")
        return self.start(name, settings)

    def restore_counts(self, request: dict[str, Any], settings: dict[str, Any]) -> Any:
        """Stop ``counts`` after a committed batch, savepoint it with ``eospack savepoint
        create``, restore that into a new checkpoint (``request``: number, mode, key_groups,
        shuffle_partitions) and start ``counts`` there; returns the new query.

        The new checkpoint is named in the counts state file before its query starts: from
        then on, a restart of the driver continues the restored query, never the old one
        (whose output the table holds up to the savepoint's batch only)."""
        from eospack.cli import main as eospack

        number = int(request["number"])
        old = self.checkpoint("counts")
        self.finish_last_batch(settings)
        savepoints = Path(self.arguments.savepoint_root or self.root.parent / "savepoints")
        savepoints.mkdir(parents=True, exist_ok=True)
        savepoint = savepoints / f"savepoint-{number}"
        if eospack(["savepoint", "create", str(old), str(savepoint)]) != 0:
            raise RuntimeError(f"stress driver: eospack savepoint create {old} failed")
        name = f"counts-restored-{number}"
        mode = str(request["mode"])
        restore = ["savepoint", "restore", str(savepoint), str(self.root / name), "--mode", mode]
        if eospack(restore) != 0:
            raise RuntimeError(f"stress driver: eospack savepoint restore {savepoint} failed")
        self.counts = {
            "checkpoint": name,
            "key_groups": int(request["key_groups"]),
            "shuffle_partitions": int(request["shuffle_partitions"]),
            "restores": number,
        }
        write_atomically(self.counts_state_path, json.dumps(self.counts))
        query = self.start("counts", settings)
        print(
            f"stress driver: restore {number} started counts on {name} ({mode},"
            f" key_groups={request['key_groups']},"
            f" shuffle_partitions={request['shuffle_partitions']})",
            flush=True,
        )
        return query

    def finish_last_batch(self, settings: dict[str, Any]) -> None:
        """Run ``counts`` with Trigger.AvailableNow until its checkpoint's last batch is
        committed (a savepoint refuses a batch that was started but not committed): a run
        that fails (an armed fault, a killed worker) is started again. Large batches: the
        run reads everything the topic holds when it starts."""
        from eospack.tools.checkpoint import inspect_checkpoint

        checkpoint = self.checkpoint("counts")
        catch_up = {**settings, "max_offsets_per_trigger": FINISH_MAX_OFFSETS}
        for _ in range(FINISH_ATTEMPTS):
            query = self.start("counts", catch_up, available_now=True)
            try:
                finished = query.awaitTermination(FINISH_SECONDS)
            except Exception as error:  # a failed run: its StreamingQueryException
                print(
                    f"stress driver: query counts failed, restarting: {first_line(error)}",
                    flush=True,
                )
                continue
            if not finished:
                query.stop()
                continue
            batches = inspect_checkpoint(checkpoint).batches
            if batches and batches[-1].committed:
                return
        raise RuntimeError(f"stress driver: {checkpoint} has no committed last batch")


def main() -> int:
    arguments = parse_arguments()
    from eospack.tools.spark import local_session

    spark = local_session(app_name="eospack-stress", master=arguments.master)
    pipelines = Pipelines(spark, arguments)
    control = Path(arguments.control)
    settings = read_control(control)
    queries = {name: pipelines.start(name, settings) for name in pipelines.names}
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
            queries = {name: pipelines.start(name, settings) for name in pipelines.names}
            print(f"stress driver: generation {settings['generation']} started", flush=True)
        request = wanted.get("restore") or {}
        if int(request.get("number", 0)) > int(pipelines.counts["restores"]):
            queries["counts"].stop()
            queries["counts"] = pipelines.restore_counts(request, settings)
        for name, query in list(queries.items()):
            if not query.isActive:
                queries[name] = pipelines.restart_failed(name, query, settings)
        time.sleep(POLL_SECONDS)  # polling the control file, not synchronisation


if __name__ == "__main__":
    sys.exit(main())
