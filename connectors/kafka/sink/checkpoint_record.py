"""What a restart of a 2pc-kafka query must find, kept in the query's checkpoint.

The decisions of 2pc-kafka live in the ledger topic (``ledgerTopic``) under the sink's id
(``sinkId``, or derived from the query id and the target: the cluster and the ``topic``
option). A restart that names another ledger topic, or gives the sink another identity
(adds, drops or changes ``sinkId``, moves the topic from the option into a column, points
at another cluster), would not find the last decision and could apply a batch committed
just before a crash again. So the driver records the ledger topic and the identity at
query start in ``<checkpoint>/eospack/2pc-kafka.json`` (written atomically: a temporary file
renamed into place) and every later start, in either delivery mode, compares: a change is
refused before any data moves, in one line naming the option and the fix.

Written only by an exactly-once run (an at-least-once run decides nothing), checked by
both (an at-least-once run recovers what an exactly-once one left, from the same ledger).

Limits: the record is kept only when the query gives ``checkpointLocation`` as an option
(Spark hands it to the sink lower-cased; one set through
``spark.sql.streaming.checkpointLocation`` does not reach the sink) and it is an absolute
local path or a ``file:`` URI (read and written through ``eospack.core.checkpoint_files``). A
checkpoint on a Hadoop file system (``s3a:``, ``abfss:``, ``gs:``, ``hdfs:``, ``dbfs:``) or
a relative path is skipped with one info log per process: Spark calls the sink's
``streamWriter`` in a Python planner process, which has no JVM to reach Hadoop's file
systems through (and eospack opens no second client to the store). There, keep
``ledgerTopic`` and ``sinkId`` as they were, since a change is not detected. Recovery does
not depend on the record: the sink id derives from the query id Spark hands every task.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from eospack.core.checkpoint_files import LocalFiles

from ..errors import KafkaSinkOptionError
from .options import KafkaSinkOptions

logger = logging.getLogger(__name__)

RECORD_PATH = ("eospack", "2pc-kafka.json")
"""The record's path below the checkpoint directory."""
RECORD_VERSION = 2
"""Version 1 records hold the ledger topic only; the identity is added at the next start."""

_skipped_logged = False


def record_path(checkpoint_location: str | None) -> Path | None:
    """Where the record of this checkpoint lives, or None when it cannot be kept here (no
    checkpoint option, another file system, a relative path)."""
    if not checkpoint_location:
        return None
    location = checkpoint_location
    if "://" in location or location.startswith("file:"):
        parsed = urlparse(location)
        if parsed.scheme != "file" or parsed.netloc not in ("", "localhost"):
            return None
        location = unquote(parsed.path)
    if not os.path.isabs(location):
        return None
    return Path(location).joinpath(*RECORD_PATH)


def check_against_record(options: KafkaSinkOptions) -> None:
    """Refuse a ``ledgerTopic`` or a sink identity other than the ones this query's earlier
    runs recorded; record them at an exactly-once start. Called by the driver's planner
    before any data moves, with ``options.cluster_id`` resolved (it is part of the target)."""
    path = record_path(options.checkpoint_location)
    if path is None:
        _log_skipped_once(options.checkpoint_location)
        return
    identity = {"sink_id": options.sink_id, "target": options.target}
    recorded = read_record(path)
    if recorded is None or "identity" not in recorded:
        if options.exactly_once:
            ledger_topic = (recorded or {}).get("ledger_topic", options.ledger_topic)
            record = {"version": RECORD_VERSION, "ledger_topic": ledger_topic}
            write_record(path, {**record, "identity": identity})
        if recorded is None:
            return
    earlier = recorded.get("ledger_topic")
    if isinstance(earlier, str) and earlier != options.ledger_topic:
        raise KafkaSinkOptionError(
            f"Option ledgerTopic is {options.ledger_topic!r}: this query's earlier runs kept"
            f" their decisions in {earlier!r} (recorded in {path}), so this run could apply"
            f" a batch again: set ledgerTopic={earlier} (or start a new query with a new"
            " checkpoint)"
        )
    earlier_identity = recorded.get("identity")
    if isinstance(earlier_identity, dict) and earlier_identity != identity:
        raise KafkaSinkOptionError(
            f"Option sinkId is {options.sink_id or '(unset)'!r} and the target"
            f" {options.target}: this query's earlier runs wrote as sinkId"
            f" {earlier_identity.get('sink_id') or '(unset)'!r} to"
            f" {earlier_identity.get('target')} (recorded in {path}), and another sink"
            " identity could apply a batch again: keep sinkId, the topic option and the"
            " cluster as they were (or start a new query with a new checkpoint)"
        )


def read_record(path: Path) -> dict[str, Any] | None:
    """The record at ``path``, or None when there is none. An unreadable record is an
    error: guessing could let a changed ledgerTopic through."""
    text = LocalFiles(path.parent).read_text(path.name)
    if text is None:
        return None
    try:
        record = json.loads(text)
    except ValueError:
        record = None
    if not isinstance(record, dict):
        raise KafkaSinkOptionError(
            f"2pc-kafka cannot read its record {path} in the checkpoint (not a JSON object):"
            " restore it from a backup of the checkpoint, or write"
            ' {"version": 1, "ledger_topic": "<the ledgerTopic of earlier runs>"} into it'
        )
    return record


def write_record(path: Path, record: dict[str, Any]) -> None:
    """Write ``record`` atomically: a temporary file in the same directory, flushed to
    disk, then renamed over ``path`` (a reader sees the old record or the new, whole)."""
    LocalFiles(path.parent).write_text(path.name, json.dumps(record, separators=(",", ":")))


def _log_skipped_once(checkpoint_location: str | None) -> None:
    global _skipped_logged
    if _skipped_logged:
        return
    _skipped_logged = True
    where = (
        "no checkpointLocation option"
        if not checkpoint_location
        else "the checkpoint is on a Hadoop file system, out of reach of the sink's planner"
        " process, or a relative path"
    )
    logger.info(
        "2pc-kafka keeps no record of ledgerTopic in the checkpoint (%s): a restart with"
        " another ledgerTopic is not detected, so keep it unchanged",
        where,
    )
