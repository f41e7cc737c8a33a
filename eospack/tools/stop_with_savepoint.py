"""Stop-with-savepoint (Flink's): let a running query finish the batch it runs, start no
other, stop, and write a savepoint of that last batch; the checkpoint stays usable (a query
started on it again goes on from exactly there).

Why not ``query.stop()`` and then ``create_savepoint``: ``stop()`` interrupts the query
thread wherever it is. In a batch whose offsets Spark logged, it leaves the batch without
its commit-log entry, and a 2PC sink may already have committed that batch's output: a
savepoint of the batch before it would replay it (``create_savepoint`` refuses such a
checkpoint, so the user had to catch the query idle by hand). Waiting for an idle moment
(``status['isTriggerActive']``, progress events) and then calling ``stop()`` still races
with the next trigger, and a query with processing-time timeouts (``GroupStateTimeout.
ProcessingTimeTimeout``, eospack's ``ttl``) is never idle: Spark plans a no-data batch on
every trigger, back to back under the default trigger. A stop request the replayable-kafka
source honours was considered too: its planner (a Python process Spark starts) does not
know the query's checkpoint, it would cover only queries reading that source, holding back
offsets does not stop no-data batches, and failing ``latestOffset`` ends the query as failed.

The decision: a graceful stop. Spark's micro-batch loop checks whether the query is active
once per trigger before it plans a batch (``MicroBatchExecution.executeOneBatch``), and
Spark 4.3 checks again after planning it, interrupting the batch before its job when the
query was stopped meanwhile (``integration_tests/ops/test_stop_after_batch_planning.py``
shows that batch left logged and not committed). Planning (the sources' ``latestOffset``,
the offset log) runs under the query's progress lock, which the loop also takes to write a
batch's commit-log entry. ``stop_after_batch`` holds that lock and marks the query
terminated (``StreamExecution.state``, the transition Spark makes itself when a
``Trigger.AvailableNow`` query runs out of data) only while the query thread is parked
where that cannot cut a batch: waiting for the lock to commit its batch (its job done),
waiting for it after a trigger, or sleeping until the next trigger (read from the thread's
state and stack). A thread waiting for the lock to plan has passed the first check, so
that batch is let through and the stop comes after it. Nothing is interrupted: the last
batch, data or no-data, commits, the loop plans nothing more, and the query ends normally
(no exception, sources stopped, ``QueryTerminatedEvent``). Afterwards the offset log's last
batch is checked to be committed before the savepoint is written; anything else is
refused in one line with the remedy.

Guarantees: the savepoint is of the last batch the query committed, and nothing after it was
planned, so nothing was applied by a sink that the savepoint does not cover; the checkpoint
is left as any cleanly stopped query leaves it.

Limits: it reaches into Spark's driver (``StreamExecution``'s state, progress lock and
thread, through py4j), so it needs a classic session (not Spark Connect) and py4j's pinned
threads (the default; a lock is released by the thread that took it), and it refuses
asynchronous progress tracking (its commit log is written behind the batches) and
continuous processing. Only Spark 4.3 was tried. A batch that does not reach its commit
within ``timeout`` is not cut short: the query is left running, untouched, and the call
raises. A query that fails during its last batch gets no savepoint.

Across processes (``eospack savepoint create --stop``): the CLI cannot reach another
process's query, so it writes a stop request into the checkpoint
(``eospack-stop-request.json``, with a deadline) and waits. A query honours it when its
driver runs ``StopRequestListener`` (``honour_stop_requests(spark)``; it also serves
queries run by ``supervise``, which returns once its queries end without error): at the
query's next progress or idle event the listener sees the request, stops the query after
its batch as above, and when the query has ended writes ``eospack-stopped.json``. The CLI
then checks the committed boundary, writes the savepoint and removes both files. Nobody
honouring the request within the timeout is one line, and the request is withdrawn; a
request past its deadline is ignored, so a stale one never stops a later run (the deadline
is wall-clock time of both hosts).

The requester and the listener agree on the outcome: the listener makes a query stop only
until ``stop_by`` (the deadline less a margin, ``STOP_MARGIN_SECONDS``) and acknowledges it
(``eospack-stop-acknowledged.json``); a requester past its deadline without acknowledgement
reports that nothing stopped (and nothing will), one with it waits for the query's end.
Before, a listener could stop the query up to a second after the deadline, or while the
requester made its last check, and the requester reported "no query stopped" for a query
that then stopped without a savepoint.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery, StreamingQueryListener

from eospack.core.checkpoint_files import CheckpointFiles, LocalFiles, checkpoint_files
from eospack.tools.checkpoint import CheckpointInspectError, inspect_checkpoint
from eospack.tools.savepoint import Manifest, SavepointError, create_savepoint

STOP_REQUEST = "eospack-stop-request.json"
"""Written into the checkpoint by ``request_stop_with_savepoint``: ``id``, ``deadline``."""
STOPPED = "eospack-stopped.json"
"""Written into the checkpoint by ``StopRequestListener`` once the query it stopped ended."""
ACKNOWLEDGED = "eospack-stop-acknowledged.json"
"""Written into the checkpoint by ``StopRequestListener`` once it has made the query stop
after its batch (``request``: the request's id): from then on the requester waits for the
query's end past its deadline (up to ``TERMINATION_GRACE_SECONDS``) rather than report
that nothing stopped."""
STOP_MARGIN_SECONDS = 5.0
"""A listener stops a query only until ``stop_by`` = the request's deadline less this (at
most a quarter of the timeout): what it marks stopping is acknowledged before the requester
gives up, so the requester never reports "not stopped" for a query that stops."""
TERMINATION_GRACE_SECONDS = 60.0
DEFAULT_TIMEOUT_SECONDS = 300.0
logger = logging.getLogger("eospack.stop_with_savepoint")


class StopWithSavepointError(SavepointError):
    """The query could not be stopped at a committed batch, or nothing honoured the stop
    request; the message says why and what to do."""


def _execution(query: StreamingQuery) -> Any:
    """The query's ``StreamExecution`` in the driver's JVM, or a one-line refusal."""
    wrapper = getattr(query, "_jsq", None)
    if wrapper is None:
        raise StopWithSavepointError(
            "stop_with_savepoint needs a query of a classic SparkSession (not Spark Connect):"
            " run it in the driver, or stop the query yourself between batches and use"
            " eospack savepoint create"
        )
    execution = wrapper.streamingQuery()
    kind = execution.getClass().getName()
    if "AsyncProgressTracking" in kind or "Continuous" in kind:
        raise StopWithSavepointError(
            f"query {query.name or query.id} runs {kind.rpartition('.')[2]}, whose commit log"
            " does not follow its batches: stop-with-savepoint needs the micro-batch engine"
            " (unset asyncProgressTrackingEnabled, no continuous trigger)"
        )
    return execution


def checkpoint_of(query: StreamingQuery) -> str:
    """The query's checkpoint location as Spark resolved it (a qualified URI)."""
    return str(_execution(query).resolvedCheckpointRoot())


def stop_after_batch(query: StreamingQuery, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> None:
    """Make ``query`` stop after a batch: the batch it runs (if any) runs to its commit-log
    entry and no other is planned. Returns once that is settled (the query may still be
    finishing its batch: await its termination); the query then ends normally
    (``exception()`` None) unless that batch fails. Raises ``StopWithSavepointError``, the
    query untouched, when no safe moment came within ``timeout`` seconds.

    How (see the module docstring): holding the query's progress lock, which Spark's loop
    takes to plan a batch and to commit one, wait until the query thread is parked where
    marking the query terminated cannot cut a batch: waiting for the lock to commit its
    batch (its job is done), after a trigger, or sleeping until the next trigger. A thread
    waiting for the lock to plan a batch has passed its trigger's check, so that batch is
    let through first."""
    from pyspark import SparkContext

    execution = _execution(query)
    if os.environ.get("PYSPARK_PIN_THREAD", "true").lower() == "false":
        raise StopWithSavepointError(
            "PYSPARK_PIN_THREAD=false: stop-with-savepoint takes a JVM lock from Python and"
            " needs each Python thread pinned to one JVM thread; unset PYSPARK_PIN_THREAD"
        )
    jvm = SparkContext._jvm
    if jvm is None:
        raise StopWithSavepointError("no active SparkContext: start the query's session first")
    state = execution.state()
    package = state.get().getClass().getName().rpartition(".")[0]  # ...streaming[.runtime]
    terminated = jvm.java.lang.Class.forName(f"{package}.TERMINATED$").getField("MODULE$").get(None)
    lock, thread = execution.awaitProgressLock(), execution.queryExecutionThread()
    milliseconds = jvm.java.util.concurrent.TimeUnit.MILLISECONDS
    deadline = time.monotonic() + timeout
    if not lock.tryLock(int(timeout * 1000), milliseconds):
        raise StopWithSavepointError(
            f"query {query.name or query.id} held its progress lock for {timeout:g} s: it was"
            " not stopped; try again"
        )
    try:
        while thread.isAlive():
            place = _parked_at(lock, thread)
            if place == "planning":
                lock.unlock()  # it passed its trigger's check: let it plan (and run) the batch
                if not lock.tryLock(
                    max(1, int((deadline - time.monotonic()) * 1000)), milliseconds
                ):
                    raise StopWithSavepointError(
                        f"query {query.name or query.id} kept its progress lock: it was not"
                        " stopped; try again"
                    )
            elif place == "safe":
                state.set(terminated)
                return
            if time.monotonic() > deadline:
                raise StopWithSavepointError(
                    f"query {query.name or query.id} reached no batch boundary within"
                    f" {timeout:g} s (a batch longer than that?): it was not stopped; try again"
                    " with a longer timeout"
                )
            time.sleep(0.01)
    finally:
        if lock.isHeldByCurrentThread():
            lock.unlock()


def _parked_at(lock: Any, thread: Any) -> str:
    """Where the query thread is, while this thread holds the progress lock: ``planning``
    (waiting for the lock to plan a batch), ``safe`` (waiting for it to commit a batch or
    after a trigger, or sleeping until the next trigger), else ``moving``."""
    queued = lock.hasQueuedThread(thread)
    if not queued and str(thread.getState().toString()) != "TIMED_WAITING":
        return "moving"
    methods = {str(frame.getMethodName()) for frame in thread.getStackTrace()}
    if queued:
        return "planning" if "constructNextBatch" in methods else "safe"
    if methods & {"constructNextBatch", "runBatch", "populateStartOffsets"}:
        return "moving"
    return "safe"


def last_batches(files: CheckpointFiles) -> tuple[int | None, int | None]:
    """The checkpoint's last planned (offset log) and last committed (commit log) batch."""
    try:
        report = inspect_checkpoint(files)
    except CheckpointInspectError as error:
        raise StopWithSavepointError(str(error)) from None
    planned = max((batch.batch_id for batch in report.batches), default=None)
    committed = max((batch.batch_id for batch in report.batches if batch.committed), default=None)
    return planned, committed


def require_committed_boundary(files: CheckpointFiles) -> int:
    """The last batch id when the offset log's last batch is committed; else a refusal."""
    planned, committed = last_batches(files)
    if planned is None:
        raise StopWithSavepointError(
            f"{files.location} has no batch yet: run the query until it commits one"
        )
    if planned != committed:
        raise StopWithSavepointError(
            f"{files.location}: batch {planned} was started but not committed (the query was"
            " stopped or failed inside it, and its sinks may have applied it): start the query"
            " again from this checkpoint, which replays it, then stop it with a savepoint again"
        )
    return planned


def stop_with_savepoint(
    query: StreamingQuery,
    destination: str | Path,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
    spark: SparkSession | None = None,
) -> Manifest:
    """Stop ``query`` after the batch it runs (``stop_after_batch``), wait up to ``timeout``
    seconds for it to end, check that its last batch is committed, and write a savepoint of
    that batch to ``destination`` (a new path or Hadoop file system URI) with
    ``create_savepoint``. ``spark``: the session reading the state (default: the active one).

    Guaranteed on return: the query has stopped, its checkpoint's last batch is committed
    and is the savepoint's batch; a query started again on the checkpoint goes on from it.
    Raises ``StopWithSavepointError`` (one line) when the query does not end within
    ``timeout`` (it still stops after its batch; make the savepoint with
    ``eospack savepoint create`` then), when it failed, or when its last batch is not
    committed; the query's own failure is chained."""
    if timeout <= 0:
        raise StopWithSavepointError(f"timeout={timeout!r}: give a positive number of seconds")
    session = spark or SparkSession.active()
    location = checkpoint_of(query)
    files = checkpoint_files(location, session)
    if checkpoint_files(destination, session).exists():
        raise StopWithSavepointError(
            f"{destination} exists: give a new directory for the savepoint (the query was"
            " not stopped)"
        )
    started = time.monotonic()
    if query.isActive:
        stop_after_batch(query, timeout)
    remaining = max(1.0, timeout - (time.monotonic() - started))
    if not query.awaitTermination(remaining):  # type: ignore[arg-type]  # float seconds work
        raise StopWithSavepointError(
            f"query {query.name or query.id} still ran its batch after {timeout:g} s: it stops"
            " once that batch commits and plans no other; then run eospack savepoint create"
            f" {location} {destination}"
        )
    failure = query.exception()
    if failure is not None:
        first = (str(failure).strip().splitlines() or [type(failure).__name__])[0]
        raise StopWithSavepointError(
            f"query {query.name or query.id} failed before it could stop after a batch"
            f" ({first[:300]}): start it again from its checkpoint, then stop it with a"
            " savepoint again"
        ) from failure
    batch = require_committed_boundary(files)
    manifest = create_savepoint(session, location, destination)
    if manifest.batch_id != batch:
        raise StopWithSavepointError(
            f"{location} changed while the savepoint was written (batch {batch}, then"
            f" {manifest.batch_id}): another query runs on this checkpoint; stop it first"
        )
    return manifest


def _remove(files: CheckpointFiles, relative: str) -> None:
    if isinstance(files, LocalFiles):
        files.path(relative).unlink(missing_ok=True)
    elif files.exists(relative):
        files.delete(relative)  # type: ignore[attr-defined]  # HadoopFiles


def _read_json(files: CheckpointFiles, relative: str) -> dict[str, Any] | None:
    try:
        value = json.loads(files.read_text(relative) or "null")
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class StopRequestListener(StreamingQueryListener):
    """Honours ``eospack savepoint create --stop`` for the queries of the session it is
    added to (``spark.streams.addListener(StopRequestListener(spark))``, or
    ``honour_stop_requests(spark)``): at each progress or idle event of a query it reads the
    query's checkpoint for a stop request within its deadline, stops the query after its
    batch (``stop_after_batch``) and, when the query has ended, writes ``STOPPED`` with the
    request's id (and the failure, if the last batch failed). Costs one small file read
    per batch and per idle event (every ``spark.sql.streaming.noDataProgressEventInterval``,
    10 s by default), which bounds how soon an idle query honours a request."""

    def __init__(self, spark: SparkSession) -> None:
        self.session = spark
        self.checkpoints: dict[str, str] = {}
        self.honoured: dict[str, tuple[str, str]] = {}
        """run id -> (checkpoint, request id) of a query this listener stopped."""

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        self.check(str(event.progress.id), str(event.progress.runId))

    def onQueryIdle(self, event: Any) -> None:
        self.check(str(event.id), str(event.runId))

    def onQueryTerminated(self, event: Any) -> None:
        run_id = str(event.runId)
        self.checkpoints.pop(run_id, None)
        honoured = self.honoured.pop(run_id, None)
        if honoured is None:
            return
        location, request_id = honoured
        files = checkpoint_files(location, self.session)
        exception = event.exception
        files.write_text(
            STOPPED,
            json.dumps(
                {
                    "request": request_id,
                    "query": str(event.id),
                    "run": run_id,
                    "failure": (str(exception).splitlines() or [""])[0] if exception else None,
                }
            ),
        )

    def check(self, query_id: str, run_id: str) -> None:
        """Stop the query of ``run_id`` after its batch if its checkpoint holds a live stop
        request; never raises (a listener's error would only be logged by Spark)."""
        if run_id in self.honoured:
            return
        try:
            query = self.session.streams.get(query_id)
            if query is None or str(query.runId) != run_id:
                return
            location = self.checkpoints.get(run_id)
            if location is None:
                location = self.checkpoints[run_id] = checkpoint_of(query)
            files = checkpoint_files(location, self.session)
            request = _read_json(files, STOP_REQUEST)
            if request is None:
                return
            stop_by = float(request.get("stop_by", request.get("deadline", 0)))
            remaining = stop_by - time.time()
            if remaining <= 0:  # the requester may be giving up: stopping now could go unseen
                return
            request_id = str(request.get("id"))
            self.honoured[run_id] = (location, request_id)
            threading.Thread(
                target=self.stop, args=(query, run_id, remaining, request_id), daemon=True
            ).start()
        except Exception:  # a listener must not fail the listener bus
            logger.exception("stop request of query %s not honoured", query_id)

    def stop(self, query: StreamingQuery, run_id: str, timeout: float, request_id: str) -> None:
        """``stop_after_batch`` off the listener bus (it may wait for a batch to end), within
        ``timeout`` (the request's ``stop_by``), then ``ACKNOWLEDGED``; when it gives up, a
        later event of the query tries again while the request lasts."""
        try:
            stop_after_batch(query, timeout)
        except Exception:
            self.honoured.pop(run_id, None)
            logger.exception("stop request of query %s not honoured yet", query.id)
            return
        try:
            location, _ = self.honoured.get(run_id, (checkpoint_of(query), request_id))
            checkpoint_files(location, self.session).write_text(
                ACKNOWLEDGED, json.dumps({"request": request_id, "run": run_id})
            )
        except Exception:
            logger.exception("stop of query %s not acknowledged", query.id)


def honour_stop_requests(spark: SparkSession) -> StopRequestListener:
    """Add a ``StopRequestListener`` to ``spark`` and return it (to remove it later with
    ``spark.streams.removeListener``)."""
    listener = StopRequestListener(spark)
    spark.streams.addListener(listener)
    return listener


def request_stop_with_savepoint(
    spark: SparkSession,
    checkpoint: str | Path,
    destination: str | Path,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
    poll_seconds: float = 0.5,
) -> Manifest:
    """``eospack savepoint create --stop``: write a stop request into ``checkpoint``, wait up
    to ``timeout`` seconds for the query running on it (in any process whose driver runs a
    ``StopRequestListener``) to stop after a batch, then check the committed boundary and
    write the savepoint with ``create_savepoint``. The request is removed in every case;
    refusals are one line (``StopWithSavepointError``)."""
    if timeout <= 0:
        raise StopWithSavepointError(f"--timeout {timeout!r}: give a positive number of seconds")
    files = checkpoint_files(checkpoint, spark)
    if files.read_text("metadata") is None:
        raise StopWithSavepointError(
            f"{files.location} is not a streaming checkpoint (no metadata file): give the"
            " checkpointLocation of a running query"
        )
    if checkpoint_files(destination, spark).exists():
        raise StopWithSavepointError(
            f"{destination} exists: give a new directory for the savepoint"
        )
    pending = _read_json(files, STOP_REQUEST)
    if pending is not None and float(pending.get("deadline", 0)) > time.time():
        until = time.strftime("%H:%M:%S UTC", time.gmtime(float(pending["deadline"])))
        raise StopWithSavepointError(
            f"{files.location}: a stop request is already waiting there (until {until}): let"
            " that eospack savepoint create --stop finish, or run again after it times out"
        )
    request_id = uuid.uuid4().hex
    deadline = time.time() + timeout
    stop_by = deadline - min(STOP_MARGIN_SECONDS, timeout / 4)
    _remove(files, STOPPED)
    _remove(files, ACKNOWLEDGED)
    files.write_text(
        STOP_REQUEST, json.dumps({"id": request_id, "deadline": deadline, "stop_by": stop_by})
    )
    try:
        while True:
            stopped = _read_json(files, STOPPED)
            if stopped is not None and stopped.get("request") == request_id:
                break
            now = time.time()
            if now > deadline:
                acknowledged = _read_json(files, ACKNOWLEDGED)
                if acknowledged is None or acknowledged.get("request") != request_id:
                    raise StopWithSavepointError(
                        f"no query on {files.location} stopped within {timeout:g} s: run the"
                        " query with eospack's StopRequestListener"
                        " (eospack.honour_stop_requests(spark)), or stop it between batches"
                        " and run eospack savepoint create (request withdrawn)"
                    )
                if now > deadline + TERMINATION_GRACE_SECONDS:
                    raise StopWithSavepointError(
                        f"the query on {files.location} was made to stop after its batch but"
                        f" had not ended {TERMINATION_GRACE_SECONDS:g} s after the timeout:"
                        f" once it has ended, run eospack savepoint create {checkpoint}"
                        f" {destination}"
                    )
            time.sleep(poll_seconds)
    finally:
        _remove(files, STOP_REQUEST)
        _remove(files, ACKNOWLEDGED)
    _remove(files, STOPPED)
    if stopped.get("failure"):
        raise StopWithSavepointError(
            f"the query on {files.location} failed before it could stop after a batch"
            f" ({str(stopped['failure'])[:300]}): start it again from its checkpoint, then"
            " stop it with a savepoint again"
        )
    batch = require_committed_boundary(files)
    manifest = create_savepoint(spark, checkpoint, destination)
    if manifest.batch_id != batch:
        raise StopWithSavepointError(
            f"{files.location} changed while the savepoint was written (batch {batch}, then"
            f" {manifest.batch_id}): a query runs on this checkpoint again; stop it first"
        )
    return manifest
