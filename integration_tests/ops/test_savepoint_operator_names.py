"""Operator names (Flink's uid) through real queries: a savepoint's state follows its
operator's name, not its position.

A query with two named running counts (``by-a`` counts column ``a``, ``by-b`` column ``b``;
a union, so Spark numbers them in the order the query defines them) runs round one from
files and is savepointed. Restored into a query defining them in the OTHER order (Spark's
operator ids swap), each continues from its own counts: exact counts per key after rounds
two and three (the third run starts on the restored checkpoint's own state, which the
operators find by name). Restored into a query with only ``by-a``, the mapping refuses in
one line naming ``by-b``; restored with ``--allow-missing``, that query starts and its
counts are exact.

On a restored checkpoint whose bootstrap completed, renaming the operator relabels it and
its counts go on exactly, as on any checkpoint. A query naming only some operators (an
unnamed count and a named one) restores with ``None`` at the unnamed one's position and
exact counts, without ``allow_missing``; a query that drops the unnamed one is refused in
one line.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from eospack.cli import main
from eospack.lab.testing import await_query, session_settings
from eospack.stateful_ops import running_count
from eospack.stateful_ops.state_reader import read_state_table
from eospack.tools.savepoint import RESTORED_DIRECTORY, RestoredCheckpoint, SavepointError

pytestmark = pytest.mark.integration

QUERY_SECONDS = 120
COLUMNS = {"by-a": "a", "by-b": "b"}
# Spark refuses two applyInPandasWithState in one query ("Multiple applyInPandasWithStates
# are not supported") unless its unsupported-operation check is off; the two operators here
# are independent (a union of two counts of one input), which the check does not tell apart.
SETTINGS = {
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.streaming.unsupportedOperationCheck": "false",
}


def write_round(directory: Path, name: str, rows: int, rng: random.Random) -> list[dict[str, str]]:
    events = [{"a": f"a{rng.randrange(5)}", "b": f"b{rng.randrange(4)}"} for _ in range(rows)]
    directory.mkdir(parents=True, exist_ok=True)
    staging = directory / f".{name}.tmp"
    staging.write_text("".join(json.dumps(event) + "\n" for event in events))
    staging.rename(directory / f"{name}.json")
    return events


def counts(events: Sequence[dict[str, str]]) -> dict[str, dict[str, int]]:
    return {name: dict(Counter(e[column] for e in events)) for name, column in COLUMNS.items()}


def run(spark: Any, source: Path, checkpoint: Path, names: Sequence[str]) -> None:
    """One Trigger.AvailableNow run of a query with a running count per name, defined in
    the order of ``names``, each taking its initial state by name."""
    run_operators(spark, source, checkpoint, [(name, COLUMNS[name]) for name in names])


def run_operators(
    spark: Any, source: Path, checkpoint: Path, operators: Sequence[tuple[str | None, str]]
) -> None:
    """One Trigger.AvailableNow run of a query with a running count of column ``column`` per
    ``(name, column)``, defined in that order: a named one takes its initial state by name,
    an unnamed one (None) with ``initial_state`` at its position."""
    restored = RestoredCheckpoint(checkpoint)
    states = restored.initial_states([name for name, _ in operators])
    with session_settings(spark, SETTINGS):
        events = spark.readStream.schema("a STRING, b STRING").json(str(source))
        outputs = [
            running_count(
                events,
                column,
                key_groups=4,
                output_mode="append",
                initial_state=restored.initial_state(position) if name is None else states[name],
                name=name,
            ).selectExpr(f"'{name or position}' AS operator", f"{column} AS key", "count")
            for position, (name, column) in enumerate(operators)
        ]
        output = outputs[0]
        for other in outputs[1:]:
            output = output.unionByName(other)
        query = (
            output.writeStream.format("noop")
            .outputMode("append")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        await_query(query, QUERY_SECONDS)


def state_by_id(
    spark: Any, checkpoint: Path, operators: int
) -> list[tuple[str | None, dict[str, int]]]:
    """Each operator's stored name (None: unnamed) and counts, in operator id order."""
    states = []
    for operator_id in range(operators):
        table = read_state_table(spark, str(checkpoint), None, operator_id)
        assert table is not None
        name = (table.schema.metadata or {}).get(b"operator_name")
        frame = table.to_pandas()
        key = frame.columns[0]
        counted = dict(zip(frame[key], frame["count"].astype(int), strict=True))
        states.append((name.decode() if name is not None else None, counted))
    return states


def state_by_name(spark: Any, checkpoint: Path, operators: int) -> dict[str, dict[str, int]]:
    """Each operator's stored counts, by the name stored with its state, in operator id
    order (dict order)."""
    states = {}
    for operator_id in range(operators):
        table = read_state_table(spark, str(checkpoint), None, operator_id)
        assert table is not None
        name = (table.schema.metadata or {})[b"operator_name"].decode()
        frame = table.to_pandas()
        key = frame.columns[0]
        states[name] = dict(zip(frame[key], frame["count"].astype(int), strict=True))
    return states


@pytest.mark.timeout(300)
def test_state_follows_operator_names_when_positions_swap(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    rng = random.Random(seed)
    first_round = write_round(tmp_path / "in-1", "round-1", 60, rng)
    run(spark, tmp_path / "in-1", tmp_path / "first", ["by-a", "by-b"])
    assert state_by_name(spark, tmp_path / "first", 2) == counts(first_round)

    savepoint = tmp_path / "savepoint"
    assert main(["savepoint", "create", str(tmp_path / "first"), str(savepoint)]) == 0
    out = capsys.readouterr().out
    assert "operator 0 (running_count, name by-a)" in out
    assert "operator 1 (running_count, name by-b)" in out
    manifest = json.loads((savepoint / "manifest.json").read_text())
    assert [op["operator_name"] for op in manifest["operators"]] == ["by-a", "by-b"]

    # Swapped: by-b is now Spark's operator 0, by-a operator 1; each keeps its own counts.
    assert main(["savepoint", "restore", str(savepoint), str(tmp_path / "swapped")]) == 0
    assert "initial_states(['by-a', 'by-b'])" in capsys.readouterr().out
    second_round = write_round(tmp_path / "in-2", "round-2", 40, rng)
    run(spark, tmp_path / "in-2", tmp_path / "swapped", ["by-b", "by-a"])
    state = state_by_name(spark, tmp_path / "swapped", 2)
    assert list(state) == ["by-b", "by-a"]
    assert state == counts(first_round + second_round)
    third_round = write_round(tmp_path / "in-2", "round-3", 30, rng)
    run(spark, tmp_path / "in-2", tmp_path / "swapped", ["by-b", "by-a"])
    assert state_by_name(spark, tmp_path / "swapped", 2) == counts(
        first_round + second_round + third_round
    )
    for name in COLUMNS:  # the third start found each operator's own state by its name
        split = tmp_path / "swapped" / RESTORED_DIRECTORY / f"operator-{name}-split"
        assert (split / "_bootstrapped-4").is_file()
    assert main(["checkpoint", "inspect", str(tmp_path / "swapped"), "--state"]) == 0
    out = capsys.readouterr().out
    assert "running_count named by-b" in out and "running_count named by-a" in out

    # A query without by-b: refused in one line naming it and the fix ...
    assert main(["savepoint", "restore", str(savepoint), str(tmp_path / "strict")]) == 0
    with pytest.raises(SavepointError) as refused:
        run(spark, tmp_path / "in-2", tmp_path / "strict", ["by-a"])
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("savepoint operator(s) by-b claimed by no operator of this query")
    assert "--allow-missing" in message and "allow_missing=True" in message
    assert not (tmp_path / "strict" / "commits").exists()

    # ... and with --allow-missing it starts; by-a's counts are exact.
    lenient = tmp_path / "lenient"
    assert main(["savepoint", "restore", str(savepoint), str(lenient), "--allow-missing"]) == 0
    run(spark, tmp_path / "in-2", lenient, ["by-a"])
    expected = counts(first_round + second_round + third_round)["by-a"]
    assert state_by_name(spark, lenient, 1) == {"by-a": expected}


@pytest.mark.timeout(300)
def test_renaming_an_operator_after_the_restored_bootstrap_relabels_and_counts_go_on(
    spark: Any, tmp_path: Path
) -> None:
    """Restored, bootstrapped by one run, then renamed: the first start after the bootstrap
    batch (no record yet) reads the checkpoint's state to see that it holds by-a's, records
    that, and the renamed operator continues by-a's counts exactly; a further start with
    the new name goes on from the record."""
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    rng = random.Random(seed)
    rounds = [write_round(tmp_path / "in-1", "round-1", 50, rng)]
    run(spark, tmp_path / "in-1", tmp_path / "first", ["by-a"])
    savepoint, restored = tmp_path / "savepoint", tmp_path / "restored"
    assert main(["savepoint", "create", str(tmp_path / "first"), str(savepoint)]) == 0
    assert main(["savepoint", "restore", str(savepoint), str(restored)]) == 0

    rounds.append(write_round(tmp_path / "in-2", "round-2", 40, rng))
    run(spark, tmp_path / "in-2", restored, ["by-a"])  # the bootstrap batch
    everything = [event for events in rounds for event in events]
    assert state_by_id(spark, restored, 1) == [("by-a", counts(everything)["by-a"])]
    record = restored / RESTORED_DIRECTORY / "operator-by-a-split" / "_bootstrapped-4"
    assert not record.exists()

    for round_name in ("round-3", "round-4"):
        rounds.append(write_round(tmp_path / "in-2", round_name, 30, rng))
        run_operators(spark, tmp_path / "in-2", restored, [("tallies", "a")])
        assert record.is_file()
        everything = [event for events in rounds for event in events]
        assert state_by_id(spark, restored, 1) == [("tallies", counts(everything)["by-a"])]
    assert not (restored / RESTORED_DIRECTORY / "operator-tallies-split").exists()


@pytest.mark.timeout(300)
def test_a_partially_named_query_restores_exactly_and_an_unclaimed_unnamed_one_is_refused(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unnamed count of ``a`` (operator 0) and by-b: restored with ``[None, 'by-b']``
    (what the restore prints) and ``initial_state(0)``, both go on exactly without
    allow_missing; a query of by-b alone leaves operator 0's state unclaimed: refused in
    one line before any batch."""
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    rng = random.Random(seed)
    shape: list[tuple[str | None, str]] = [(None, "a"), ("by-b", "b")]
    first_round = write_round(tmp_path / "in-1", "round-1", 60, rng)
    run_operators(spark, tmp_path / "in-1", tmp_path / "first", shape)
    savepoint = tmp_path / "savepoint"
    assert main(["savepoint", "create", str(tmp_path / "first"), str(savepoint)]) == 0
    assert main(["savepoint", "restore", str(savepoint), str(tmp_path / "restored")]) == 0
    out = capsys.readouterr().out
    assert "initial_states([None, 'by-b'])" in out
    assert "running_count(..., initial_state=restored.initial_state())" in out

    second_round = write_round(tmp_path / "in-2", "round-2", 40, rng)
    run_operators(spark, tmp_path / "in-2", tmp_path / "restored", shape)
    expected = counts(first_round + second_round)
    assert state_by_id(spark, tmp_path / "restored", 2) == [
        (None, expected["by-a"]),
        ("by-b", expected["by-b"]),
    ]

    assert main(["savepoint", "restore", str(savepoint), str(tmp_path / "strict")]) == 0
    with pytest.raises(SavepointError) as refused:
        run_operators(spark, tmp_path / "in-2", tmp_path / "strict", [("by-b", "b")])
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(
        "savepoint operator(s) unnamed operator 0 claimed by no operator of this query"
    )
    assert "names[0] = None" in message
    assert not (tmp_path / "strict" / "commits").exists()
