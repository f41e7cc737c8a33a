"""Producers and transactional ids kept across the tasks of one Python worker (Spark reuses
its Python workers: ``spark.python.worker.reuse``, on by default), so a task does not pay a
new producer's bootstrap and first metadata lookup (profiled: about 117 ms of kafka-python's
first ``partitions_for`` after its retry backoff, against 0 ms on a kept producer; see
docs/performance.md), and the broker keeps a bounded number of transactional ids.

At-least-once (``kept_producer``)
---------------------------------
A plain, non-transactional producer per worker process and client configuration. A task
borrows it, sends, flushes and gives it back; nothing of a task survives in it after its
flush (``send_rows`` checks every send), so the next task starts clean. A task that fails
for any reason closes and drops the producer instead (its accumulator may hold records of
the failed task, which must not ride along with the next task's flush). At most
``MAX_KEPT`` configurations are kept; the oldest is closed first.

Exactly-once (``pooled_transactional_id``, ``kept_transactional_producer``)
---------------------------------------------------------------------------
Flink's KafkaSink pools its transactional ids (FLINK-34554); so does this sink. A task's
Kafka transactional id is ``eospack-<sink>-pool_<query><run><worker>_<index>``:

- ``<query>``: 8 hex digits of the streaming query's id (the same across its restarts).
  Recovery rolls back only its own query's leftovers: another query wrongly sharing the
  ``sinkId`` (refused loudly once one meets the other's decisions) never has its prepared
  batch fenced under it; what such a query leaves is its own recovery's, or the broker's
  transaction timeout's.
- ``<run>``: the query run (Spark's run id, new at every start). A replay after a restart
  never re-initialises an id of the run that crashed, whose decided transactions may still
  wait for their commit (InitProducerId on their id would abort them: data lost).
- ``<worker>``: a random token of this Python process. Two processes never share an id, so
  attempts running at once (a task retry, a speculative copy, a zombie of an executor
  Spark gave up on) never fence each other, and a worker that exits never hands its ids
  to another one while its prepared transactions wait for the driver.
- ``<index>``: the how-manieth task of the current batch this process runs (0 for its
  first). Within a batch every task of the process keeps its own index: earlier tasks'
  transactions stay open until the driver commits them. A task of a later batch starts
  from index 0 again: Spark runs batch N+1 only after batch N's commit returned, when every
  transaction batch N's decision named is committed, so re-initialising an index's id
  aborts nothing but leftovers no decision names (a failed task's, a zombie's).

So a run's ids are (worker processes) x (most tasks one process ran in one batch): about the
task slots when partitions <= slots and workers are reused. A new run or a new worker
process brings new ids (``spark.python.worker.reuse=false`` makes one per task, as before
pooling); the broker forgets an id ``transactional.id.expiration.ms`` (7 days by default)
after its last use. The id's name carries no batch, so the piece's identity (sink, batch,
partition, attempt) travels in its commit message and decision as before, and recovery
rolls back every open pooled transaction of the sink that no decision names once the
decisions are finished (``KafkaResource.roll_back_unattributed``).

A task's producer is kept with its id (at most ``MAX_KEPT_TRANSACTIONAL`` per process): the
next task on that id restarts it (``transactions.begin_again``: InitProducerId, one round
trip to the coordinator it knows) instead of bootstrapping a new one. Anything unusual (a
failed task, a producer whose restart fails) closes it; the next task makes a new one.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import secrets
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from kafka import KafkaProducer

from ....commit_protocols import TaskIdentity, sink_prefix, transaction_id

MAX_KEPT = 4
"""How many producers (one per distinct client configuration) a worker process keeps."""

FAILED_CLOSE_SECONDS = 1.0
"""How long the producer of a failed task may still deliver before it is closed (those
records are at-least-once's to send twice: Spark retries the task)."""

MAX_KEPT_TRANSACTIONAL = 4
"""How many transactional producers (one per pooled id) a worker process keeps open."""
POOL_MARKER = "pool_"
"""Starts the part of a pooled id after the sink prefix; never parsed as a piece name."""

ConfigurationKey = tuple[tuple[str, str], ...]
_KEPT: OrderedDict[ConfigurationKey, KafkaProducer] = OrderedDict()
_KEPT_TRANSACTIONAL: OrderedDict[tuple[ConfigurationKey, str], KafkaProducer] = OrderedDict()
_LOCK = threading.Lock()


def configuration_key(config: Mapping[str, Any]) -> ConfigurationKey:
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
    """How many producers this process keeps, both kinds (for tests)."""
    with _LOCK:
        return len(_KEPT) + len(_KEPT_TRANSACTIONAL)


def close_kept() -> None:
    """Close every kept producer (at interpreter exit; every task already flushed its
    records, so nothing is left to send; a kept transactional producer's transaction is
    the driver's to end, and closing never ends it)."""
    with _LOCK:
        producers = [*_KEPT.values(), *_KEPT_TRANSACTIONAL.values()]
        _KEPT.clear()
        _KEPT_TRANSACTIONAL.clear()
    for producer in producers:
        with contextlib.suppress(Exception):
            producer.close(timeout=5)


# Exactly-once: pooled transactional ids and their kept producers -----------------------


@dataclass
class _BatchIndices:
    """The indices of one (sink, run) that this process's tasks of ``batch_id`` hold."""

    batch_id: int
    taken: set[int] = field(default_factory=set)


_WORKER: tuple[int, str] | None = None
_BATCHES: dict[tuple[str, str], _BatchIndices] = {}
"""Per (sink, run), the batch this process last wrote and its taken indices. Never
forgotten (a few bytes per query run): a forgotten entry would hand index 0 to a second
task of a batch whose first task's transaction still waits for the driver."""


def worker_token() -> str:
    """This process's random token, made anew in a forked child (a new pid)."""
    global _WORKER
    with _LOCK:
        if _WORKER is None or _WORKER[0] != os.getpid():
            _WORKER = (os.getpid(), secrets.token_hex(6))
        return _WORKER[1]


def pooled_transactional_id(task: TaskIdentity) -> str:
    """Take the Kafka transactional id of ``task`` from the process's pool (module
    docstring); ``release_transactional_id`` gives it back if the task fails. A task
    without a run id (none is known) or of a batch older than one this process already
    wrote for its run gets an id of its own, never pooled: nothing can then tell which of
    the pool's transactions its batch's decision may still name."""
    run = task.run
    if run is None:
        return transaction_id(task.sink_id, task.batch_id, task.partition_id, task.attempt)
    worker = worker_token()
    key = (task.sink_id, run)
    with _LOCK:
        indices = _BATCHES.get(key)
        if indices is None or indices.batch_id < task.batch_id:
            indices = _BATCHES[key] = _BatchIndices(task.batch_id)
        if indices.batch_id > task.batch_id:
            return transaction_id(task.sink_id, task.batch_id, task.partition_id, task.attempt)
        index = min(set(range(len(indices.taken) + 1)) - indices.taken)
        indices.taken.add(index)
    return f"{pooled_prefix(task.sink_id, task.query_id)}{run}{worker}_{index}"


def pooled_prefix(sink_id: str, query_id: str | None) -> str:
    """What every pooled id of the sink written by the query ``query_id`` starts with."""
    tag = hashlib.sha256((query_id or "").encode()).hexdigest()[:8]
    return f"{sink_prefix(sink_id)}{POOL_MARKER}{tag}"


def release_transactional_id(task: TaskIdentity, transactional_id: str) -> None:
    """A failed task's index is free for the next task of its batch in this process: its
    transaction was aborted or is a leftover no decision can name (the task sent no
    commit message), which the next InitProducerId on the id aborts."""
    index = pooled_index(transactional_id)
    if index is None or task.run is None:
        return
    with _LOCK:
        indices = _BATCHES.get((task.sink_id, task.run))
        if indices is not None and indices.batch_id == task.batch_id:
            indices.taken.discard(index)


def pooled_index(transactional_id: str) -> int | None:
    """The index of a pooled id, None for any other transactional id."""
    head, marker, tail = transactional_id.rpartition("-")[2].partition(POOL_MARKER)
    if head or not marker:
        return None
    number = tail.rpartition("_")[2]
    return int(number) if number.isdigit() else None


def is_pooled(
    transactional_id: str, sink_id: str, query_ids: Collection[str | None] | None = None
) -> bool:
    """Whether ``transactional_id`` is one of the sink's pooled ids (in recovery listings),
    written by one of ``query_ids`` when they are given."""
    if query_ids is None:
        return transactional_id.startswith(f"{sink_prefix(sink_id)}{POOL_MARKER}")
    return any(
        transactional_id.startswith(pooled_prefix(sink_id, query_id)) for query_id in query_ids
    )


def take_kept_transactional(
    config: Mapping[str, Any], transactional_id: str
) -> KafkaProducer | None:
    """The kept producer of ``transactional_id`` (and settings ``config``), taken out of the
    pool; None when there is none. The caller restarts it or closes it."""
    with _LOCK:
        return _KEPT_TRANSACTIONAL.pop((configuration_key(config), transactional_id), None)


def keep_transactional(config: Mapping[str, Any], producer: KafkaProducer) -> None:
    """Keep a task's producer, its transaction prepared (flushed, left open for the
    driver), for the next task on its id; the oldest beyond ``MAX_KEPT_TRANSACTIONAL`` is
    closed (closing never ends its transaction)."""
    key = (configuration_key(config), str(producer.config["transactional_id"]))
    evicted: list[KafkaProducer] = []
    with _LOCK:
        previous = _KEPT_TRANSACTIONAL.pop(key, None)
        if previous is not None and previous is not producer:
            evicted.append(previous)
        _KEPT_TRANSACTIONAL[key] = producer
        while len(_KEPT_TRANSACTIONAL) > MAX_KEPT_TRANSACTIONAL:
            evicted.append(_KEPT_TRANSACTIONAL.popitem(last=False)[1])
    for extra in evicted:
        with contextlib.suppress(Exception):
            extra.close(timeout=FAILED_CLOSE_SECONDS)


atexit.register(close_kept)
