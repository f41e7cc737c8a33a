"""Spark's Python daemon with a cheaper cleanup between the tasks of a reused worker.

Why: with worker reuse (Spark's default) pyspark's daemon runs a full ``gc.collect()`` in
a worker after every task. A worker that has imported pyspark, pandas, pyarrow and a
client library holds over 100,000 objects, and each collection walks all of them: 30-80 ms
of CPU on a 2-core machine after every task, eight tasks a micro-batch in the demo
pipeline, on the critical path when the next task waits for that worker.

This is pyspark's own daemon (``pyspark.daemon.manager``) with one change: after a
worker's first task it collects once and ``gc.freeze()``s what survives (modules,
classes, the worker's caches), so the collection after each later task walks only the
objects created since. What a task leaves behind is still collected; what survived the
first task and dies later, in a reference cycle, is kept until the worker exits (a
worker's idle connections, for example). Nothing is imported before the fork: pandas and
pyarrow start threads on import, which is why pyspark imports worker modules after it.

Used through ``spark.python.daemon.module=eospack.python_daemon`` (set by
:func:`eospack.tools.spark.local_session`); Spark starts it as ``python -m
eospack.python_daemon <worker module>``, on the driver for planners and on executors.
"""

from __future__ import annotations

import gc
import os
import socket

from pyspark import daemon

_pyspark_worker = daemon.worker
_frozen = False


def worker(sock: socket.socket, authenticated: bool) -> int:
    """Run one task as pyspark's daemon does; freeze the survivors of a worker's first.

    Only a worker that runs another task freezes: one whose task failed (nonzero code) or
    that is not reused (``spark.python.worker.reuse=false``) exits right after, where a full
    collection would be 30-80 ms of CPU spent for nothing.
    """
    global _frozen
    code = _pyspark_worker(sock, authenticated)
    if not _frozen and code == 0 and os.environ.get("SPARK_REUSE_WORKER"):
        gc.collect()
        gc.freeze()
        _frozen = True
    return code


def main() -> None:
    daemon.worker = worker
    daemon.manager()


if __name__ == "__main__":
    main()
