"""What the metrics tests share: a scrape of the endpoint as a dictionary, one sample of it,
JSON files of timed events (one micro-batch each) and their watermarked stream, and a
Kafka stream written into SQLite by 2pc-jdbc."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    """Every sample of the endpoint: (name, sorted labels) to value."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: Any) -> float | None:
    return samples.get((name, tuple(sorted((k, str(v)) for k, v in labels.items()))))


def write_events(directory: Path, index: int, events: list[tuple[str, int]]) -> None:
    """One JSON file of (key, event second) rows: one micro-batch (maxFilesPerTrigger=1)."""
    path = directory / f"events-{index}.json"
    path.write_text("\n".join(json.dumps({"k": key, "t": second}) for key, second in events))
    os.utime(path, (1_000_000 + index, 1_000_000 + index))


def timed_events(spark: Any, events: Path) -> Any:
    """The files of ``write_events`` as a stream of ``k``, ``t`` and ``ts`` (the event
    time, watermarked with no delay), one file per micro-batch."""
    from pyspark.sql import functions as F

    return (
        spark.readStream.schema("k string, t long")
        .option("maxFilesPerTrigger", 1)
        .json(str(events))
        .withColumn("ts", F.timestamp_seconds("t"))
        .withWatermark("ts", "0 seconds")
    )


def into_sqlite(stream: Any, database: Path, table: str, checkpoint: Path) -> Any:
    """A replayable-kafka stream's offsets, values and partitions written by 2pc-jdbc into
    ``table`` of the SQLite ``database`` (created if missing); the trigger is the caller's."""
    return (
        stream.selectExpr("offset AS id", "CAST(value AS STRING) AS name", "partition AS version")
        .writeStream.format("2pc-jdbc")
        .option("url", f"jdbc:sqlite:{database}")
        .option("dbtable", table)
        .option("createTableIfNotExists", "true")
        .option("checkpointLocation", str(checkpoint))
    )
