"""Producers kept across the tasks of one Python worker (Spark reuses its Python workers:
``spark.python.worker.reuse``, on by default), so a task does not pay a new producer's
bootstrap and first metadata lookup (profiled: about 117 ms of kafka-python's first
``partitions_for`` after its retry backoff, against 0 ms on a kept producer; see
docs/performance.md).

What is kept, and what is guaranteed
------------------------------------
At-least-once (``kept_producer``): a plain, non-transactional producer per worker process
and client configuration. A task borrows it, sends, flushes and gives it back; nothing of a
task survives in it after its flush (``send_rows`` checks every send), so the next task
starts clean. A task that fails for any reason closes and drops the producer instead (its
accumulator may hold records of the failed task, which must not ride along with the next
task's flush). Two tasks of one worker never share it at once: a borrowed producer is out
of the pool until given back (a Python worker runs one task at a time anyway). At most
``MAX_KEPT`` configurations are kept; the oldest is closed first.

Exactly-once keeps nothing yet: each task still makes its producer with a transactional
id of its own (sink, batch, partition, attempt) and closes it in ``prepare``. Why not
a kept transactional producer (the pooling of Flink's KafkaSink, FLINK-34554), as designed
for issue 37 and left for a later change:

1. A kept producer's transactional id can only start a new transaction after the driver
   ended the previous one (EndTxn by producer id and epoch, not by this producer), and
   kafka-python's transaction manager still believes its own transaction open: reusing it
   means resetting private state (``_transaction_manager``) after every ``prepare``.
2. The id must be re-initialised (InitProducerId) before each reuse, which fences
   whatever it left open: that is safe only once the previous transaction is committed or
   the driver will never commit it. The worker cannot know that alone; a pooled id would
   have to be released by the driver's commit (e.g. the id's epoch after commit is read
   back, or the pool slot carries the batch id whose decision is done).
3. Task retries and speculative attempts of one partition run concurrently: pooled ids
   must be keyed by the Spark task slot, never by partition alone, so two live attempts
   never share an id.
4. Recovery (``resource.prepared_pieces``, ``coordinator.stale_pieces``, the replayed
   tasks' fencing) reads batch and attempt off the transactional id's name. With pooled
   ids a prepared piece's identity must come from the commit message or the decision, and
   every open transaction under the sink's prefix that no decision names must be fenced.

Until that is built and proven (ids bounded after many batches, no id shared by live
attempts, a crash between prepare and commit still exactly once), a task's transactional
producer stays new per task: the measured cost of that is in docs/performance.md.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kafka import KafkaProducer

MAX_KEPT = 4
"""How many producers (one per distinct client configuration) a worker process keeps."""

FAILED_CLOSE_SECONDS = 1.0
"""How long the producer of a failed task may still deliver before it is closed (those
records are at-least-once's to send twice: Spark retries the task)."""

_KEPT: OrderedDict[tuple[tuple[str, str], ...], KafkaProducer] = OrderedDict()
_LOCK = threading.Lock()


def configuration_key(config: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """Producers are shared only between tasks of the same settings (same brokers, same
    login, same producer tuning): a key of every setting, values by ``repr``."""
    return tuple(sorted((name, repr(value)) for name, value in config.items()))


@contextlib.contextmanager
def kept_producer(
    config: Mapping[str, Any], make: Callable[[], KafkaProducer] | None = None
) -> Iterator[KafkaProducer]:
    """Lend the worker's kept non-transactional producer of ``config`` (made by ``make``,
    else ``KafkaProducer(**config)``, on first use) for one at-least-once task. On success
    it goes back to the pool for the next task; on any failure it is closed and forgotten
    (what it still buffers belongs to the failed task). Refuses transactional
    configurations: those are never kept (module docstring)."""
    if config.get("transactional_id"):
        raise ValueError("kept_producer keeps only non-transactional producers")
    key = configuration_key(config)
    with _LOCK:
        producer = _KEPT.pop(key, None)
    if producer is None:
        producer = make() if make is not None else KafkaProducer(**config)
    try:
        yield producer
    except BaseException:
        with contextlib.suppress(Exception):  # kafka-python's close(timeout=0) can raise
            producer.close(timeout=FAILED_CLOSE_SECONDS)  # before it closed anything
        raise
    evicted: list[KafkaProducer] = []
    with _LOCK:
        if key in _KEPT:  # another thread of this process gave one back meanwhile
            evicted.append(producer)
        else:
            _KEPT[key] = producer
        while len(_KEPT) > MAX_KEPT:
            evicted.append(_KEPT.popitem(last=False)[1])
    for extra in evicted:
        with contextlib.suppress(Exception):
            extra.close()


def kept_count() -> int:
    """How many producers this process keeps (for tests)."""
    with _LOCK:
        return len(_KEPT)


def close_kept() -> None:
    """Close every kept producer (at interpreter exit; every task already flushed its
    records, so nothing is left to send)."""
    with _LOCK:
        producers = list(_KEPT.values())
        _KEPT.clear()
    for producer in producers:
        with contextlib.suppress(Exception):
            producer.close(timeout=5)


atexit.register(close_kept)
