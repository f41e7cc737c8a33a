"""Where 2pc-kafka keeps its decisions: a compacted Kafka topic, one record per slot.

A slot (sink, batch) is the record keyed ``<sinkId>/<batchId>`` whose value is the JSON
``{"status": ..., "pieces": [...]}`` (see ``eospack.commit_protocols.pieces``); a tombstone
forgets it. The topic has one partition and is written only in Kafka transactions.

Why this is a compare-and-set slot: every ledger of a sink writes with one transactional
id, ``eospack-ledger-<sinkId>``. Opening a ledger initialises that id, which fences any
other process still holding it (a zombie driver of an earlier run): from then on only
this ledger can commit writes for the sink, and what it reads after opening (with
read_committed, to the end) is the whole truth. A fenced writer's next write fails with
``ProducerFencedError``, so it can never overwrite what it did not read.

Kept open: opening costs a coordinator lookup, InitProducerId and a read of the topic
(about 0.17 s), so a driver process keeps its ledger between commits (``shared_ledger``).
That is safe because every change of a slot is a transactional write: if another process
opened the sink's ledger since (a restarted query, another Python worker of this driver),
the kept ledger's view may be stale, but its next write fails with ``LedgerFencedError``
and ``KafkaResource`` then reopens, rereads and does the step again. What a stale view can
still say without writing is harmless: a decided slot never changes, and a fence never
un-fences a piece.

Reading past other writers' open transactions: the topic is shared by every 2pc-kafka sink
of the cluster, and a read_committed consumer stops at the last stable offset, the start of
the oldest transaction still open, whoever wrote it. Reading only "to the end offset" as a
read_committed client reports it would miss every decision written after another sink's
open ledger transaction (a driver that died mid-write): a restart would not see its own
decision and would commit the batch again. So a ledger reads to the *high watermark* as it
stood after opening (every transaction of this sink committed before then lies below it)
and waits for the last stable offset to pass it. Ledger transactions last milliseconds, so
an eospack ledger transaction that keeps it waiting for ``LEDGER_STALL_SECONDS`` (open
since below the offset the reader must reach) belongs to a dead or stuck driver: the
reader fences it (InitProducerId on its id, which aborts it;
a live owner's next write fails with ``LedgerFencedError`` and it rereads, as for any
fence). Ledger producers use a short transaction timeout (``LEDGER_TRANSACTION_TIMEOUT_MS``),
so the broker itself aborts such leftovers soon, also for readers that are not eospack.

Growth: ``mark_done`` of batch N tombstones the sink's slots below N - 1 (a replay only
ever concerns the last batch), and compaction drops them; each open reads the topic from
its start, so the topic stays small.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka import errors as kafka_errors
from kafka.admin import ConfigResource, ConfigResourceType

from ....commit_protocols.pieces import DONE, BatchDecision, PreparedPiece
from ..client.cluster_configs import describe_configs
from ..client.producers import close_at_once, transaction_error
from ..client.ride_through import ATTEMPT_SECONDS
from ..client.transactions import (
    CONTROL_SETTINGS,
    admin_client,
    consumer_settings,
    end_transaction,
    fence,
)
from ..errors import LedgerError, LedgerFencedError, LedgerReadTimeoutError
from .options import (
    DEFAULT_LEDGER_TOPIC,
    KafkaSinkOptions,
    client_config,
)

LEDGER_TOPIC_CONFIGS = {
    "cleanup.policy": "compact",
    "segment.ms": "600000",
    "min.cleanable.dirty.ratio": "0.1",
    "delete.retention.ms": "3600000",
}
"""What marks a topic as a ledger topic (``is_ledger_topic``); ``min.insync.replicas`` is set
beside them where the replication allows (``ledger_topic_durability``)."""
DURABLE_REPLICATION = 3
DURABLE_MIN_INSYNC_REPLICAS = 2
"""The ledger holds every decision: losing a committed record of it can apply a batch twice
or leave a decided one unfinished. So it is created replicated on min(3, brokers) nodes with
min.insync.replicas=2 where it has 3 replicas (Kafka's and Flink's guidance for data that
must survive a broker: a write is acknowledged by two nodes, and one may be down). With 2
replicas min.insync.replicas stays 1: 2 of 2 would stop every decision while either node is
down, which is what riding through a broker loss must avoid."""
READ_TIMEOUT_SECONDS = 120.0
"""How long opening a ledger may take to read the topic to its end (including waiting for
another writer's open transaction on it to end: see the module doc)."""
LEDGER_TRANSACTION_TIMEOUT_MS = 10_000
"""A ledger transaction writes a few records and commits at once; a dead driver's open one
holds every ledger reader back until the broker aborts it after this long."""
LEDGER_STALL_SECONDS = 3.0
"""How long a reader waits for an eospack ledger transaction of another sink to end before
fencing it."""
LEDGER_ID_PREFIX = "eospack-ledger-"
INSPECTION_READ_TIMEOUT_SECONDS = 40.0
"""How long inspection (which fences nobody) waits for a stuck ledger transaction to be
aborted by the broker: longer than ``LEDGER_TRANSACTION_TIMEOUT_MS`` plus the broker's
default abort check interval (10 s)."""
_TOMBSTONE = None
logger = logging.getLogger(__name__)


class Ledger:
    """The slots of one sink, read once at open and kept up to date by this object's writes."""

    def __init__(self, options: KafkaSinkOptions, sink_id: str) -> None:
        self.options = options
        self.sink_id = sink_id
        self.topic = options.ledger_topic
        self.lock = threading.RLock()
        """Held by whoever runs a step on this ledger: one step at a time per process."""
        config = {**CONTROL_SETTINGS, **options.client_config()}
        _ensure_topic(options.bootstrap_servers, options.producer_params, self.topic)
        # max_block_ms bounds init_transactions (and a send's metadata wait): a coordinator
        # that is gone costs one attempt of ATTEMPT_SECONDS, then the ledger is reopened.
        self.producer = KafkaProducer(
            transactional_id=f"{LEDGER_ID_PREFIX}{sink_id}",
            acks="all",
            transaction_timeout_ms=LEDGER_TRANSACTION_TIMEOUT_MS,
            **{"max_block_ms": int(ATTEMPT_SECONDS * 1000), **config},
        )
        try:
            self.producer.init_transactions()
            self.slots = read_slots(config, self.topic, sink_id)
        except BaseException:
            close_at_once(self.producer)
            raise

    def write(self, slot: BatchDecision) -> BatchDecision:
        """Write ``slot`` (its status and pieces) in one committed transaction."""
        body = {"status": slot.status, "pieces": [piece.to_json() for piece in slot.pieces]}
        self._commit({slot.batch_id: json.dumps(body, separators=(",", ":")).encode()})
        self.slots[slot.batch_id] = slot
        return slot

    def mark_done(self, slot: BatchDecision) -> None:
        """``slot`` done, and the sink's done slots of the same query below ``batch_id - 1``
        forgotten: never a decided one (its pieces still need their commit), nor one another
        query decided under a shared sinkId (its replay must still find it). A slot this
        ledger read as done already (an earlier attempt applied, its answer lost) is not
        written again."""
        kept = self.slots.get(slot.batch_id)
        if kept is not None and kept.status == DONE and kept.same_pieces(slot):
            return
        queries = slot.query_ids()
        old = [
            batch
            for batch, kept in self.slots.items()
            if batch < slot.batch_id - 1 and kept.status == DONE and kept.query_ids() == queries
        ]
        body = {"status": DONE, "pieces": [piece.to_json() for piece in slot.pieces]}
        records: dict[int, bytes | None] = {batch: _TOMBSTONE for batch in old}
        records[slot.batch_id] = json.dumps(body, separators=(",", ":")).encode()
        self._commit(records)
        for batch in old:
            del self.slots[batch]
        self.slots[slot.batch_id] = BatchDecision(slot.sink_id, slot.batch_id, slot.pieces, DONE)

    def _commit(self, records: dict[int, bytes | None]) -> None:
        """One transaction of ``records``, waiting at most ``ATTEMPT_SECONDS`` for its end.
        A failure other than a fence leaves the outcome unknown (it may have committed): the
        caller drops this ledger and reads a fresh one before writing again."""
        try:
            self.producer.begin_transaction()
            for batch_id, value in sorted(records.items()):
                self.producer.send(self.topic, key=slot_key(self.sink_id, batch_id), value=value)
            end_transaction(self.producer, commit=True, timeout_ms=int(ATTEMPT_SECONDS * 1000))
        except kafka_errors.KafkaError as error:
            if not _fenced(self.producer, error):
                cause = transaction_error(self.producer)
                if cause is not None and error.__cause__ is None and cause is not error:
                    raise error from cause  # kafka-python's plain KafkaError names no cause
                raise
            raise LedgerFencedError(
                f"2pc-kafka sink {self.sink_id}: another process now writes this sink's"
                f" decisions to {self.topic} (a newer run of the query, or another query with"
                " the same sinkId): this one stops; give each query its own sinkId (or none)"
            ) from None

    def close(self) -> None:
        """Close at once; never raises (see ``close_at_once``)."""
        close_at_once(self.producer)


def _fenced(producer: KafkaProducer, error: kafka_errors.KafkaError) -> bool:
    """Whether ``error`` means another producer of the id took over. kafka-python raises
    ``ProducerFencedError`` only when EndTxn itself was refused; when the sender saw it
    first (AddPartitionsToTxn, a produce), every later call raises a plain ``KafkaError``
    about the error state, and the cause is the transaction manager's last error."""
    fenced = (kafka_errors.ProducerFencedError, kafka_errors.InvalidProducerEpochError)
    return isinstance(error, fenced) or isinstance(transaction_error(producer), fenced)


_shared: dict[tuple[str, str, str], Ledger] = {}
_shared_lock = threading.Lock()


def shared_ledger(options: KafkaSinkOptions, sink_id: str) -> tuple[Ledger, bool]:
    """This process's open ledger of the sink, opened now if there is none; and whether it
    was opened before (its view may be stale: see the module doc)."""
    key = (repr(sorted(options.client_config().items())), options.ledger_topic, sink_id)
    with _shared_lock:
        ledger = _shared.get(key)
        if ledger is not None:
            return ledger, True
        # Opened under the lock: two threads opening at once would fence each other.
        ledger = Ledger(options, sink_id)
        _shared[key] = ledger
    return ledger, False


def forget_ledger(ledger: Ledger) -> None:
    """Close ``ledger`` and stop sharing it (after any failure its state is unknown)."""
    with _shared_lock:
        for key, shared in list(_shared.items()):
            if shared is ledger:
                del _shared[key]
    ledger.close()


def slot_key(sink_id: str, batch_id: int) -> bytes:
    return f"{sink_id}/{batch_id}".encode()


def read_slots(
    config: dict[str, Any],
    topic: str,
    sink_id: str,
    *,
    fence_stuck: bool = True,
    timeout_seconds: float = READ_TIMEOUT_SECONDS,
) -> dict[int, BatchDecision]:
    """Every slot of ``sink_id`` in ``topic``, read with read_committed up to the high
    watermark as it stands now, past other writers' open transactions (see the module doc).
    ``fence_stuck=False`` (inspection) never fences a stuck ledger transaction: the read
    waits for the broker to end it, at most ``timeout_seconds``."""
    partition = TopicPartition(topic, 0)
    settings = consumer_settings(config)
    consumer = KafkaConsumer(
        isolation_level="read_committed", enable_auto_commit=False, group_id=None, **settings
    )
    prefix = f"{sink_id}/".encode()
    slots: dict[int, BatchDecision] = {}
    try:
        consumer.assign([partition])
        consumer.seek_to_beginning(partition)
        end = high_watermark(settings, partition)
        deadline = time.monotonic() + timeout_seconds
        stalled_since = time.monotonic()
        fenced = not fence_stuck
        while (position := consumer.position(partition)) < end:
            now = time.monotonic()
            if now > deadline:
                raise LedgerReadTimeoutError(
                    f"2pc-kafka could not read its ledger topic {topic} to offset {end} within"
                    f" {timeout_seconds:.0f} s (stopped at {position}: a transaction"
                    " of another writer stays open on it; the broker aborts it after its"
                    " transaction timeout)"
                )
            if not fenced and now - stalled_since > LEDGER_STALL_SECONDS:
                fence_stuck_ledger_writers(config, partition, sink_id, below=end)
                fenced = True
            polled = consumer.poll(timeout_ms=500)
            if consumer.position(partition) > position:
                stalled_since = time.monotonic()
            for records in polled.values():
                for record in records:
                    if record.key is None or not record.key.startswith(prefix):
                        continue
                    batch_id = int(record.key[len(prefix) :])
                    if record.value is None:
                        slots.pop(batch_id, None)
                        continue
                    body = json.loads(record.value)
                    pieces = tuple(PreparedPiece.from_json(piece) for piece in body["pieces"])
                    slots[batch_id] = BatchDecision(sink_id, batch_id, pieces, body["status"])
    finally:
        consumer.close()
    return slots


def read_slots_if_any(
    options: KafkaSinkOptions, sink_id: str, *, fence_stuck: bool = True
) -> dict[int, BatchDecision]:
    """The sink's slots, read without opening a ledger (no InitProducerId, no fence of the
    sink's own ledger; another sink's stuck ledger transaction is fenced unless
    ``fence_stuck`` is False), and none if the ledger topic does not exist (nothing is
    created)."""
    config = {**CONTROL_SETTINGS, **options.client_config()}
    admin = admin_client(config)
    try:
        exists = options.ledger_topic in admin.list_topics()
    finally:
        admin.close()
    if not exists:
        return {}
    if fence_stuck:
        return read_slots(config, options.ledger_topic, sink_id)
    return read_slots(
        config,
        options.ledger_topic,
        sink_id,
        fence_stuck=False,
        timeout_seconds=INSPECTION_READ_TIMEOUT_SECONDS,
    )


def high_watermark(settings: dict[str, Any], partition: TopicPartition) -> int:
    """The partition's end offset for read_uncommitted: one past its last record, open
    transactions included (a read_committed client's end offset stops at the first one)."""
    consumer = KafkaConsumer(enable_auto_commit=False, group_id=None, **settings)
    try:
        return int(consumer.end_offsets([partition])[partition])
    finally:
        consumer.close()


def fence_stuck_ledger_writers(
    config: dict[str, Any], partition: TopicPartition, sink_id: str, *, below: int
) -> list[str]:
    """Fence the eospack ledger transactions (of other sinks) that hold this reader back:
    open on ``partition`` since an offset below ``below`` (the high watermark the reader
    must reach, taken when it began), so open at least since the read began and for the
    stall since (DescribeProducers). A transaction begun after the read began is never
    fenced, however young the reader's view of it. Returns their transactional ids."""
    own = f"{LEDGER_ID_PREFIX}{sink_id}"
    admin = admin_client(config)
    try:
        producers = admin.describe_producers([partition])[partition].active_producers
        blocking = sorted(
            producer.producer_id
            for producer in producers
            if 0 <= producer.current_transaction_start_offset < below
        )
        listed = (
            admin.list_transactions(state_filters=["Ongoing"], producer_id_filters=blocking)
            if blocking
            else {}
        )
    except kafka_errors.KafkaError as error:  # it may have ended meanwhile: keep waiting
        logger.info("2pc-kafka: could not describe the ledger's open transactions: %r", error)
        return []
    finally:
        admin.close()
    stuck = sorted(
        listing.transactional_id
        for listings in listed.values()
        for listing in listings
        if listing.transactional_id.startswith(LEDGER_ID_PREFIX)
        and listing.transactional_id != own
        and listing.producer_id in blocking
    )
    for transactional_id in stuck:
        logger.warning(
            "2pc-kafka: ledger transaction %s stays open on %s: fencing it (its driver died"
            " or is stuck; a live one rereads and retries)",
            transactional_id,
            partition.topic,
        )
        fence({**CONTROL_SETTINGS, **config}, transactional_id)
    return stuck


def is_ledger_topic(options: KafkaSinkOptions, topic: str) -> bool:
    """Whether ``topic`` is a 2pc-kafka ledger topic, of this sink or any other: its name is
    this sink's or the default ledger topic, or it carries the configuration every ledger
    topic is created with (``LEDGER_TOPIC_CONFIGS``, as topic overrides). A task refuses to
    write rows there: a row could forge a decision, or hold every ledger reader back.
    When the topic's configuration may not be read (no DESCRIBE_CONFIGS on it), only the
    names are checked, and a warning says so once per process and topic."""
    if topic in (options.ledger_topic, DEFAULT_LEDGER_TOPIC):
        return True
    found = _has_ledger_configs(options.bootstrap_servers, options.producer_params, topic)
    return bool(found)


@functools.cache
def _has_ledger_configs(
    bootstrap_servers: str, producer_params: tuple[tuple[str, Any], ...], topic: str
) -> bool | None:
    """Asked once per process, cluster and topic (DescribeConfigs); a topic that does not
    exist yet (created on first write) is no ledger; None (warned) when it cannot be told."""
    admin = admin_client({**CONTROL_SETTINGS, **client_config(bootstrap_servers, producer_params)})
    resource = ConfigResource(ConfigResourceType.TOPIC, topic, list(LEDGER_TOPIC_CONFIGS))
    try:
        described = describe_configs(admin, [resource]).get(("topic", topic))
    finally:
        admin.close()
    if described is None or described.error is kafka_errors.UnknownTopicOrPartitionError:
        return False
    if described.error is not None:
        logger.warning(
            "2pc-kafka cannot check whether topic %s is another sink's ledger topic: its"
            " DescribeConfigs was refused (%s), so rows are refused only for ledger topics"
            " known by name (the sink's ledgerTopic and %s); grant DESCRIBE_CONFIGS on the"
            " topic to let it check",
            topic,
            described.error.__name__,
            DEFAULT_LEDGER_TOPIC,
        )
        return None
    return all(described.values.get(name) == value for name, value in LEDGER_TOPIC_CONFIGS.items())


def ensure_ledger_topic(options: KafkaSinkOptions) -> None:
    """Create the compacted ledger topic unless it exists (replicated like the cluster
    allows); checked once per process and cluster. Called at query start: a ledger topic
    that exists weaker than it would be created (``ledger_topic_durability``) is warned
    about there, once per process and topic."""
    created = _ensure_topic(
        options.bootstrap_servers, options.producer_params, options.ledger_topic
    )
    if not created:
        _warn_if_weak(options.bootstrap_servers, options.producer_params, options.ledger_topic)


@functools.cache
def _ensure_topic(
    bootstrap_servers: str, producer_params: tuple[tuple[str, Any], ...], topic: str
) -> bool:
    """Cached by cluster, client settings and topic: only a success is remembered (an
    error is raised, so the next ledger opened checks again). Whether it was created."""
    config = {**CONTROL_SETTINGS, **client_config(bootstrap_servers, producer_params)}
    return _create_ledger_topic(config, topic)


def ledger_topic_settings(brokers: int) -> tuple[int, dict[str, str]]:
    """The replication factor and topic settings a ledger topic is created with on a cluster
    of ``brokers`` (see ``DURABLE_MIN_INSYNC_REPLICAS``)."""
    replication = min(DURABLE_REPLICATION, brokers)
    configs = dict(LEDGER_TOPIC_CONFIGS)
    if replication >= DURABLE_REPLICATION:
        configs["min.insync.replicas"] = str(DURABLE_MIN_INSYNC_REPLICAS)
    return replication, configs


def _create_ledger_topic(config: dict[str, Any], topic: str) -> bool:
    """Create ``topic`` unless it exists (whether it was created); a refusal is one
    ``LedgerError`` line naming the ACL the user lacks and the ``ledgerTopic`` option."""
    admin = admin_client(config)
    try:
        if topic in admin.list_topics():
            return False
        brokers = len(admin.describe_cluster()["brokers"])
        replication, configs = ledger_topic_settings(brokers)
        try:
            admin.create_topics(
                {
                    topic: {
                        "num_partitions": 1,
                        "replication_factor": replication,
                        "configs": configs,
                    }
                }
            )
        except kafka_errors.TopicAlreadyExistsError:
            return False
        except (
            kafka_errors.TopicAuthorizationFailedError,
            kafka_errors.ClusterAuthorizationFailedError,
        ) as error:
            user = config.get("sasl_plain_username")
            principal = f"User:{user}" if user else "the query's principal"
            raise LedgerError(
                f"2pc-kafka may not create its ledger topic {topic} ({type(error).__name__}):"
                f" grant {principal} CREATE, READ, WRITE and DESCRIBE on topic {topic}, or"
                " set the option ledgerTopic to a topic inside the user's grant (see"
                " docs/connectors/2pc-kafka.md, Security / ACLs)"
            ) from None
        return True
    finally:
        admin.close()


def ledger_topic_durability(
    topic: str,
    bootstrap_servers: str,
    *,
    brokers: int,
    replication: int,
    min_insync_replicas: int | None,
) -> str | None:
    """The warning for an existing ledger topic weaker than ``ledger_topic_settings`` would
    create it, naming what was found and the commands that fix it; None when it is as
    strong. ``min_insync_replicas`` None: it could not be read (DescribeConfigs refused),
    which the warning says. Warned, not refused: the topic works, a broker lost at the wrong
    moment can lose a decision, and the fix is the cluster operator's, outside the query."""
    wanted_replication, configs = ledger_topic_settings(brokers)
    wanted_min_isr = int(configs.get("min.insync.replicas", "1"))
    found: list[str] = []
    fixes = []
    if replication < wanted_replication:
        found.append(
            f"it has {replication} replica(s) where the cluster's {brokers} brokers allow"
            f" {wanted_replication}"
        )
        fixes.append(
            f"raise its replication factor to {wanted_replication} with"
            f" kafka-reassign-partitions.sh --bootstrap-server {bootstrap_servers} --execute"
            " --reassignment-json-file <a plan listing "
            f"{wanted_replication} replicas for {topic}-0>"
        )
    min_isr_wanted = max(replication, wanted_replication) >= DURABLE_REPLICATION
    if min_isr_wanted and min_insync_replicas is None:
        found.append(
            "its min.insync.replicas cannot be checked (DescribeConfigs on the topic was"
            " refused: grant DESCRIBE_CONFIGS on it to let the sink check)"
        )
    elif (
        min_isr_wanted
        and min_insync_replicas is not None
        and min_insync_replicas < DURABLE_MIN_INSYNC_REPLICAS
    ):
        found.append(f"its min.insync.replicas is {min_insync_replicas}")
    if min_isr_wanted and (
        min_insync_replicas is None or min_insync_replicas < DURABLE_MIN_INSYNC_REPLICAS
    ):
        fixes.append(
            f"kafka-configs.sh --bootstrap-server {bootstrap_servers} --alter --entity-type"
            f" topics --entity-name {topic} --add-config"
            f" min.insync.replicas={DURABLE_MIN_INSYNC_REPLICAS}"
        )
    if not found:
        return None
    created = f"replication factor {wanted_replication}" + (
        f" and min.insync.replicas {wanted_min_isr}" if wanted_min_isr > 1 else ""
    )
    return (
        f"2pc-kafka's ledger topic {topic} (where the sink keeps its decisions) may be less"
        f" durable than the sink would create it ({created}): {'; '.join(found)}. A decision"
        " acknowledged by one broker that is then lost can make a restart apply a batch"
        " twice or leave it unfinished; the sink goes on. Fix: " + "; then ".join(fixes)
    )


@functools.cache
def _warn_if_weak(
    bootstrap_servers: str, producer_params: tuple[tuple[str, Any], ...], topic: str
) -> None:
    """Log ``ledger_topic_durability``'s warning for ``topic``, once per process, cluster and
    topic. A check that fails (the cluster answers nothing) is logged and skipped: it never
    stops the query."""
    config = {**CONTROL_SETTINGS, **client_config(bootstrap_servers, producer_params)}
    admin = admin_client(config)
    try:
        brokers = len(admin.describe_cluster()["brokers"])
        (described,) = admin.describe_topics([topic])
        partitions = described.get("partitions") or []
        replication = min((len(p["replica_nodes"]) for p in partitions), default=0)
        resource = ConfigResource(ConfigResourceType.TOPIC, topic, ["min.insync.replicas"])
        configs = describe_configs(admin, [resource]).get(("topic", topic))
    except kafka_errors.KafkaError as error:
        logger.info("2pc-kafka could not check ledger topic %s's durability: %r", topic, error)
        return
    finally:
        admin.close()
    min_isr: int | None = None
    if configs is not None and configs.error is None:
        value = configs.values.get("min.insync.replicas")
        min_isr = int(value) if value is not None else 1
    warning = ledger_topic_durability(
        topic,
        bootstrap_servers,
        brokers=brokers,
        replication=replication,
        min_insync_replicas=min_isr,
    )
    if warning is not None:
        logger.warning("%s", warning)
