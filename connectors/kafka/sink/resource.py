"""2pc-kafka's part in the two-phase commit: pieces are Kafka transactions a task left open,
slots live in the ledger topic (``ledger``).

- commit a piece: EndTxn(commit) by its producer id and epoch (``transactions``);
  idempotent. A decided transaction the broker aborted meanwhile (the query stayed down
  longer than ``transaction.timeout.ms``, or someone fenced it) raises
  ``DecidedPieceLostError``: its records are lost, and the restart says so.
- roll a piece back: fence its transactional id (InitProducerId), which aborts it.
- prepared pieces: the sink's open transactions, listed by the broker (ListTransactions),
  named like every eospack transaction id, so batch and attempt are read off the name;
  open transactions under the sink's pooled ids (``producer_pool``) carry no batch and are
  rolled back by ``roll_back_unattributed`` once the decisions are finished.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import TypeVar

from kafka import KafkaAdminClient
from kafka import errors as kafka_errors

from eospack.core import faults

from ....commit_protocols import derive_sink_id, parse_transaction_id, sink_prefix
from ....commit_protocols.inspection import DecisionState, Leftover, SinkState
from ....commit_protocols.pieces import ABORTED, DECIDED, BatchDecision, PreparedPiece
from ....commit_protocols.resource import DecidedPieceLostError, TransactionalResource
from ..client.ride_through import Retry
from ..client.transactions import (
    PreparedTransaction,
    admin_client,
    commit_prepared,
    commit_prepared_together,
    fence,
    lost_transactions,
    open_epochs,
    open_transactions,
)
from ..errors import (
    LedgerFencedError,
    PreparedTransactionLostError,
    TransactionFencedError,
)
from .cluster_identity import derived_sink_id
from .ledger import (
    LEDGER_ID_PREFIX,
    Ledger,
    forget_ledger,
    read_slots_if_any,
    shared_ledger,
)
from .options import KafkaSinkOptions, parse_options
from .producer_pool import is_pooled

Result = TypeVar("Result")
logger = logging.getLogger(__name__)


class KafkaResource(TransactionalResource):
    """One commit's or abort's view of a 2pc-kafka sink; its ledgers are the process's
    shared ones (``ledger.shared_ledger``)."""

    sink_format = "2pc-kafka"
    cleanup_advice = (
        "start the query again from this checkpoint within kafka.transaction.timeout.ms: its"
        " first commit commits the transactions a decision names and fences the rest (never"
        " fence them by hand: a decided transaction aborted is data lost)"
    )

    def __init__(self, options: KafkaSinkOptions) -> None:
        self.options = options
        self.config = options.client_config()
        self._admin: KafkaAdminClient | None = None
        self.retried_ledger_steps = 0
        """How many ledger steps of this resource failed and were tried again."""
        self._pooled_open: dict[str, list[str]] = {}
        """Per sink, the open pooled transactions the last ``prepared_pieces`` listed that
        no slot names."""
        self._read_only = False
        """True while ``inspect`` runs: nothing may be opened or fenced."""

    def admin(self) -> KafkaAdminClient:
        """One admin client for this commit's transaction calls (the liveness check and
        every piece's EndTxn), made on first use, closed with the resource."""
        if self._admin is None:
            self._admin = admin_client(self.config)
        return self._admin

    def _with_ledger(self, sink_id: str, step: Callable[[Ledger], Result]) -> Result:
        """Run ``step`` on the process's shared ledger of the sink, riding through the loss
        of a broker (``ride_through``): after ANY failure the ledger is dropped (closed at
        once, never raising over the cause), and a transient one (a coordinator or leader
        gone, a timeout) is retried on a ledger opened afresh, until
        ``RIDE_THROUGH_SECONDS`` (5 min) have passed; then, or for a failure no broker change
        cures, the step's own failure is raised.

        Why a fresh ledger: opening finds the coordinator again (kafka-python's producer
        kept asking the dead one), and its InitProducerId ends whatever the dropped
        producer left: a write whose EndTxn reached the coordinator is completed, any other
        is aborted. The fresh ledger then reads the topic to its end, so a write that failed
        with its answer lost is seen if it applied, and ``step`` compares before it writes
        again (a decided slot never changes; ``record_decision`` re-checks the pieces
        before deciding after a failure). A fence by another process (a newer run of the
        query) is retried at once, once: a second fence in a row means another live
        process keeps taking the sink over, and ``LedgerFencedError`` is raised."""
        retry = Retry(time.monotonic())
        while True:
            ledger: Ledger | None = None
            try:
                ledger, _ = shared_ledger(self.options, sink_id)
                with ledger.lock:
                    return step(ledger)
            except Exception as error:
                if ledger is not None:
                    forget_ledger(ledger)
                fenced = isinstance(error, LedgerFencedError)
                delay = retry.next_delay(error, time.monotonic(), fenced=fenced)
                if delay is None:
                    if retry.failures > 1:
                        logger.error(
                            "2pc-kafka sink %s: a ledger step failed %d times over %.0f s;"
                            " giving up with its last failure (a restart from the checkpoint"
                            " finishes or replays the batch)",
                            sink_id,
                            retry.failures,
                            time.monotonic() - retry.started,
                        )
                    raise
                logger.warning(
                    "2pc-kafka sink %s: a ledger step failed (%s: %s); retrying on a ledger"
                    " opened afresh in %.1f s (attempt %d, gives up %.0f s after the first)",
                    sink_id,
                    type(error).__name__,
                    " ".join(str(error).split())[:300],
                    delay,
                    retry.failures + 1,
                    retry.deadline_seconds,
                )
                self.retried_ledger_steps += 1
                time.sleep(delay)
            except BaseException:
                if ledger is not None:
                    forget_ledger(ledger)
                raise

    def _riding_through(self, what: str, action: Callable[[], Result]) -> Result:
        """Run a broker call that is safe to repeat (a listing, a describe, a fence) until it
        succeeds, riding through a broker loss like the ledger steps (``ride_through``): a
        transient failure drops the kept admin client (its connections may point at the
        dead broker) and asks again after a backoff, for at most ``RIDE_THROUGH_SECONDS``;
        then, or for a failure no broker change cures, the failure itself is raised.
        ListTransactions asks every broker and failed outright while one was down."""
        retry = Retry(time.monotonic())
        while True:
            try:
                return action()
            except Exception as error:
                self.close()
                delay = retry.next_delay(error, time.monotonic(), fenced=False)
                if delay is None:
                    raise
                logger.warning(
                    "2pc-kafka: %s failed (%s: %s); asking again in %.1f s",
                    what,
                    type(error).__name__,
                    " ".join(str(error).split())[:300],
                    delay,
                )
                time.sleep(delay)

    def _call(self, name: str, action: Callable[[], Result], batch_id: int) -> Result:
        """Run one broker call as ``kafka_sink.<name>`` (see
        ``eospack.core.faults``); an injected fault raises a connection error."""
        return faults.run_call(
            f"kafka_sink.{name}", action, error=kafka_errors.KafkaConnectionError, batch_id=batch_id
        )

    def find_decision(self, sink_id: str, batch_id: int) -> BatchDecision | None:
        return self._with_ledger(sink_id, lambda ledger: ledger.slots.get(batch_id))

    def record_decision(self, decision: BatchDecision) -> BatchDecision:
        """Decide the batch unless its slot says otherwise. On a retry (an earlier attempt
        failed, perhaps after it applied) the freshly read slot is compared first; only if
        it is still undecided are the pieces checked alive again before writing: a ride
        through a broker loss may have lasted long enough for a piece to time out, and a
        decision naming a dead piece would be a batch lost instead of replayed."""
        retried_before = self.retried_ledger_steps

        def record(ledger: Ledger) -> BatchDecision:
            slot = ledger.slots.get(decision.batch_id)
            if slot is not None and not slot.accepts(decision):
                return slot
            if not ledger.slots:
                legacy = self._legacy_slot(decision)
                if legacy is not None:
                    return legacy
            if self.retried_ledger_steps > retried_before:
                # Any failed try of this step (a write, or opening the ledger: a ride-through
                # of minutes either way) may have outlived a piece: check them again.
                self.check_prepared(decision)
            decided = BatchDecision(decision.sink_id, decision.batch_id, decision.pieces)
            return self._call("decide", lambda: ledger.write(decided), decision.batch_id)

        return self._with_ledger(decision.sink_id, record)

    def _legacy_slot(self, decision: BatchDecision) -> BatchDecision | None:
        """The batch's decision under the sink id eospack derived before it followed the
        cluster id (from the bootstrap string as typed), for the first commit of a derived
        sink id: a query that crashed with its last batch decided by the older version
        must find that decision after the upgrade, not apply the batch again. Its other
        open transactions are fenced. None when there is none (or sinkId is given)."""
        queries = decision.query_ids()
        if self.options.sink_id is not None or len(queries) != 1:
            return None
        topic = self.options.topic or "(topic column)"
        legacy_id = derive_sink_id(
            next(iter(queries)), f"kafka://{self.options.bootstrap_servers}/{topic}"
        )
        if legacy_id == decision.sink_id:
            return None
        slot = read_slots_if_any(self.options, legacy_id).get(decision.batch_id)
        for transactional_id in open_transactions(self.config, sink_prefix(legacy_id)):
            if slot is None or transactional_id not in slot.transaction_ids():
                fence(self.config, transactional_id)
        return slot if slot is not None and slot.is_decided else None

    def fence(
        self, sink_id: str, batch_id: int, pieces: tuple[PreparedPiece, ...]
    ) -> BatchDecision:
        def fence_slot(ledger: Ledger) -> BatchDecision:
            slot = ledger.slots.get(batch_id)
            if slot is not None and slot.is_decided:
                return slot
            target = (
                BatchDecision(sink_id, batch_id, pieces, ABORTED)
                if slot is None
                else slot.fenced_with(pieces)
            )
            return slot if target == slot else ledger.write(target)

        return self._with_ledger(sink_id, fence_slot)

    def mark_done(self, decision: BatchDecision) -> None:
        self._with_ledger(
            decision.sink_id,
            lambda ledger: self._call(
                "mark_done", lambda: ledger.mark_done(decision), decision.batch_id
            ),
        )

    def check_prepared(self, decision: BatchDecision) -> None:
        """Every task transaction still open under the epoch that prepared it, asked just
        before the decision (DescribeTransactions). The window between this answer and the
        commits is milliseconds against a timeout of seconds to minutes; a transaction that
        dies inside it still fails the restart loudly (``DecidedPieceLostError``)."""
        prepared = [
            PreparedTransaction.from_json(piece.handle)
            for piece in decision.pieces
            if "transactional_id" in piece.handle
        ]
        lost = self._call(
            "check_prepared",
            lambda: self._riding_through(
                "checking the prepared transactions",
                lambda: lost_transactions(self.config, prepared, self.admin()),
            ),
            decision.batch_id,
        )
        if lost:
            names = ", ".join(transaction.transactional_id for transaction in lost)
            raise PreparedTransactionLostError(
                f"2pc-kafka batch {decision.batch_id} of sink {decision.sink_id} is not"
                f" committed: the transactions of {len(lost)} of its tasks ended before the"
                f" decision ({names}), most likely open longer than"
                f" kafka.transaction.timeout.ms={self.options.transaction_timeout_ms}; the"
                " batch is rolled back and replayed when the query restarts: raise"
                " kafka.transaction.timeout.ms or make batches smaller (maxOffsetsPerTrigger)"
            )

    def commit_piece(self, piece: PreparedPiece) -> None:
        if "transactional_id" not in piece.handle:
            return  # listed by the broker, not named by a decision: nothing known to commit
        prepared = PreparedTransaction.from_json(piece.handle)
        try:
            self._call(
                "commit_piece",
                lambda: commit_prepared(self.config, prepared, self.admin()),
                piece.batch_id,
            )
        except TransactionFencedError as error:
            raise DecidedPieceLostError(
                f"2pc-kafka batch {piece.batch_id} of sink {piece.sink_id}: {error}; its"
                f" {piece.rows} records are lost (raise kafka.transaction.timeout.ms, and"
                " restart crashed queries sooner)"
            ) from None

    def commit_pieces(self, pieces: Sequence[PreparedPiece]) -> None:
        """Every piece's EndTxn at once over the one admin client
        (``transactions.commit_prepared_together``): one round trip for the batch instead
        of one per piece. While a test arms a ``kafka_sink.commit_piece`` fault, piece by
        piece, so the fault fires where the test expects it. Every piece
        is tried; then the first lost piece is raised as ``DecidedPieceLostError``, else
        the first other failure (committing again is idempotent: abort's roll-forward or
        the next run finishes the rest)."""
        named = [piece for piece in pieces if "transactional_id" in piece.handle]
        if len(named) < 2 or faults.is_armed("kafka_sink.commit_piece"):
            for piece in named:
                self.commit_piece(piece)
            return
        prepared = [PreparedTransaction.from_json(piece.handle) for piece in named]
        outcomes = commit_prepared_together(prepared, self.admin())
        failures = [
            (piece, error)
            for piece, error in zip(named, outcomes, strict=True)
            if error is not None
        ]
        for piece, error in failures:
            if isinstance(error, TransactionFencedError):
                raise DecidedPieceLostError(
                    f"2pc-kafka batch {piece.batch_id} of sink {piece.sink_id}: {error}; its"
                    f" {piece.rows} records are lost (raise kafka.transaction.timeout.ms, and"
                    " restart crashed queries sooner)"
                ) from None
        if failures:
            raise failures[0][1]

    def rollback_piece(self, piece: PreparedPiece) -> None:
        """Fence the piece's Kafka transactional id: the one its handle names (a pooled id,
        ``producer_pool``), else its name. Rolling back happens only at a batch's commit or
        abort, when no task of a later batch has begun under a pooled id."""
        self.rollback_transactional_id(kafka_name(piece))

    def rollback_transactional_id(self, transactional_id: str) -> None:
        """Fence ``transactional_id`` (InitProducerId aborts what it has open), riding through."""
        self._riding_through(
            f"fencing {transactional_id}", lambda: fence(self.config, transactional_id)
        )

    def roll_back_unattributed(self, sink_id: str, query_ids: Collection[str | None]) -> None:
        """Fence every open transaction under the pooled ids (``producer_pool``) of the
        sink and of ``query_ids`` that the last ``prepared_pieces`` listing saw (else
        listed now) and no slot names: leftovers of tasks whose commit message never
        reached a decision (a failed or zombie task, a crashed run of the query). Safe
        because recovery calls this only after finishing every unfinished decision, at a
        batch's commit or abort: a decision naming one of them would have committed it
        first, and no later one can (this run's next batches and any later run open ids of
        their own). Another query's ids are left alone: it may be running."""
        listed = self._pooled_open.pop(sink_id, None)
        if listed is None:
            self.prepared_pieces(sink_id)
            listed = self._pooled_open.pop(sink_id, [])
        for transactional_id in listed:
            if not is_pooled(transactional_id, sink_id, query_ids):
                continue
            self.rollback_transactional_id(transactional_id)
            logger.warning(
                "2pc-kafka recovery: rolled back the leftover transaction %s (named by no"
                " decision)",
                transactional_id,
            )

    def unfinished_decisions(self, sink_id: str) -> Iterable[BatchDecision]:
        """Exactly-once: from the sink's ledger, opened (which fences an earlier driver).
        At-least-once (the once-per-run recovery) only reads the ledger topic, if it exists:
        a sink that never ran exactly-once neither creates the topic nor needs the
        transactional ACL of a ledger; the ledger is opened only if there is work."""
        if not self.options.exactly_once:
            slots = read_slots_if_any(self.options, sink_id)
            return [slots[batch] for batch in sorted(slots) if slots[batch].status == DECIDED]

        def unfinished(ledger: Ledger) -> list[BatchDecision]:
            slots = ledger.slots
            return [slots[batch] for batch in sorted(slots) if slots[batch].status == DECIDED]

        return self._with_ledger(sink_id, unfinished)

    def prepared_pieces(self, sink_id: str) -> Iterable[PreparedPiece]:
        """The sink's open transactions as pieces. A per-attempt id carries its piece's
        name. A pooled id (``producer_pool``) carries none: its open transaction is the
        piece a ledger slot names with the same id, producer id and epoch
        (``_attributed``); one that no slot names is remembered for
        ``roll_back_unattributed`` (and ``leftovers``)."""
        pieces = []
        listed = self._riding_through(
            "listing the sink's open transactions",
            lambda: open_transactions(self.config, sink_prefix(sink_id)),
        )
        for transactional_id in listed:
            parsed = parse_transaction_id(transactional_id)
            if parsed is not None:
                sink, batch_id, partition_id, attempt = parsed
                pieces.append(PreparedPiece(sink, batch_id, partition_id, attempt, 0))
        pooled = [name for name in listed if is_pooled(name, sink_id)]
        attributed = self._attributed(sink_id, pooled) if pooled else {}
        pieces += attributed.values()
        self._pooled_open[sink_id] = [name for name in pooled if name not in attributed]
        return pieces

    def _attributed(self, sink_id: str, pooled: list[str]) -> dict[str, PreparedPiece]:
        """The pieces of the sink's slots whose transaction is the one open under a pooled
        id now (same producer id and epoch: the id served other batches before). The slots
        come from the process's open ledger during a commit, and are read without opening
        one otherwise (inspection, at-least-once runs)."""
        epochs = self._riding_through(
            "describing the sink's open transactions",
            lambda: open_epochs(self.admin(), pooled),
        )
        if self._read_only or not self.options.exactly_once:
            slots = read_slots_if_any(self.options, sink_id, fence_stuck=not self._read_only)
        else:
            slots = self._with_ledger(sink_id, lambda ledger: dict(ledger.slots))
        found = {}
        for slot in slots.values():
            for piece in slot.pieces:
                name = piece.handle.get("transactional_id")
                handle = (piece.handle.get("producer_id"), piece.handle.get("epoch"))
                if name in epochs and epochs[name] == handle:
                    found[str(name)] = piece
        return found

    def inspect(self, sink_id: str) -> SinkState:
        """Read only (``TransactionalResource.inspect``): the slots that attribute pooled
        transactions are read without opening the ledger, which would fence a running
        driver."""
        self._read_only = True
        try:
            return super().inspect(sink_id)
        finally:
            self._read_only = False
            self._pooled_open.pop(sink_id, None)  # never what a later recovery fences

    # Inspection (read only) ----------------------------------------------------------

    def describe_target(self) -> str:
        return f"{self.options.describe()}, ledger topic {self.options.ledger_topic}"

    def inspected_decisions(self, sink_id: str) -> list[DecisionState]:
        """Every slot of the sink in its ledger topic, read without opening a ledger (no
        InitProducerId: the running driver, if any, is not fenced) and without fencing a
        stuck ledger transaction (the read waits for the broker to abort it)."""
        slots = read_slots_if_any(self.options, sink_id, fence_stuck=False)
        return [DecisionState.of(slots[batch]) for batch in sorted(slots)]

    def leftovers(self, sink_id: str, prepared: list[PreparedPiece]) -> list[Leftover]:
        """The task transactions still open (ListTransactions) and the sink's own ledger
        transaction if one is open (a driver that died while writing a decision)."""
        ledger_id = f"{LEDGER_ID_PREFIX}{sink_id}"
        ledger_open = [
            transactional_id
            for transactional_id in open_transactions(self.config, ledger_id)
            if transactional_id == ledger_id
        ]
        tasks = sorted({kafka_name(piece) for piece in prepared})
        pooled = self._pooled_open.get(sink_id, [])
        return [Leftover("open Kafka transaction", name) for name in tasks + pooled + ledger_open]

    def close(self) -> None:
        """The shared ledgers stay open for the next commit of this process."""
        if self._admin is not None:
            self._admin.close()
            self._admin = None


def kafka_name(piece: PreparedPiece) -> str:
    """The Kafka transactional id of a piece: the one its handle names (a pooled id), else
    its own name (pieces listed by name, and pieces of eospack before pooling)."""
    return str(piece.handle.get("transactional_id") or piece.transaction_id)


def inspect_sink(query_id: str, options: Mapping[str, str]) -> SinkState:
    """The state of the 2pc-kafka sink that a query of ``query_id`` writes with ``options``
    (``kafka.bootstrap.servers``, ``topic``, optional ``ledgerTopic``, ``sinkId``,
    ``kafka.*`` client settings), its id derived as the sink derives it (from the cluster's
    id: the cluster must be up). Read only (``TransactionalResource.inspect``)."""
    sink_id = derived_sink_id(query_id, options)
    resource = KafkaResource(parse_options(options))
    try:
        return resource.inspect(sink_id)
    finally:
        resource.close()
