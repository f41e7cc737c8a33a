"""Offsets a query has consumed, committed to a consumer group for Kafka's lag tools.

``commitOffsetsToGroup=<group id>`` on replayable-kafka: after Spark commits a batch, its end
offsets are committed to that group, so ``kafka-consumer-groups.sh --describe``, Burrow or a
platform's lag monitor show how far behind the query is. What is guaranteed:

- They are a copy for monitoring, never read back: Spark's checkpoint stays the only record
  of what a query consumed. Deleting the group or moving its offsets changes nothing.
- A commit never fails the query and never holds it longer than one request timeout
  (``kafka.request.timeout.ms``, default 10 s): a failure is logged once per kind, with the
  fix (an ACL, a group another consumer uses), and the next batch tries again.
- The commit is the simple, group-less one Spark's users know from Spark's own
  ``AdminClient.alterConsumerGroupOffsets``: OffsetCommit with generation -1 and no member
  id (kafka-python's public ``KafkaAdminClient.alter_group_offsets``), metadata
  ``COMMIT_METADATA``. The broker accepts it only while the group has no active member, so a
  group id that real consumers use is refused (logged) and theirs stays untouched.
- The client takes the source's own settings (servers, SASL/SSL, timeouts): the grant it
  needs is READ on the group (and READ on the topics, which the source already has).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

log = logging.getLogger(__name__)

COMMIT_METADATA = "eospack replayable-kafka"
"""The metadata of every committed offset: who wrote it (lag tools show it)."""


class GroupOffsetCommitter:
    """Commits end offsets to one consumer group, from the driver, on a worker thread.

    ``commit`` waits for the commit at most ``timeout_ms`` and never raises; while a commit
    is still in flight, a newer one is skipped (the one after carries later offsets)."""

    def __init__(self, group_id: str, config: Mapping[str, Any], timeout_ms: int) -> None:
        self.group_id = group_id
        self._config = dict(config)
        self._timeout_s = timeout_ms / 1000
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="eospack-group-offsets")
        self._admin: Any = None
        self._pending: Future[None] | None = None
        self._committed: dict[tuple[str, int], int] = {}
        self._logged: set[str] = set()
        self._lock = threading.Lock()

    def commit(self, offsets: Mapping[tuple[str, int], int]) -> bool:
        """Commit ``offsets`` (topic-partition to end offset); True when the broker took all.

        Offsets this committer already committed are not sent again."""
        wanted = {tp: offset for tp, offset in offsets.items() if self._committed.get(tp) != offset}
        if not wanted:
            return True
        if self._pending is not None and not self._pending.done():
            log.debug("group %s: previous offset commit still running, skipped", self.group_id)
            return False
        self._pending = self._executor.submit(self._commit, wanted)
        try:
            self._pending.result(timeout=self._timeout_s)
        except FutureTimeout:
            self._failed(
                "timeout",
                f"no answer within {self._timeout_s:g} s (kafka.request.timeout.ms): check that"
                " the group coordinator is reachable",
            )
            return False
        except Exception as error:  # never fail the query for a monitoring copy
            self._failed(type(error).__name__, _fix_for(error, self.group_id))
            return False
        return True

    def _commit(self, offsets: Mapping[tuple[str, int], int]) -> None:
        from kafka import KafkaAdminClient, TopicPartition
        from kafka.structs import OffsetAndMetadata

        if self._admin is None:
            settings = KafkaAdminClient.DEFAULT_CONFIG
            self._admin = KafkaAdminClient(
                **{key: value for key, value in self._config.items() if key in settings}
            )
        request = {
            TopicPartition(topic, partition): OffsetAndMetadata(offset, COMMIT_METADATA, None)
            for (topic, partition), offset in offsets.items()
        }
        results = self._retrying(lambda: self._admin.alter_group_offsets(self.group_id, request))
        refused = {tp: error for tp, error in results.items() if error.errno != 0}
        with self._lock:
            for tp, offset in offsets.items():
                if TopicPartition(*tp) not in refused:
                    self._committed[tp] = offset
        if refused:
            raise next(iter(refused.values()))()

    def _retrying(self, call: Callable[[], Any]) -> Any:
        """``call()``, again after a retriable error (the coordinator is loading, moved, or
        being created: a broker's first group request creates __consumer_offsets) while
        the deadline allows."""
        from kafka.errors import RetriableError

        deadline = time.monotonic() + self._timeout_s * 0.8
        backoff = 0.05
        while True:
            try:
                return call()
            except RetriableError:
                if time.monotonic() + backoff > deadline:
                    raise
            time.sleep(backoff)  # a retry's backoff, not a wait for another thread
            backoff = min(backoff * 2, 1.0)

    def _failed(self, kind: str, message: str) -> None:
        text = f"Could not commit offsets to consumer group {self.group_id} ({kind}): {message}"
        if kind in self._logged:
            log.debug("%s", text)
            return
        self._logged.add(kind)
        log.warning("%s. The query goes on; its checkpoint is unaffected.", text)

    def close(self) -> None:
        admin = self._admin
        if admin is not None:
            self._executor.submit(admin.close)
        self._executor.shutdown(wait=False)


def _fix_for(error: BaseException, group_id: str) -> str:
    from kafka import errors as kafka_errors

    if isinstance(error, kafka_errors.GroupAuthorizationFailedError):
        return (
            f"grant the query's principal READ on group {group_id} (kafka-acls.sh --add"
            f" --allow-principal User:<user> --operation Read --group {group_id})"
        )
    if isinstance(error, kafka_errors.TopicAuthorizationFailedError):
        return "grant the query's principal READ on the topics it reads"
    if isinstance(
        error,
        (
            kafka_errors.UnknownMemberIdError,
            kafka_errors.IllegalGenerationError,
            kafka_errors.RebalanceInProgressError,
        ),
    ):
        return (
            f"group {group_id} has active members (other consumers use it): give"
            " commitOffsetsToGroup a group id of its own"
        )
    return f"{error}"
