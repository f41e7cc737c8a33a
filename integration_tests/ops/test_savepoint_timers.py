"""Per-key timers across a driver SIGKILL and through a savepoint: the savepoint contract's
timer cases (issue 41).

The driver (``drivers/timers_driver.py``) runs ``stateful_parts.countdown`` in a process
of its own and writes every batch attempt to a file; the sink of record keeps each batch
id's last attempt (an idempotent sink), which is what "exactly once" is checked on.
No-data batches are off there, so due timers wait for the next batch with rows: the
driver is SIGKILLed while timers are registered and due, restarted, killed again after
its sink wrote the firing batch and before Spark's commit log, and restarted once more.
The same killed checkpoint is savepointed and restored: its timers fire in the restored
query's first batch, once, with the times they were due at.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from eospack.cli import main
from eospack.lab.testing import session_settings
from eospack.stateful_ops import TIMER_COLUMN, OperatorDefinitionError, read_state
from eospack.tools.savepoint import RestoredCheckpoint
from integration_tests.crash_harness import DriverRun, run_driver
from integration_tests.stateful_parts import (
    NO_DATA_BATCHES,
    T0,
    Emitted,
    batch_timestamp_ms,
    countdown,
    run,
    source,
    with_watermark,
    write_batch,
)

pytestmark = pytest.mark.integration

DRIVER = Path(__file__).resolve().parents[1] / "drivers" / "timers_driver.py"
DRIVER_SECONDS = 300
DUE_S = 10
LATER_S = 600

Rows = list[tuple[Any, ...]]


def attempts(sink: Path) -> list[tuple[int, Rows]]:
    """Every batch attempt the driver's sink wrote, in the order written."""
    files = sorted(sink.glob("attempt-*.json"), key=lambda path: int(path.stem.split("-")[2]))
    return [
        (int(path.stem.split("-")[1]), sorted(map(tuple, json.loads(path.read_text())), key=repr))
        for path in files
    ]


def final(sink: Path) -> dict[int, Rows]:
    """What an idempotent sink holds: each batch id's last attempt."""
    return dict(attempts(sink))


def stored(spark: Any, checkpoint: Path) -> dict[str, tuple[int, int | None]]:
    """Key -> (count, timer in ms or None) in the checkpoint's last committed state."""
    state = read_state(spark, str(checkpoint))
    return {
        row["k"]: (int(row["count"]), None if row[TIMER_COLUMN] is None else int(row[TIMER_COLUMN]))
        for row in state.astype(object).where(state.notna(), None).to_dict("records")
    }


def rows(*keys_and_seconds: tuple[str, int]) -> list[dict[str, Any]]:
    return [{"k": key, "n": n, "v": 0.0, "t": T0} for key, n in keys_and_seconds]


def events(*keys_seconds_and_times: tuple[str, int, int]) -> list[dict[str, Any]]:
    """Rows (key, n, event time in seconds after ``T0``)."""
    return [{"k": key, "n": n, "v": 0.0, "t": T0 + t} for key, n, t in keys_seconds_and_times]


def drive(
    input_directory: Path,
    checkpoint: Path,
    sink: Path,
    trigger: str = "available-now",
    kind: str = "processing",
    **crash: Any,
) -> DriverRun:
    arguments = ["--input", str(input_directory), "--checkpoint", str(checkpoint)]
    arguments += ["--sink", str(sink), "--trigger", trigger, "--kind", kind]
    return run_driver(DRIVER, arguments, timeout=DRIVER_SECONDS, **crash)


@pytest.mark.chaos  # six driver JVMs, about 6 minutes; the default lane restarts timers in-session
@pytest.mark.timeout(1200)
def test_processing_time_timers_fire_once_after_a_driver_sigkill_and_through_a_savepoint(
    spark: Any, tmp_path: Path
) -> None:
    source, checkpoint, sink = tmp_path / "input", tmp_path / "checkpoint", tmp_path / "sink"
    source.mkdir()
    # Batch 0 (w, due much later) warms the Python workers up, so that batch 2 follows
    # batch 1 within seconds. Batch 1: x, y, c due DUE_S after it. Batch 2: c's timer
    # deleted before it was due, v due DUE_S after batch 2.
    write_batch(str(source), 0, rows(("w", LATER_S)))
    write_batch(str(source), 1, rows(("x", DUE_S), ("x", DUE_S), ("y", DUE_S), ("c", DUE_S)))
    write_batch(str(source), 2, rows(("c", 0), ("v", DUE_S)))

    def every_timer_due() -> bool:
        if not (checkpoint / "commits" / "2").is_file():
            return False
        return time.time() * 1000 > batch_timestamp_ms(checkpoint, 2) + DUE_S * 1000 + 500

    killed = drive(source, checkpoint, sink, "interval", kill_when=every_timer_due)
    assert killed.was_killed, killed.explain()
    t0, t1, t2 = (batch_timestamp_ms(checkpoint, batch_id) for batch_id in range(3))
    assert t2 < t1 + DUE_S * 1000, "precondition: batch 2 ran before c's timer was due"
    assert final(sink) == {0: [], 1: [], 2: []}
    x_due, v_due = t1 + DUE_S * 1000, t2 + DUE_S * 1000
    at_kill = {
        "w": (1, t0 + LATER_S * 1000),
        "x": (2, x_due),
        "y": (1, x_due),
        "c": (2, None),
        "v": (1, v_due),
    }
    assert stored(spark, checkpoint) == at_kill
    savepoint, restored = tmp_path / "savepoint", tmp_path / "restored"
    assert main(["savepoint", "create", str(checkpoint), str(savepoint)]) == 0
    assert main(["savepoint", "restore", str(savepoint), str(restored)]) == 0

    # The restart's first batch fires x, y and v (not c, not w); the driver dies after its
    # sink wrote that batch, before the commit log; the next restart replays it with the
    # same clock, so the same keys fire again in the same batch and the sink keeps one copy.
    fired = sorted([("x", 2, x_due), ("y", 1, x_due), ("v", 1, v_due)], key=repr)
    write_batch(str(source), 3, rows(("z", LATER_S)))
    crashed = drive(source, checkpoint, sink, fault_point="after_commit@3")
    assert crashed.was_killed, crashed.explain()
    finished = drive(source, checkpoint, sink)
    assert finished.succeeded, finished.explain()
    t3 = batch_timestamp_ms(checkpoint, 3)
    assert final(sink) == {0: [], 1: [], 2: [], 3: fired}
    assert [batch for batch_id, batch in attempts(sink) if batch_id == 3] == [fired, fired]
    after = {"c": (2, None), "w": (1, t0 + LATER_S * 1000), "z": (1, t3 + LATER_S * 1000)}
    assert stored(spark, checkpoint) == after
    write_batch(str(source), 4, rows(("u", LATER_S)))
    assert drive(source, checkpoint, sink).succeeded
    assert final(sink)[4] == []  # nothing fires twice

    # The killed checkpoint's savepoint: the restored query's first batch fires the same
    # keys with the same due times; killed after its sink and restarted (bootstrapping
    # again), it fires them once more in that batch only; later batches fire nothing.
    restored_source, restored_sink = tmp_path / "restored-input", tmp_path / "restored-sink"
    restored_source.mkdir()
    write_batch(str(restored_source), 0, rows(("z", LATER_S)))
    crashed = drive(restored_source, restored, restored_sink, fault_point="after_commit@0")
    assert crashed.was_killed, crashed.explain()
    finished = drive(restored_source, restored, restored_sink)
    assert finished.succeeded, finished.explain()
    assert final(restored_sink) == {0: fired}
    assert [batch for _, batch in attempts(restored_sink)] == [fired, fired]
    write_batch(str(restored_source), 1, rows(("u", LATER_S)))
    assert drive(restored_source, restored, restored_sink).succeeded
    assert final(restored_sink) == {0: fired, 1: []}
    restored_t0 = batch_timestamp_ms(restored, 0)
    restored_t1 = batch_timestamp_ms(restored, 1)
    assert stored(spark, restored) == {
        "c": (2, None),
        "w": (1, t0 + LATER_S * 1000),
        "z": (1, restored_t0 + LATER_S * 1000),
        "u": (1, restored_t1 + LATER_S * 1000),
    }


@pytest.mark.chaos  # five driver JVMs, 2-4 minutes; the default lane restarts timers in-session
@pytest.mark.timeout(1200)
def test_event_time_timers_fire_once_after_a_driver_sigkill_and_through_a_savepoint(
    spark: Any, tmp_path: Path
) -> None:
    """Event-time timers are due once the watermark reaches them: killed after the batch
    that moved the next watermark (35 s) past x, y and v, the restarted query fires them
    in its next batch, once (killed again after its sink wrote that batch), and so does
    the killed checkpoint's savepoint restored (its watermark carried over)."""
    source, checkpoint, sink = tmp_path / "input", tmp_path / "checkpoint", tmp_path / "sink"
    source.mkdir()
    # (key, n, event second): timers at the key's event time + n seconds.
    write_batch(str(source), 0, events(("x", 10, 0), ("x", 10, 2), ("y", 10, 1), ("c", 10, 3)))
    # c's timer deleted before the watermark reached it; q moves the watermark to 35.
    write_batch(str(source), 1, events(("c", 0, 4), ("v", 10, 6), ("w", LATER_S, 5)))
    write_batch(str(source), 2, events(("q", LATER_S, 40)))
    committed = checkpoint / "commits" / "2"
    killed = drive(source, checkpoint, sink, "interval", "event", kill_when=committed.is_file)
    assert killed.was_killed, killed.explain()
    assert final(sink) == {0: [], 1: [], 2: []}

    def at(second: int) -> int:
        return (T0 + second) * 1000

    at_kill = {
        "x": (2, at(12)),
        "y": (1, at(11)),
        "c": (2, None),
        "v": (1, at(16)),
        "w": (1, at(5 + LATER_S)),
        "q": (1, at(40 + LATER_S)),
    }
    assert stored(spark, checkpoint) == at_kill
    savepoint, restored = tmp_path / "savepoint", tmp_path / "restored"
    assert main(["savepoint", "create", str(checkpoint), str(savepoint)]) == 0
    assert main(["savepoint", "restore", str(savepoint), str(restored)]) == 0

    fired = sorted([("x", 2, at(12)), ("y", 1, at(11)), ("v", 1, at(16))], key=repr)
    write_batch(str(source), 3, events(("z", LATER_S, 41)))
    crashed = drive(source, checkpoint, sink, kind="event", fault_point="after_commit@3")
    assert crashed.was_killed, crashed.explain()
    finished = drive(source, checkpoint, sink, kind="event")
    assert finished.succeeded, finished.explain()
    assert final(sink) == {0: [], 1: [], 2: [], 3: fired}
    assert [batch for batch_id, batch in attempts(sink) if batch_id == 3] == [fired, fired]
    after = {
        "c": (2, None),
        "w": (1, at(5 + LATER_S)),
        "q": (1, at(40 + LATER_S)),
        "z": (1, at(41 + LATER_S)),
    }
    assert stored(spark, checkpoint) == after

    restored_source, restored_sink = tmp_path / "restored-input", tmp_path / "restored-sink"
    restored_source.mkdir()
    write_batch(str(restored_source), 0, events(("z", LATER_S, 41)))
    crashed = drive(
        restored_source, restored, restored_sink, kind="event", fault_point="after_commit@0"
    )
    assert crashed.was_killed, crashed.explain()
    write_batch(str(restored_source), 1, events(("u", LATER_S, 42)))
    finished = drive(restored_source, restored, restored_sink, kind="event")
    assert finished.succeeded, finished.explain()
    assert final(restored_sink) == {0: fired, 1: []}
    assert [batch for batch_id, batch in attempts(restored_sink) if batch_id == 0] == [
        fired,
        fired,
    ]
    assert stored(spark, restored) == {**after, "u": (1, at(42 + LATER_S))}


# Timers turned on or off through a savepoint ------------------------------------------------


def savepoint_of(spark: Any, tmp_path: Path, kind: str, batch: list[dict[str, Any]]) -> Path:
    """A checkpoint of ``countdown(kind)`` that ran ``batch``, savepointed and restored
    into a new checkpoint (returned)."""
    old_input, old = tmp_path / "old-input", tmp_path / "old"
    old_input.mkdir()
    write_batch(str(old_input), 0, batch)
    output = countdown(kind)("k", key_groups=4).apply(source(spark, str(old_input)))
    with session_settings(spark, {NO_DATA_BATCHES: "false"}):
        run(output, str(old), "update", Emitted())
    savepoint, restored = tmp_path / "savepoint", tmp_path / "restored"
    assert main(["savepoint", "create", str(old), str(savepoint)]) == 0
    assert main(["savepoint", "restore", str(savepoint), str(restored)]) == 0
    return restored


@pytest.mark.timeout(300)
def test_timers_turned_on_through_a_savepoint_start_every_restored_key_without_one(
    spark: Any, tmp_path: Path
) -> None:
    """The old operator had no timers, so no key had one: the restored keys keep their
    state, start without a timer, and register timers from then on (an exact
    continuation)."""
    restored = savepoint_of(spark, tmp_path, "none", rows(("x", 5), ("x", 5), ("y", 5)))
    new_input = tmp_path / "new-input"
    new_input.mkdir()
    write_batch(str(new_input), 0, rows(("x", LATER_S), ("z", LATER_S)))
    initial_state = RestoredCheckpoint(restored).initial_state()
    operator = countdown("processing")("k", key_groups=4, initial_state=initial_state)
    sink = Emitted()
    with session_settings(spark, {NO_DATA_BATCHES: "false"}):
        run(operator.apply(source(spark, str(new_input))), str(restored), "update", sink)
    later = batch_timestamp_ms(restored, 0) + LATER_S * 1000
    assert sink.final() == [(0, [])]
    assert stored(spark, restored) == {"x": (3, later), "y": (1, None), "z": (1, later)}


@pytest.mark.timeout(300)
def test_timers_turned_off_through_a_savepoint_are_refused_before_the_query_starts(
    spark: Any, tmp_path: Path
) -> None:
    """The savepoint's keys hold registered timers an operator without timers would never
    fire (their output lost): ``apply`` refuses in one line naming ``timers`` and the fix,
    and the restored checkpoint stays untouched."""
    restored = savepoint_of(spark, tmp_path, "processing", rows(("x", LATER_S)))
    new_input = tmp_path / "new-input"
    new_input.mkdir()
    initial_state = RestoredCheckpoint(restored).initial_state()
    assert initial_state is not None
    operator = countdown("none")("k", key_groups=4, initial_state=initial_state)
    with pytest.raises(OperatorDefinitionError) as refused:
        operator.apply(source(spark, str(new_input)))
    assert str(refused.value) == (
        f"countdown: initial_state {initial_state.path} holds per-key timers (its operator"
        " set timers) and this operator has timers='none', so they would never fire; keep"
        " the old operator's timers ('processing' or 'event'; an on_timer that emits"
        " nothing lets them pass)"
    )
    assert not (restored / "offsets").exists()


@pytest.mark.timeout(300)
def test_fixed_timers_of_another_kind_through_a_savepoint_are_refused_naming_timers(
    spark: Any, tmp_path: Path
) -> None:
    restored = savepoint_of(spark, tmp_path, "processing", rows(("x", LATER_S)))
    new_input = tmp_path / "new-input"
    new_input.mkdir()
    initial_state = RestoredCheckpoint(restored).initial_state()
    operator = countdown("event")("k", key_groups=4, initial_state=initial_state)
    with pytest.raises(OperatorDefinitionError, match="timers"):
        operator.apply(with_watermark(source(spark, str(new_input))))


@pytest.mark.timeout(300)
def test_fixed_ttl_turned_on_through_a_savepoint_with_timers_keeps_each_keys_timer(
    spark: Any, tmp_path: Path
) -> None:
    """The savepoint holds timers and no expiries; ttl turned on adds the expiry column,
    which the state keeps before the timer column: it was added after it, and the restore
    was refused as 'other columns'. Now each key keeps its timer and gets the full ttl."""
    restored = savepoint_of(spark, tmp_path, "processing", rows(("x", LATER_S), ("y", LATER_S)))
    new_input = tmp_path / "new-input"
    new_input.mkdir()
    write_batch(str(new_input), 0, rows(("z", LATER_S)))
    initial_state = RestoredCheckpoint(restored).initial_state()
    operator = countdown("processing")("k", key_groups=4, initial_state=initial_state, ttl="1 hour")
    sink = Emitted()
    with session_settings(spark, {NO_DATA_BATCHES: "false"}):
        run(operator.apply(source(spark, str(new_input))), str(restored), "update", sink)
    assert sink.final() == [(0, [])]
    old_timer = batch_timestamp_ms(tmp_path / "old", 0) + LATER_S * 1000
    new_timer = batch_timestamp_ms(restored, 0) + LATER_S * 1000
    assert stored(spark, restored) == {
        "x": (1, old_timer),
        "y": (1, old_timer),
        "z": (1, new_timer),
    }
