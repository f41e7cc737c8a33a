"""stateful_ops on real Spark streaming queries, fed by a JSON file source.

Each input file is one micro-batch (``maxFilesPerTrigger=1``, files ordered by mtime), so
every run sees the same batches. The restart tests stop after two batches, delete the
commit of the last one (as a crash between state commit and commit log would leave it),
restart on the same checkpoint and compare everything emitted with an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from eospack.lab.testing import await_query, session_settings, wait_until
from eospack.stateful_ops import (
    Deduplicate,
    OperatorDefinitionError,
    StatefulOperator,
    configure_state_store,
    deduplicate,
    read_state,
    running_aggregate,
    running_count,
    sessionize,
)
from eospack.stateful_ops.state_codec import EXPIRES_COLUMN
from eospack.stateful_ops.state_store import state_store_conf
from integration_tests.stateful_parts import (
    NO_DATA_BATCHES,
    QUERY_TIMEOUT,
    T0,
    Emitted,
    batch_timestamp_ms,
    run,
    source,
    with_watermark,
    write_batch,
)

MAX_RECORDS_PER_BATCH = "spark.sql.execution.arrow.maxRecordsPerBatch"


def make_batches(seed: int = 7, rows: int = 40) -> list[list[dict[str, Any]]]:
    """Four batches with null and composite keys; event time advances ~40 s per batch.

    Batch 2 also carries one row of key ("a", 1) far ahead (T0 + 500 s), so the watermark
    of batch 3 passes every other key; batch 3 only holds key ("a", 1).
    """
    rng = random.Random(seed)
    keys = ["a", "b", "c", "d", "e", "f", "g", None]

    def row(k: str | None, n: int | None, t: int) -> dict[str, Any]:
        return {"k": k, "n": n, "v": rng.choice([None, round(rng.uniform(-5, 5), 2)]), "t": t}

    out = [
        [
            row(rng.choice(keys), rng.choice([1, 2, None]), T0 + 40 * b + rng.randrange(30))
            for _ in range(rows)
        ]
        for b in range(3)
    ]
    out[2].append(row("a", 1, T0 + 500))
    out.append([row("a", 1, T0 + 500 + rng.randrange(20)) for _ in range(10)])
    return out


BATCHES = make_batches()


def rounded(emitted: list[tuple[int, list[tuple[Any, ...]]]]) -> list[Any]:
    return [
        (batch_id, [tuple(round(x, 9) if isinstance(x, float) else x for x in row) for row in rows])
        for batch_id, rows in emitted
    ]


@dataclass(frozen=True)
class Case:
    build: Callable[[DataFrame], DataFrame]
    mode: str


CASES = {
    "running_count": Case(lambda df: running_count(df, ["k", "n"], key_groups=16), "update"),
    "running_aggregate": Case(
        lambda df: running_aggregate(
            df, "k", {"v": ["sum", "mean", "min", "max", "count"], "n": ["sum", "max"]}
        ),
        "update",
    ),
    "deduplicate": Case(
        lambda df: deduplicate(with_watermark(df), ["k", "n"], "20 seconds", event_time="ts"),
        "append",
    ),
    "sessionize": Case(
        lambda df: sessionize(with_watermark(df), ["k", "n"], "ts", "8 seconds"), "append"
    ),
}


@dataclass
class Outcome:
    emitted: Emitted
    checkpoint: str
    state_rows: list[int]


_uninterrupted: dict[str, Outcome] = {}


def uninterrupted(spark: SparkSession, tmp_root: str, name: str) -> Outcome:
    """All batches in one run on the default store (computed once per operator)."""
    if name not in _uninterrupted:
        directory = os.path.join(tmp_root, f"{name}-input")
        os.makedirs(directory)
        for index, rows in enumerate(BATCHES):
            write_batch(directory, index, rows)
        checkpoint = os.path.join(tmp_root, f"{name}-checkpoint")
        sink = Emitted()
        # Tiny Arrow batches: each key group reaches Python as several pandas frames, while
        # the interrupted runs get one frame per group; results must not depend on it.
        with session_settings(spark, {NO_DATA_BATCHES: "false", MAX_RECORDS_PER_BATCH: "7"}):
            query = run(
                CASES[name].build(source(spark, directory)), checkpoint, CASES[name].mode, sink
            )
        state_rows = [p["stateOperators"][0]["numRowsTotal"] for p in query.recentProgress]
        _uninterrupted[name] = Outcome(sink, checkpoint, state_rows)
    return _uninterrupted[name]


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("stateful_ops"))


def interrupted(spark: SparkSession, tmp_root: str, name: str, store: dict[str, str]) -> Outcome:
    """Two batches, forget the last commit, restart on the same checkpoint with the rest."""
    directory = os.path.join(tmp_root, f"{name}-{len(store)}-input")
    checkpoint = os.path.join(tmp_root, f"{name}-{len(store)}-checkpoint")
    os.makedirs(directory)
    sink = Emitted()
    case = CASES[name]
    with session_settings(spark, {NO_DATA_BATCHES: "false", **store}):
        for index in (0, 1):
            write_batch(directory, index, BATCHES[index])
        run(case.build(source(spark, directory)), checkpoint, case.mode, sink)
        for name_in_commits in ("1", ".1.crc"):
            os.remove(os.path.join(checkpoint, "commits", name_in_commits))
        for index in range(2, len(BATCHES)):
            write_batch(directory, index, BATCHES[index])
        query = run(case.build(source(spark, directory)), checkpoint, case.mode, sink)
    state_rows = [p["stateOperators"][0]["numRowsTotal"] for p in query.recentProgress]
    return Outcome(sink, checkpoint, state_rows)


@pytest.mark.parametrize(
    ("name", "store"),
    [
        ("running_count", "default"),
        ("running_aggregate", "default"),
        ("deduplicate", "default"),
        ("sessionize", "default"),
        ("running_count", "rocksdb"),
        ("sessionize", "rocksdb"),
    ],
)
def test_restart_from_checkpoint_replays_identically(
    spark: SparkSession, tmp_root: str, name: str, store: str
) -> None:
    expected = uninterrupted(spark, tmp_root, name)
    actual = interrupted(
        spark, tmp_root, name, state_store_conf("rocksdb") if store == "rocksdb" else {}
    )

    # Batch 1 ran twice (its commit was lost): the replay emitted exactly what it did first.
    replays = [rows for batch_id, rows in actual.emitted.attempts if batch_id == 1]
    assert len(replays) == 2
    assert replays[0] == replays[1]
    # Float sums depend on summation order, which differs with the frame split; the rest is exact.
    assert rounded(actual.emitted.final()) == rounded(expected.emitted.final())
    assert [b for b, _ in expected.emitted.final()] == list(range(len(BATCHES)))
    assert any(rows for _, rows in expected.emitted.final())
    final_state = read_state(spark, actual.checkpoint)
    expected_state = read_state(spark, expected.checkpoint)
    columns = list(expected_state.columns)
    assert_same_rows(final_state[columns], expected_state)


def assert_same_rows(actual: pd.DataFrame, expected: pd.DataFrame) -> None:
    def canonical(frame: pd.DataFrame) -> list[tuple[Any, ...]]:
        rows = frame.astype(object).where(frame.notna(), None).itertuples(index=False)
        return sorted(
            (tuple(round(x, 9) if isinstance(x, float) else x for x in row) for row in rows),
            key=repr,
        )

    assert canonical(actual) == canonical(expected)


def all_rows() -> pd.DataFrame:
    return pd.DataFrame([row for rows in BATCHES for row in rows])


def test_running_count_counts_and_versions_per_key(spark: SparkSession, tmp_root: str) -> None:
    emitted = uninterrupted(spark, tmp_root, "running_count").emitted.final()
    history: dict[tuple[Any, Any], list[tuple[int, int]]] = {}
    for _, rows in emitted:
        for k, n, count, version in rows:
            history.setdefault((k, n), []).append((count, version))
    expected_counts = Counter((r["k"], r["n"]) for rows in BATCHES for r in rows)
    batches_with_key: dict[tuple[Any, Any], int] = {}
    for rows in BATCHES:
        for key in {(r["k"], r["n"]) for r in rows}:
            batches_with_key[key] = batches_with_key.get(key, 0) + 1
    assert (None, None) in history  # null composite keys round-trip
    assert set(history) == set(batches_with_key)
    for key, sequence in history.items():
        counts = [c for c, _ in sequence]
        versions = [v for _, v in sequence]
        assert versions == list(range(1, len(versions) + 1)), key
        assert counts == sorted(set(counts)), key
        assert counts[-1] == expected_counts[key], key
        assert versions[-1] == batches_with_key[key], key


def test_running_aggregate_matches_batch_aggregation(spark: SparkSession, tmp_root: str) -> None:
    emitted = uninterrupted(spark, tmp_root, "running_aggregate").emitted.final()
    last: dict[Any, tuple[Any, ...]] = {}
    for _, rows in emitted:
        for row in rows:
            last[row[0]] = row[1:]
    data = all_rows()
    for key, group in data.groupby("k", dropna=False):
        key = None if pd.isna(key) else key
        v, n = group["v"].dropna(), group["n"].dropna()
        v_sum, v_mean, v_min, v_max, v_count, n_sum, n_max, version = last[key]
        assert v_count == len(v)
        if len(v):
            assert v_sum == pytest.approx(v.sum())
            assert v_mean == pytest.approx(v.mean())
            assert (v_min, v_max) == (v.min(), v.max())
        else:
            assert (v_sum, v_mean, v_min, v_max) == (None, None, None, None)
        assert n_sum == (int(n.sum()) if len(n) else None)
        assert n_max == (int(n.max()) if len(n) else None)
        assert version == sum(1 for rows in BATCHES if any(r["k"] == key for r in rows))


@pytest.mark.parametrize("name", ["deduplicate", "sessionize"])
def test_event_time_state_expires(spark: SparkSession, tmp_root: str, name: str) -> None:
    outcome = uninterrupted(spark, tmp_root, name)
    assert max(outcome.state_rows) > 2
    # One key group left, plus the settings row that every batch with rows visits.
    assert outcome.state_rows[-1] == 2, outcome.state_rows
    keys_per_batch = [
        len(read_state(spark, outcome.checkpoint, batch_id=b)) for b in range(len(BATCHES))
    ]
    assert max(keys_per_batch) > 1
    remaining = read_state(spark, outcome.checkpoint)
    assert list(zip(remaining["k"], remaining["n"], strict=True)) == [("a", 1)]


def test_sessionize_sessions_account_for_every_event(spark: SparkSession, tmp_root: str) -> None:
    outcome = uninterrupted(spark, tmp_root, "sessionize")
    closed = [row for _, rows in outcome.emitted.final() for row in rows]
    still_open = read_state(spark, outcome.checkpoint)
    assert sum(row[4] for row in closed) + int(still_open["count"].sum()) == len(all_rows())
    for _k, _n, start, end, count in closed:
        assert end - start >= pd.Timedelta(seconds=8)
        assert count >= 1


def test_deduplicate_emits_each_key_once_while_remembered(
    spark: SparkSession, tmp_root: str
) -> None:
    emitted = uninterrupted(spark, tmp_root, "deduplicate").emitted.final()
    firsts = [row for _, rows in emitted for row in rows]
    seen: dict[tuple[Any, Any], int] = {}
    for k, n, _v, t, _ts in firsts:
        if (k, n) in seen:
            assert t >= seen[(k, n)] + 20, (k, n)
        seen[(k, n)] = t
    assert set(seen) == {(r["k"], r["n"]) for rows in BATCHES for r in rows}


def offset_log_conf(checkpoint: str) -> dict[str, str]:
    with open(os.path.join(checkpoint, "offsets", "0")) as handle:
        return json.loads(handle.read().splitlines()[1])["conf"]


def test_rocksdb_checkpoint_really_uses_rocksdb(spark: SparkSession, tmp_root: str) -> None:
    directory = os.path.join(tmp_root, "rocksdb-proof-input")
    os.makedirs(directory)
    write_batch(directory, 0, BATCHES[0])
    checkpoint = os.path.join(tmp_root, "rocksdb-proof-checkpoint")
    settings = state_store_conf("rocksdb", changelog=True)
    with session_settings(spark, dict.fromkeys(settings, "")):
        configure_state_store(spark, provider="rocksdb", changelog=True)
        assert {key: spark.conf.get(key) for key in settings} == settings
        run(running_count(source(spark, directory), "k"), checkpoint, "update", Emitted())
    conf = offset_log_conf(checkpoint)
    assert conf["spark.sql.streaming.stateStore.providerClass"].endswith(
        "RocksDBStateStoreProvider"
    )
    assert os.listdir(os.path.join(checkpoint, "state", "0", "0"))
    changelogs = [
        name
        for root, _, files in os.walk(os.path.join(checkpoint, "state"))
        for name in files
        if name.endswith(".changelog")
    ]
    assert changelogs


def test_custom_operator_in_fifteen_lines(spark: SparkSession, tmp_root: str) -> None:
    class FirstSeen(StatefulOperator):
        """Emit each key once, with the smallest t of the batch it first appeared in."""

        name = "first_seen"
        state_fields = "first_t bigint"
        output_fields = "first_t bigint"

        def prepare(self, df: DataFrame) -> DataFrame:
            return df.select(*self.keys, "t")

        def update(self, rows, state, clock):  # type: ignore[no-untyped-def]
            keys = list(self.keys)
            firsts = rows.groupby(keys, dropna=False, sort=False, as_index=False)["t"].min()
            known = pd.MultiIndex.from_frame(firsts[keys]).isin(
                pd.MultiIndex.from_frame(state[keys])
            )
            new = firsts[~known].rename(columns={"t": "first_t"})
            return pd.concat([state, new], ignore_index=True), new

    directory = os.path.join(tmp_root, "custom-input")
    os.makedirs(directory)
    for index, rows in enumerate(BATCHES[:2]):
        write_batch(directory, index, rows)
    sink = Emitted()
    result = FirstSeen(["k", "n"], key_groups=4).apply(source(spark, directory))
    run(result, os.path.join(tmp_root, "custom-checkpoint"), "update", sink)
    expected: dict[tuple[Any, Any], int] = {}
    for batch_id, rows in enumerate(BATCHES[:2]):
        firsts: dict[tuple[Any, Any], int] = {}
        for r in rows:
            key = (r["k"], r["n"])
            if key not in expected:
                firsts[key] = min(firsts.get(key, r["t"]), r["t"])
        expected.update(firsts)
        assert sink.final()[batch_id] == (
            batch_id,
            sorted(((k, n, t) for (k, n), t in firsts.items()), key=repr),
        )


def test_incompatible_state_change_fails_naming_operator_and_change(
    spark: SparkSession, tmp_root: str
) -> None:
    directory = os.path.join(tmp_root, "evolution-input")
    checkpoint = os.path.join(tmp_root, "evolution-checkpoint")
    os.makedirs(directory)
    write_batch(directory, 0, BATCHES[0])
    before = running_aggregate(source(spark, directory), "k", {"v": "sum"})
    run(before, checkpoint, "update", Emitted())
    write_batch(directory, 1, BATCHES[1])
    after = running_aggregate(source(spark, directory), "k", {"v": ["sum", "max"]})
    with pytest.raises(Exception, match="running_aggregate: stored state schema changed") as error:
        run(after, checkpoint, "update", Emitted())
    assert "declared columns missing from stored state: max__v" in str(error.value)


def test_deduplicate_processing_time_ttl_expires_keys(spark: SparkSession, tmp_root: str) -> None:
    directory = os.path.join(tmp_root, "dedup-ttl-input")
    checkpoint = os.path.join(tmp_root, "dedup-ttl-checkpoint")
    os.makedirs(directory)
    ttl_ms = 1000
    row = {"n": 1, "v": 0.0, "t": T0}
    write_batch(directory, 0, [{**row, "k": k} for k in ("x", "y", "x")])
    sink = Emitted()

    def start() -> StreamingQuery:
        # Processing-time timeouts make Spark run a no-data batch at every trigger, so
        # Trigger.AvailableNow would never end with no-data batches enabled.
        result = deduplicate(source(spark, directory), "k", f"{ttl_ms} ms", key_groups=4)
        with session_settings(spark, {NO_DATA_BATCHES: "false"}):
            return run(result, checkpoint, "append", sink)

    first = start()
    assert [rows for _, rows in sink.final()] == [[("x", 1, 0.0, T0), ("y", 1, 0.0, T0)]]
    batch_time = pd.Timestamp(first.lastProgress["timestamp"]).timestamp()
    wait_until(lambda: time.time() > batch_time + 2 * ttl_ms / 1000, 10, "the ttl to pass")
    write_batch(directory, 1, [{**row, "k": k} for k in ("x", "z")])
    start()
    assert sink.final()[1] == (1, [("x", 1, 0.0, T0), ("z", 1, 0.0, T0)])
    remembered = read_state(spark, checkpoint)
    assert sorted(remembered["k"]) == ["x", "z"]  # y expired and left the state


TTL_CASES = {
    "running_count": (
        lambda df, ttl: running_count(df, "k", key_groups=4, ttl=ttl),
        [("x", 2), ("y", 1)],
        [("x", 1), ("z", 1)],
    ),
    "running_aggregate": (
        lambda df, ttl: running_aggregate(df, "k", {"v": "sum"}, key_groups=4, ttl=ttl),
        [("x", 4.0), ("y", 2.0)],
        [("x", 2.0), ("z", 2.0)],
    ),
}


def without_versions(rows: list[tuple[Any, ...]]) -> tuple[list[tuple[Any, ...]], set[int]]:
    """The rows without their last field (the version), and the versions seen."""
    return [row[:-1] for row in rows], {row[-1] for row in rows}


@pytest.mark.parametrize("name", sorted(TTL_CASES))
def test_ttl_forgets_a_key_idle_longer_than_ttl_and_it_starts_again(
    spark: SparkSession, tmp_root: str, name: str
) -> None:
    """x and y, then (after the ttl) x and z: x counts from 1 again (without a ttl it would
    be 3) and y left the state, whichever key group it is in. With ttl a key's life starts
    its version at the batch's timestamp (ms), so x's new life is versioned above its old
    one (a ``versionColumn=version`` sink takes it)."""
    build, first_batch, second_batch = TTL_CASES[name]
    directory = os.path.join(tmp_root, f"{name}-ttl-input")
    checkpoint = os.path.join(tmp_root, f"{name}-ttl-checkpoint")
    os.makedirs(directory)
    ttl_ms = 1000
    row = {"n": 1, "v": 2.0, "t": T0}
    write_batch(directory, 0, [{**row, "k": k} for k in ("x", "y", "x")])
    sink = Emitted()

    def start() -> StreamingQuery:
        with session_settings(spark, {NO_DATA_BATCHES: "false"}):
            return run(build(source(spark, directory), f"{ttl_ms} ms"), checkpoint, "update", sink)

    started_ms = time.time() * 1000
    first = start()
    [(batch, rows)] = sink.final()
    values, first_versions = without_versions(rows)
    assert (batch, values) == (0, first_batch)
    [first_version] = first_versions
    assert started_ms - 60_000 < first_version <= time.time() * 1000
    batch_time = pd.Timestamp(first.lastProgress["timestamp"]).timestamp()
    wait_until(lambda: time.time() > batch_time + 2 * ttl_ms / 1000, 10, "the ttl to pass")
    write_batch(directory, 1, [{**row, "k": k} for k in ("x", "z")])
    start()
    batch, rows = sink.final()[1]
    values, second_versions = without_versions(rows)
    assert (batch, values) == (1, second_batch)
    [second_version] = second_versions
    assert second_version >= first_version + ttl_ms
    assert sorted(read_state(spark, checkpoint)["k"]) == ["x", "z"]


def test_bad_definitions_fail_before_the_query_starts(spark: SparkSession, tmp_root: str) -> None:
    directory = os.path.join(tmp_root, "errors-input")
    os.makedirs(directory)
    df = source(spark, directory).withColumn("ts", F.timestamp_seconds("t"))
    cases: list[tuple[Callable[[], object], str]] = [
        (
            lambda: running_count(df, "missing"),
            "running_count: key column 'missing' is not in the DataFrame;"
            " available columns: k, n, v, t, ts",
        ),
        (
            lambda: running_aggregate(df, "k", {"v": "median"}),
            "running_aggregate: aggregate 'median' for column 'v' is not supported;"
            " use one of sum, count, min, max, mean",
        ),
        (
            lambda: running_aggregate(df, "k", {"nope": "sum"}),
            "running_aggregate: aggregate column 'nope' is not in the DataFrame;"
            " available columns: k, n, v, t, ts",
        ),
        (
            lambda: running_aggregate(df, "n", {"k": ["sum", "count"]}),
            "running_aggregate: sum of column 'k' needs a numeric column (integer or floating"
            " point), not string; only count works on it",
        ),
        (
            lambda: deduplicate(df, "k", "0 seconds"),
            "deduplicate: ttl='0 seconds' must be positive (at least 1 ms)",
        ),
        (
            lambda: deduplicate(df, "k", "10 seconds", event_time="ts"),
            "deduplicate: event_time column 'ts' has no watermark;"
            ' call df.withWatermark("ts", "<delay>") before deduplicate',
        ),
        (
            lambda: sessionize(df, "k", "ts", "5 minutes"),
            "sessionize: event_time column 'ts' has no watermark;"
            ' call df.withWatermark("ts", "<delay>") before sessionize',
        ),
        (
            lambda: sessionize(with_watermark(df), "k", "t", "5 minutes"),
            "sessionize: event_time column 't' is bigint, not timestamp;"
            " cast it with to_timestamp() first",
        ),
        (
            lambda: sessionize(with_watermark(df), "k", "ts", "-5 minutes"),
            "sessionize: gap='-5 minutes' is not a duration;"
            ' pass a datetime.timedelta or a string like "10 minutes"',
        ),
        (
            lambda: configure_state_store(spark, provider="memory"),
            "configure_state_store: provider='memory'; use one of rocksdb, hdfs",
        ),
    ]
    for define, message in cases:
        with pytest.raises(OperatorDefinitionError) as error:
            define()
        assert str(error.value) == message
    assert not spark.streams.active


# Fixed settings checked by every batch with rows (settings markers) -------------------------

CHANGED_KEY_GROUPS_ERROR = (
    "eospack.stateful_ops.errors.StateSchemaMismatchError: {operator}: stored state was"
    " written with key_groups=8, this query declares key_groups=16; keep key_groups=8 for this"
    " checkpoint or restart from a new checkpoint location\n"
)


def key_groups_of(spark: SparkSession, keys: list[str], key_groups: int) -> dict[str, int]:
    """Each key's key group, computed by Spark with the documented expression."""
    frame = spark.createDataFrame([(key,) for key in keys], "k string")
    key_group = F.pmod(F.xxhash64("k"), F.lit(key_groups)).cast("int")
    return {key: group for key, group in frame.select("k", key_group).collect()}


def rows_of(keys: list[str], t: int) -> list[dict[str, Any]]:
    return [{"k": key, "n": 1, "v": 0.0, "t": t} for key in keys]


def stored_key_groups(spark: SparkSession, checkpoint: str) -> list[int]:
    rows = spark.read.format("statestore").load(checkpoint).select("key.*").collect()
    return sorted(row[0] for row in rows)


@pytest.mark.timeout(240)
def test_changed_key_groups_fail_the_first_batch_before_the_sink_commits(
    spark: SparkSession, tmp_root: str, postgres: Any, unique_name: str
) -> None:
    import psycopg

    keys = [f"key-{index:03d}" for index in range(64)]
    groups_of_16 = key_groups_of(spark, keys, 16)
    assert set(groups_of_16.values()) == set(range(16))  # batch 0 fills every key group
    # Under 16 groups these keys move to groups 8..15, which hold no state yet.
    moved = sorted(key for key, group in groups_of_16.items() if group >= 8)
    directory = os.path.join(tmp_root, "regrouped-jdbc-input")
    checkpoint = os.path.join(tmp_root, "regrouped-jdbc-checkpoint")
    os.makedirs(directory)
    batch_0 = [
        row for index, key in enumerate(keys) for row in rows_of([key], T0) * (index % 3 + 1)
    ]
    write_batch(directory, 0, batch_0)

    def start(key_groups: int) -> None:
        counts = running_count(
            source(spark, directory), "k", key_groups=key_groups, output_mode="append"
        )
        query = (
            counts.writeStream.format("2pc-jdbc")
            .outputMode("append")
            .option("url", postgres.endpoint.jdbc_url)
            .option("user", postgres.endpoint.user)
            .option("dbtable", unique_name)
            .option("createTableIfNotExists", "true")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        await_query(query, QUERY_TIMEOUT)

    def table() -> list[tuple[Any, ...]]:
        with psycopg.connect(postgres.endpoint.url) as connection:
            return connection.execute(
                f'SELECT "k", "count", "version" FROM "{unique_name}" ORDER BY 1, 3'
            ).fetchall()

    def prepared_transactions() -> int:
        with psycopg.connect(postgres.endpoint.url) as connection:
            row = connection.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone()
        return int(row[0]) if row else 0

    prepared_before = prepared_transactions()
    with session_settings(spark, {NO_DATA_BATCHES: "false"}):
        start(key_groups=8)
        after_batch_0 = [(key, index % 3 + 1, 1) for index, key in enumerate(keys)]
        assert table() == after_batch_0
        write_batch(directory, 1, rows_of(moved, T0))
        with pytest.raises(Exception) as error:
            start(key_groups=16)
        assert CHANGED_KEY_GROUPS_ERROR.format(operator="running_count") in str(error.value)
        assert table() == after_batch_0  # nothing of batch 1 was committed
        # Keeping key_groups=8, as the message says, resumes with the right counts.
        start(key_groups=8)
    counts_0 = {key: index % 3 + 1 for index, key in enumerate(keys)}
    after_batch_1 = [(key, counts_0[key] + 1, 2) for key in moved]
    assert table() == sorted(after_batch_0 + after_batch_1)
    assert prepared_transactions() == prepared_before  # the failed batch left nothing


@pytest.mark.timeout(240)
def test_checkpoint_from_before_markers_records_settings_and_then_refuses_changes(
    spark: SparkSession, tmp_root: str
) -> None:
    keys = [f"key-{index:03d}" for index in range(64)]
    groups_of_16 = key_groups_of(spark, keys, 16)
    moved = sorted(key for key, group in groups_of_16.items() if group >= 8)
    directory = os.path.join(tmp_root, "pre-marker-input")
    checkpoint = os.path.join(tmp_root, "pre-marker-checkpoint")
    os.makedirs(directory)
    sink = Emitted()

    def start(key_groups: int, markers: bool = True) -> None:
        operator = Deduplicate("k", "1 hour", event_time="ts", key_groups=key_groups)
        operator.emit_settings_markers = markers
        result = operator.apply(with_watermark(source(spark, directory)))
        run(result, checkpoint, "append", sink)

    def emitted_keys(batch_id: int) -> list[str]:
        return [row[0] for row in dict(sink.final())[batch_id]]

    with session_settings(spark, {NO_DATA_BATCHES: "false"}):
        # Written as before settings markers existed: no settings row in the state.
        write_batch(directory, 0, [*rows_of(keys[:48], T0), *rows_of(["ahead"], T0 + 500)])
        start(key_groups=8, markers=False)
        assert emitted_keys(0) == sorted([*keys[:48], "ahead"])
        assert -1 not in stored_key_groups(spark, checkpoint)

        # Same settings with markers: an empty batch, then a batch that records the settings.
        write_batch(directory, 1, [])
        write_batch(directory, 2, rows_of(keys, T0 + 501))
        start(key_groups=8)
        assert emitted_keys(1) == []
        assert emitted_keys(2) == keys[48:]
        assert stored_key_groups(spark, checkpoint)[0] == -1

        # 16 groups, a batch of known keys that all move to empty groups, led by a late row
        # (dropped by Spark, and the row each partition's marker is copied from).
        write_batch(directory, 3, [*rows_of(["too-late"], T0), *rows_of(moved, T0 + 600)])
        with pytest.raises(Exception) as error:
            start(key_groups=16)
        assert CHANGED_KEY_GROUPS_ERROR.format(operator="deduplicate") in str(error.value)
    assert 3 not in dict(sink.attempts)


EVENT_TTL_CASES = {
    "running_count": (
        lambda df: running_count(df, "k", key_groups=4, ttl="10 seconds", ttl_time="event"),
        [
            [("x", 2, (0, 0)), ("y", 1, (0, 0))],
            [("z", 1, (1, 0))],
            [("x", 1, (2, 0)), ("z", 2, (1, 1))],
            [("z", 3, (1, 2))],
        ],
    ),
    "running_aggregate": (
        lambda df: running_aggregate(
            df, "k", {"v": "sum"}, key_groups=4, ttl="10 seconds", ttl_time="event"
        ),
        [
            [("x", 4.0, (0, 0)), ("y", 2.0, (0, 0))],
            [("z", 2.0, (1, 0))],
            [("x", 2.0, (2, 0)), ("z", 4.0, (1, 1))],
            [("z", 6.0, (1, 2))],
        ],
    ),
}
"""Per batch, the rows (key, value, (batch that started the key's life, batches since)):
with ttl a life's version starts at its first batch's timestamp (ms)."""
EVENT_TTL_BATCHES = [
    [("x", 0), ("y", 1), ("x", 2)],  # expiries: x T0+12 s, y T0+11 s
    [("z", 20)],  # watermark T0-3 s: nothing expires
    [("x", 21), ("z", 21)],  # watermark T0+15 s: x and y expired, x starts again
    [("z", 5)],  # late (watermark T0+16 s): counted, z's expiry stays T0+31 s
]


@pytest.mark.parametrize("name", sorted(EVENT_TTL_CASES))
def test_event_time_ttl_forgets_a_key_once_the_watermark_passes_its_latest_event(
    spark: SparkSession, tmp_root: str, name: str
) -> None:
    """Four batches, the query restarted after the second: y and x expire when the
    watermark passes their latest event + 10 s (x starts again from nothing), and a row
    behind the watermark still counts without moving its key's expiry back."""
    build, expected = EVENT_TTL_CASES[name]
    directory = os.path.join(tmp_root, f"{name}-event-ttl-input")
    checkpoint = os.path.join(tmp_root, f"{name}-event-ttl-checkpoint")
    os.makedirs(directory)
    sink = Emitted()

    def start() -> None:
        with session_settings(spark, {NO_DATA_BATCHES: "false"}):
            run(build(with_watermark(source(spark, directory))), checkpoint, "update", sink)

    with pytest.raises(OperatorDefinitionError) as error:
        build(source(spark, directory))
    assert str(error.value) == (
        f"{name}: ttl_time='event' needs a watermark on the input; call"
        f' df.withWatermark("<event-time column>", "<delay>") before {name}'
    )
    for index, rows in enumerate(EVENT_TTL_BATCHES):
        write_batch(directory, index, [{"k": k, "n": 1, "v": 2.0, "t": T0 + s} for k, s in rows])
        if index in (1, 3):
            start()
    versioned = [
        [(*row[:-1], batch_timestamp_ms(checkpoint, row[-1][0]) + row[-1][1]) for row in rows]
        for rows in expected
    ]
    assert sink.final() == list(enumerate(versioned))
    state = read_state(spark, checkpoint)
    assert dict(zip(state["k"], state[EXPIRES_COLUMN], strict=True)) == {
        "x": (T0 + 31) * 1000,
        "z": (T0 + 31) * 1000,
    }
