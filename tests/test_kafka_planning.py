"""replayable-kafka planning without Spark or a broker: the self-describing offsets Spark logs,
how the next batch is planned from them (new, missing, gone and re-created partitions), and
that a replayed batch is planned from its logged offset alone.

The cluster is a fake with ``spec_set``: only KafkaMetadata's real methods exist, and every
call to the "broker" is recorded, so a test can assert that a replay asks it nothing.
"""

from __future__ import annotations

import json
import logging
import uuid

import pytest
from kafka.errors import KafkaConnectionError, KafkaTimeoutError

from eospack.connectors.kafka.client import broker_calls
from eospack.connectors.kafka.errors import KafkaDataLossError
from eospack.connectors.kafka.source.broker_metadata import ClusterView
from eospack.connectors.kafka.source.data_source import (
    ReadAllAvailable,
    ReadMaxRows,
    ReadMinRows,
    ReplayableKafkaStreamReader,
)
from eospack.connectors.kafka.source.offset_format import (
    BatchOffsets,
    offsets_from_json,
    topic_id_text,
)
from eospack.connectors.kafka.source.offset_ranges import OffsetRange
from eospack.connectors.kafka.source.options import parse_options
from eospack.connectors.kafka.source.planning import plan_next_batch
from eospack.core import faults
from tests.fake_kafka_cluster import FakeCluster, TopicPartitionKey, options, stream_reader

ID_A = "AAAAAAAAAAAAAAAAAAAAAQ"
ID_B = "AAAAAAAAAAAAAAAAAAAAAg"


def ranges_of(reader: ReplayableKafkaStreamReader, start: dict, end: dict) -> list[OffsetRange]:
    """Every planned range, in partition order (small ones share partitions)."""
    partitions = reader.partitions(start, end)
    return [r for p in partitions for r in p.offset_ranges]  # type: ignore[attr-defined]


def round_trip(offsets: dict) -> dict:
    """What Spark hands back: the JSON it logged, parsed again."""
    return json.loads(json.dumps(offsets))


# The offset format ---------------------------------------------------------------------------


def test_logged_offsets_keep_sparks_shape_and_describe_their_starts() -> None:
    batch = BatchOffsets(
        ends={("t", 1): 40, ("t", 0): 23, ("u", 0): 7},
        starts={("t", 0): 20, ("t", 1): 40, ("u", 0): 0},
        topic_ids={"u": ID_B, "t": ID_A},
    )
    logged = batch.to_json()
    assert json.dumps(logged) == json.dumps(
        {
            "t": {"0": 23, "1": 40},
            "u": {"0": 7},
            "@starts": {"t": {"0": 20}, "u": {"0": 0}},
            "@topicIds": {"t": ID_A, "u": ID_B},
        }
    )
    # Spark's Kafka shape reads back, reserved keys aside.
    assert offsets_from_json(logged) == {("t", 0): 23, ("t", 1): 40, ("u", 0): 7}
    again = BatchOffsets.from_json(round_trip(logged))
    assert again.ranges() == [
        OffsetRange("t", 0, 20, 23),
        OffsetRange("t", 1, 40, 40),
        OffsetRange("u", 0, 0, 7),
    ]
    assert again.to_json() == logged


def test_offsets_of_earlier_versions_have_no_starts() -> None:
    old = BatchOffsets.from_json({"t": {"0": 5}})
    assert old.starts is None and old.topic_ids == {}
    assert old.ends == {("t", 0): 5}


def test_topic_ids_are_shown_as_kafka_shows_them() -> None:
    assert topic_id_text(uuid.UUID("cd514e6f-df43-450a-9209-ee32b3375e9f")) == (
        "zVFOb99DRQqSCe4yszdenw"  # org.apache.kafka.common.Uuid.toString()
    )
    assert topic_id_text(uuid.UUID(int=0)) is None
    assert topic_id_text(None) is None


# Planning the next batch ---------------------------------------------------------------------


def view(partitions: list[TopicPartitionKey], ids: dict[str, str | None]) -> ClusterView:
    return ClusterView(tuple(partitions), frozenset(ids), ids)


def no_earliest(tps: list[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
    raise AssertionError(f"earliest offsets of {tps} were looked up")


def test_continuing_partitions_start_where_the_last_batch_ended() -> None:
    previous = BatchOffsets({("t", 0): 5, ("t", 1): 9}, {}, {"t": ID_A})
    plan = plan_next_batch(
        previous,
        view([("t", 0), ("t", 1)], {"t": ID_A}),
        {("t", 0): 8, ("t", 1): 9},
        no_earliest,
        fail_on_data_loss=True,
    )
    assert plan.begins == {("t", 0): 5, ("t", 1): 9}
    assert plan.limits == {("t", 0): 8, ("t", 1): 9}
    assert plan.topic_ids == {"t": ID_A}


def test_a_new_partition_starts_at_its_earliest_offset_fixed_at_planning() -> None:
    previous = BatchOffsets({("t", 0): 5}, {}, {"t": ID_A})
    asked: list[list[TopicPartitionKey]] = []

    def earliest_of(tps: list[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
        asked.append(tps)
        return dict.fromkeys(tps, 0)

    plan = plan_next_batch(
        previous,
        view([("t", 0), ("t", 1)], {"t": ID_A}),
        {("t", 0): 5, ("t", 1): 4},
        earliest_of,
        fail_on_data_loss=True,
    )
    assert asked == [[("t", 1)]]
    assert plan.begins == {("t", 0): 5, ("t", 1): 0}
    logged = BatchOffsets(plan.limits, plan.begins, plan.topic_ids).to_json()
    assert logged["@starts"] == {"t": {"1": 0}}


def test_a_new_partition_starting_above_zero_is_data_loss_as_in_spark(
    caplog: pytest.LogCaptureFixture,
) -> None:
    previous = BatchOffsets({("t", 0): 5}, {}, {"t": ID_A})
    arguments = (
        previous,
        view([("t", 0), ("t", 1)], {"t": ID_A}),
        {("t", 0): 5, ("t", 1): 9},
        lambda tps: dict.fromkeys(tps, 4),
    )
    with pytest.raises(KafkaDataLossError) as raised:
        plan_next_batch(*arguments, fail_on_data_loss=True)
    assert str(raised.value) == (
        "Added partition t-1 starts from 4 instead of 0. Some data may have been missed."
        " If this is expected (e.g. a deleted topic or retention), set the option"
        " failOnDataLoss=false to skip the lost offsets and continue"
    )
    with caplog.at_level(logging.WARNING):
        plan = plan_next_batch(*arguments, fail_on_data_loss=False)
    assert plan.begins[("t", 1)] == 4
    assert "Added partition t-1 starts from 4 instead of 0" in caplog.text
    assert "skipped 4 offsets" in caplog.text


def test_a_partition_missing_from_metadata_is_carried_forward() -> None:
    previous = BatchOffsets({("t", 0): 5, ("t", 1): 9}, {}, {"t": ID_A})
    plan = plan_next_batch(
        previous,
        view([("t", 0)], {"t": ID_A}),
        {("t", 0): 7},
        no_earliest,
        fail_on_data_loss=True,
    )
    assert plan.begins == {("t", 0): 5, ("t", 1): 9}
    assert plan.limits == {("t", 0): 7, ("t", 1): 9}


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_partitions_of_a_topic_the_cluster_no_longer_lists_are_gone(
    fail_on_data_loss: bool, caplog: pytest.LogCaptureFixture
) -> None:
    previous = BatchOffsets({("t", 0): 5, ("gone", 0): 4}, {}, {"t": ID_A, "gone": ID_B})
    arguments = (previous, view([("t", 0)], {"t": ID_A}), {("t", 0): 6}, no_earliest)
    if fail_on_data_loss:
        with pytest.raises(KafkaDataLossError, match=r"gone-0 \(at offset 4\) are gone"):
            plan_next_batch(*arguments, fail_on_data_loss=True)
        return
    with caplog.at_level(logging.WARNING):
        plan = plan_next_batch(*arguments, fail_on_data_loss=False)
    assert plan.limits == {("t", 0): 6}
    assert plan.topic_ids == {"t": ID_A}
    assert "gone-0 (at offset 4) are gone" in caplog.text


def test_a_recreated_topic_is_detected_by_its_id_even_when_offsets_grew(
    caplog: pytest.LogCaptureFixture,
) -> None:
    previous = BatchOffsets({("t", 0): 5, ("t", 1): 3}, {}, {"t": ID_A})
    # The new topic has one partition, and more records than the old one had.
    arguments = (
        previous,
        view([("t", 0)], {"t": ID_B}),
        {("t", 0): 12},
        lambda tps: dict.fromkeys(tps, 0),
    )
    with pytest.raises(KafkaDataLossError) as raised:
        plan_next_batch(*arguments, fail_on_data_loss=True)
    assert str(raised.value).startswith(
        f"Topic t was deleted and re-created: its topic id changed from {ID_A} to {ID_B}"
        " (the query had read t-0 to offset 5, t-1 to offset 3), so records of the old topic"
        " may have been missed. If this is expected"
    )
    with caplog.at_level(logging.WARNING):
        plan = plan_next_batch(*arguments, fail_on_data_loss=False)
    assert plan.begins == {("t", 0): 0}
    assert plan.limits == {("t", 0): 12}
    assert plan.topic_ids == {"t": ID_B}
    assert caplog.text.count("re-created") == 1
    assert "failOnDataLoss=false" in caplog.text


def test_without_topic_ids_a_recreated_topic_shows_as_offsets_going_back() -> None:
    previous = BatchOffsets({("t", 0): 10}, {}, {})
    arguments = (previous, view([("t", 0)], {"t": None}), {("t", 0): 3})
    with pytest.raises(KafkaDataLossError, match="t-0 went back from offset 10 to 3"):
        plan_next_batch(*arguments, lambda tps: dict.fromkeys(tps, 0), fail_on_data_loss=True)
    plan = plan_next_batch(*arguments, lambda tps: dict.fromkeys(tps, 0), fail_on_data_loss=False)
    assert plan.begins == {("t", 0): 0} and plan.limits == {("t", 0): 3}
    assert plan.topic_ids == {}


# The stream reader on a fake cluster ---------------------------------------------------------


def test_batch_zero_replays_the_logged_ranges_whatever_initial_offset_says_now() -> None:
    cluster = FakeCluster({"t": (ID_A, {0: (0, 10), 1: (0, 4)})})
    first_run = stream_reader(cluster)  # startingOffsets=latest
    initial = round_trip(first_run.initialOffset())
    assert initial == {"t": {"0": 10, "1": 4}, "@starts": {}, "@topicIds": {"t": ID_A}}
    cluster.topics["t"] = (ID_A, {0: (0, 15), 1: (0, 4)})
    logged_end = round_trip(first_run.latestOffset(initial, ReadAllAvailable()))
    assert logged_end == {
        "t": {"0": 15, "1": 4},
        "@starts": {"t": {"0": 10}},
        "@topicIds": {"t": ID_A},
    }
    planned = ranges_of(first_run, initial, logged_end)
    assert planned == [OffsetRange("t", 0, 10, 15)]

    # The query dies before batch 0 commits; records arrive; Spark restarts it and replays
    # batch 0 from a fresh initialOffset(), now beyond the logged end.
    cluster.topics["t"] = (ID_A, {0: (0, 30), 1: (0, 9)})
    restarted = stream_reader(cluster)
    fresh_initial = round_trip(restarted.initialOffset())
    assert fresh_initial["t"] == {"0": 30, "1": 9}
    cluster.calls.clear()
    assert ranges_of(restarted, fresh_initial, logged_end) == planned
    assert cluster.calls == ["metadata"]  # topic ids only: no offset is looked up again


def test_a_replay_never_looks_up_a_new_partitions_earliest_offset_again() -> None:
    cluster = FakeCluster({"t": (ID_A, {0: (0, 5)})})
    reader = stream_reader(cluster, startingOffsets="earliest")
    start = round_trip(reader.initialOffset())
    cluster.topics["t"] = (ID_A, {0: (0, 5), 1: (0, 6)})  # CreatePartitions, 6 records
    end = round_trip(reader.latestOffset(start, ReadAllAvailable()))
    assert ranges_of(reader, start, end) == [
        OffsetRange("t", 0, 0, 5),
        OffsetRange("t", 1, 0, 6),
    ]
    cluster.topics["t"] = (ID_A, {0: (0, 5), 1: (4, 6)})  # DeleteRecords before 4
    cluster.calls.clear()
    replayed = ranges_of(stream_reader(cluster), start, end)
    assert replayed[1] == OffsetRange("t", 1, 0, 6)  # the reader reports the loss
    assert cluster.calls == ["metadata"]


def test_the_batch_just_planned_is_not_checked_again() -> None:
    cluster = FakeCluster({"t": (ID_A, {0: (0, 5)})})
    reader = stream_reader(cluster, startingOffsets="earliest")
    start = round_trip(reader.initialOffset())
    end = round_trip(reader.latestOffset(start, ReadAllAvailable()))
    cluster.calls.clear()
    assert ranges_of(reader, start, end) == [OffsetRange("t", 0, 0, 5)]
    assert cluster.calls == []


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_replay_after_the_topic_was_recreated_never_reads_the_new_topic(
    fail_on_data_loss: bool, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = FakeCluster({"t": (ID_A, {0: (0, 5)}), "u": (ID_A, {0: (0, 3)})})
    subscribe = {"subscribe": "t,u", "failOnDataLoss": str(fail_on_data_loss).lower()}
    reader = stream_reader(cluster, startingOffsets="earliest", **subscribe)
    start = round_trip(reader.initialOffset())
    end = round_trip(reader.latestOffset(start, ReadAllAvailable()))
    cluster.topics["t"] = (ID_B, {0: (0, 9)})  # deleted and re-created before the replay
    restarted = stream_reader(cluster, **subscribe)
    if fail_on_data_loss:
        with pytest.raises(KafkaDataLossError) as raised:
            ranges_of(restarted, start, end)
        assert str(raised.value).startswith(
            "Cannot replay t-0 [0, 5): topic t was deleted and re-created after the batch was"
            f" planned (topic id {ID_A} is now {ID_B}), so these records are lost. If this is"
            " expected"
        )
        return
    with caplog.at_level(logging.WARNING):
        assert ranges_of(restarted, start, end) == [OffsetRange("u", 0, 0, 3)]
    assert "topic t was deleted and re-created" in caplog.text


def test_an_available_now_start_asks_for_metadata_once() -> None:
    """Spark calls prepareForTriggerAvailableNow and then initialOffset twice (to plan batch 0
    and to read its ranges), milliseconds apart: one metadata answer serves them all (every
    kafka-python metadata refresh within 100 ms of the previous one waits out its backoff)."""
    cluster = FakeCluster({"t": (ID_A, {0: (2, 5)})})
    reader = stream_reader(cluster, startingOffsets="earliest")
    reader.prepareForTriggerAvailableNow()
    start = round_trip(reader.initialOffset())
    end = round_trip(reader.latestOffset(start, ReadAllAvailable()))
    assert round_trip(reader.initialOffset()) == start
    assert ranges_of(reader, start, end) == [OffsetRange("t", 0, 2, 5)]
    assert cluster.calls == ["metadata", "latest", "earliest [('t', 0)]"]


def test_the_initial_offset_is_resolved_once_per_query() -> None:
    cluster = FakeCluster({"t": (ID_A, {0: (0, 5)})})
    reader = stream_reader(cluster)  # startingOffsets=latest
    first = round_trip(reader.initialOffset())
    cluster.topics["t"] = (ID_A, {0: (0, 9)})
    assert first == {"t": {"0": 5}, "@starts": {}, "@topicIds": {"t": ID_A}}
    assert round_trip(reader.initialOffset()) == first
    assert cluster.calls == ["metadata", "latest"]


def test_available_now_never_stops_behind_the_initial_offset() -> None:
    cluster = FakeCluster({"t": (ID_A, {0: (0, 5)})})
    reader = stream_reader(cluster)  # startingOffsets=latest, resolved after the target
    reader.prepareForTriggerAvailableNow()
    cluster.topics["t"] = (ID_A, {0: (0, 8)})
    start = round_trip(reader.initialOffset())
    assert start["t"] == {"0": 8}
    end = round_trip(reader.latestOffset(start, ReadAllAvailable()))
    assert end["t"] == {"0": 8} and ranges_of(reader, start, end) == []


def test_nothing_new_returns_the_start_itself() -> None:
    cluster = FakeCluster({"t": (ID_A, {0: (0, 10)})})
    reader = stream_reader(cluster, startingOffsets="earliest")
    start = round_trip(reader.initialOffset())
    end = round_trip(reader.latestOffset(start, ReadAllAvailable()))
    assert end != start
    again = reader.latestOffset(end, ReadAllAvailable())
    assert again is end
    # An offset logged by an earlier version, with nothing new, is kept as it is too.
    old = {"t": {"0": 10}}
    assert reader.latestOffset(old, ReadAllAvailable()) is old
    assert reader.latestOffset(old, ReadMaxRows(3)) is old


def test_rate_limited_batches_log_their_starts_and_replay_them() -> None:
    cluster = FakeCluster({"t": (ID_A, {0: (0, 100), 1: (0, 50)})})
    reader = stream_reader(cluster, startingOffsets="earliest", maxOffsetsPerTrigger="30")
    start = round_trip(reader.initialOffset())
    ends = []
    for _ in range(3):
        end = round_trip(reader.latestOffset(start, ReadMaxRows(30)))
        ends.append((start, end))
        start = end
    sizes = [sum(r.size for r in ranges_of(reader, s, e)) for s, e in ends]
    assert sizes == [30, 30, 30]
    assert ends[2][1]["@starts"] == {"t": {"0": 40, "1": 20}}
    # Each batch replays from its own offset, whatever start Spark passes.
    for _, end in ends:
        assert ranges_of(reader, {}, end) == ranges_of(reader, start, end)


def test_min_offsets_per_trigger_waits_by_returning_the_start() -> None:
    cluster = FakeCluster({"t": (ID_A, {0: (0, 10)})})
    reader = stream_reader(cluster, startingOffsets="earliest", minOffsetsPerTrigger="50")
    start = round_trip(reader.initialOffset())
    first = round_trip(reader.latestOffset(start, ReadMinRows(50)))  # the first trigger runs
    assert first["t"] == {"0": 10}
    cluster.topics["t"] = (ID_A, {0: (0, 20)})
    assert reader.latestOffset(first, ReadMinRows(50)) is first


def test_offsets_logged_by_an_earlier_version_replay_as_they_did() -> None:
    cluster = FakeCluster({"t": (ID_A, {0: (0, 10), 1: (2, 8)})})
    reader = stream_reader(cluster)
    # No "@starts": a new partition starts at its earliest offset looked up now.
    assert ranges_of(reader, {"t": {"0": 4}}, {"t": {"0": 10, "1": 8}}) == [
        OffsetRange("t", 0, 4, 10),
        OffsetRange("t", 1, 2, 8),
    ]
    # With nothing new the old offset stays; the next batch is planned in the new format.
    old = {"t": {"0": 10, "1": 8}}
    assert reader.latestOffset(old, ReadAllAvailable()) is old
    cluster.topics["t"] = (ID_A, {0: (0, 12), 1: (2, 8)})
    assert reader.latestOffset(old, ReadAllAvailable()) == {
        "t": {"0": 12, "1": 8},
        "@starts": {"t": {"0": 10}},
        "@topicIds": {"t": ID_A},
    }


def test_a_topic_missing_from_one_metadata_answer_is_asked_for_again() -> None:
    cluster = FakeCluster({"t": (ID_A, {0: (0, 10)})}, unlisted={"t"}, unlisted_answers=1)
    reader = stream_reader(cluster)
    previous = {"t": {"0": 10}, "@starts": {}, "@topicIds": {"t": ID_A}}
    # The first answer lacks the topic, the second lists it: carried forward, no loss.
    assert reader.latestOffset(previous, ReadAllAvailable()) is previous
    assert cluster.calls.count("metadata") == 2
    cluster.unlisted_answers = 2
    with pytest.raises(KafkaDataLossError, match=r"t-0 \(at offset 10\) are gone"):
        reader.latestOffset(previous, ReadAllAvailable())


def test_a_partition_hidden_for_a_moment_keeps_its_offset() -> None:
    cluster = FakeCluster({"t": (ID_A, {0: (0, 10), 1: (0, 7)})}, hidden={("t", 1)})
    reader = stream_reader(cluster, startingOffsets="earliest")
    previous = {"t": {"0": 4, "1": 7}, "@starts": {}, "@topicIds": {"t": ID_A}}
    end = round_trip(reader.latestOffset(previous, ReadAllAvailable()))
    assert end["t"] == {"0": 10, "1": 7}
    cluster.hidden.clear()
    cluster.topics["t"] = (ID_A, {0: (0, 10), 1: (0, 9)})
    after = round_trip(reader.latestOffset(end, ReadAllAvailable()))
    assert ranges_of(reader, end, after) == [OffsetRange("t", 1, 7, 9)]


# Call faults on the driver -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "error"),
    [
        ("before", KafkaConnectionError),
        ("after", KafkaConnectionError),
        ("stall", KafkaTimeoutError),
    ],
)
def test_armed_faults_become_kafka_pythons_own_errors(
    mode: str, error: type[Exception], tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(faults, "_DIRECTORY", str(tmp_path))
    faults.arm(tmp_path, "kafka.end_offsets", mode)  # type: ignore[arg-type]
    applied: list[int] = []
    with pytest.raises(error, match=f"injected fault: kafka.end_offsets {mode}"):
        broker_calls.broker_call("kafka.end_offsets", lambda: applied.append(1))
    assert applied == ([1] if mode == "after" else [])
    assert broker_calls.broker_call("kafka.end_offsets", lambda: 7) == 7  # fired once


def test_without_a_fault_directory_calls_never_look_for_faults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(faults, "_DIRECTORY", None)

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("faults.claim was called with faults off")

    monkeypatch.setattr(faults, "claim", refuse)
    assert broker_calls.broker_call("kafka.poll", lambda: 3) == 3


def test_partitions_no_longer_subscribed_are_left_out_not_lost() -> None:
    cluster = FakeCluster({"t": (ID_A, {0: (0, 10)}), "old": (ID_B, {0: (0, 4)})})
    reader = stream_reader(cluster)  # subscribe=t; the checkpoint also read "old"
    previous = {"t": {"0": 10}, "old": {"0": 4}, "@starts": {}, "@topicIds": {"t": ID_A}}
    end = reader.latestOffset(previous, ReadAllAvailable())
    assert end == {"t": {"0": 10}, "@starts": {}, "@topicIds": {"t": ID_A}}


def test_subscriptions_say_which_partitions_they_cover() -> None:
    assert options(subscribe="a,b").subscription.covers(("b", 3))
    assert not options(subscribe="a,b").subscription.covers(("c", 0))
    pattern = parse_options(
        {"kafka.bootstrap.servers": "broker:9092", "subscribepattern": "orders_.*"}
    ).subscription
    assert pattern.covers(("orders_eu", 0)) and not pattern.covers(("returns", 0))
    assign = parse_options(
        {"kafka.bootstrap.servers": "broker:9092", "assign": '{"t":[0,2]}'}
    ).subscription
    assert assign.covers(("t", 2)) and not assign.covers(("t", 1))


# Spark 4.0 and 4.1: latestOffset() without a start (no admission control) ------------------


def test_without_a_start_batch_zero_replays_the_ranges_it_planned() -> None:
    cluster = FakeCluster({"t": (ID_A, {0: (0, 10), 1: (0, 4)})})
    first_run = stream_reader(cluster)  # startingOffsets=latest
    cluster.topics["t"] = (ID_A, {0: (0, 15), 1: (0, 4)})
    logged_end = round_trip(first_run.latestOffset())  # Spark 4.0 asks before initialOffset
    initial = round_trip(first_run.initialOffset())
    assert initial["t"] == {"0": 15, "1": 4}  # resolved once, by the first latestOffset()
    assert logged_end == {
        "t": {"0": 15, "1": 4},
        "@startsIfInitial": {},
        "@topicIds": {"t": ID_A},
    }
    assert ranges_of(first_run, initial, logged_end) == []

    # Batch 0 never committed; records arrive; the restart replays it from a fresh, later
    # initialOffset(): still nothing, not a data loss error and not the new records.
    cluster.topics["t"] = (ID_A, {0: (0, 30), 1: (0, 9)})
    restarted = stream_reader(cluster)
    fresh_initial = round_trip(restarted.initialOffset())
    assert fresh_initial["t"] == {"0": 30, "1": 9}
    assert ranges_of(restarted, fresh_initial, logged_end) == []
    # The next batch, this process's first plan: its guess (from the fresh initial offset)
    # is recorded, but Spark's start (batch 0's end) is not that offset, so it is read from.
    next_end = round_trip(restarted.latestOffset())
    assert next_end == {"t": {"0": 30, "1": 9}, "@startsIfInitial": {}, "@topicIds": {"t": ID_A}}
    assert ranges_of(restarted, logged_end, next_end) == [
        OffsetRange("t", 0, 15, 30),
        OffsetRange("t", 1, 4, 9),
    ]


def test_without_a_start_a_restarts_first_batch_reads_from_sparks_start() -> None:
    """A restart whose batches all committed plans its first batch before it knows the
    start: the guess it records (from a fresh initial offset) is not used, Spark's is."""
    cluster = FakeCluster({"t": (ID_A, {0: (0, 50)})})
    restarted = stream_reader(cluster, startingOffsets="earliest")
    end = round_trip(restarted.latestOffset())
    assert end["@startsIfInitial"] == {"t": {"0": 0}}
    logged_start = {"t": {"0": 20}, "@topicIds": {"t": ID_A}}  # the last committed end
    assert ranges_of(restarted, logged_start, end) == [OffsetRange("t", 0, 20, 50)]
    assert ranges_of(stream_reader(cluster), logged_start, end) == [OffsetRange("t", 0, 20, 50)]
