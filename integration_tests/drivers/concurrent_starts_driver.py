"""Driver for the concurrent-starts check: a fresh process that starts two streaming queries
over one replayable-kafka DataFrame at the same moment (one thread each, released by a
barrier), waits until both have processed rows, stops them and exits 0.

Two queries starting together in a fresh driver is when Spark's shared environment map of
a Python data source could be corrupted ("Illegal size N of collection, expected N+1",
docs/spark-python-datasource-envvars-race.md); eospack.register primes it beforehand.
"""

from __future__ import annotations

import argparse
import threading
import time

from eospack.tools.spark import local_session

TIMEOUT_SECONDS = 120.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--topic", required=True)
    arguments = parser.parse_args()
    spark = local_session(app_name="eospack-concurrent-starts")
    events = (
        spark.readStream.format("replayable-kafka")
        .option("kafka.bootstrap.servers", arguments.bootstrap_servers)
        .option("subscribe", arguments.topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "50")
        .load()
        .selectExpr("CAST(key AS STRING) AS key")
    )
    barrier = threading.Barrier(2)
    queries = []

    def start(name: str) -> None:
        barrier.wait()
        query = events.writeStream.format("noop").queryName(name)
        queries.append(query.trigger(processingTime="200 milliseconds").start())

    threads = [threading.Thread(target=start, args=(name,)) for name in ("first", "second")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    deadline = time.monotonic() + TIMEOUT_SECONDS
    while not all(
        any(progress["numInputRows"] > 0 for progress in query.recentProgress) for query in queries
    ):
        for query in queries:
            if query.exception() is not None:
                raise RuntimeError(f"{query.name} failed: {query.exception()}")
        if time.monotonic() > deadline:
            raise TimeoutError("the two queries did not both process rows in time")
        spark.streams.awaitAnyTermination(0.2)
    for query in queries:
        query.stop()
    print("both queries processed rows", flush=True)


if __name__ == "__main__":
    main()
