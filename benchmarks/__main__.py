"""``python -m benchmarks [--quick] [--only NAME ...]``: the pack against its baselines.

Every benchmark runs its contenders in the same process, on the same data and the same
embedded services, and reports medians of the repetitions after one warm-up. Spark's own
JVM connectors are the peers: ``format("kafka")`` for the source, Spark's JDBC writer for
2pc-jdbc (with MariaDB's driver into MariaDB), the Parquet file sink on S3A for 2pc-s3 and
``format("kafka")`` for 2pc-kafka; their jars (``spark-kafka``, ``postgresql-jdbc``,
``mariadb-jdbc``, ``hadoop-aws``) come through mvn on first use, and a peer whose jars
cannot be resolved is left out with a note. Results go to
``benchmarks/results/<date>.md``; the run becomes the current one of its benchmarks in
``benchmarks/results/summary.json`` and ``docs/performance.md``'s tables are regenerated
from the results files (``python -m benchmarks.report``; ``--no-docs`` leaves both alone).
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.harness import Report, say

ROOT = Path(__file__).resolve().parent.parent
ALL = (
    "source",
    "jdbc",
    "jdbc-mariadb",
    "jdbc-changes",
    "latency",
    "stateful",
    "sparse-state",
    "recovery",
    "s3",
    "e2e",
    "event-latency",
    "kafka-sink",
    "fixed-cost",
    "micro-batch",
    "metrics",
)
ON_DEMAND = ("rolling-restart", "savepoints", "bounded-state")
"""Benchmarks only ``--only`` runs: they start services or Spark sessions of their own (a
3-node cluster; a session per savepoint size, 10M keys take about 15 minutes; a 30-minute
stream for bounded state)."""


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small sizes, one repetition, without the end-to-end benchmark (under 4 minutes)",
    )
    parser.add_argument("--only", nargs="+", choices=ALL + ON_DEMAND, default=None)
    parser.add_argument(
        "--rate",
        type=int,
        default=5000,
        help="events/s offered to the rolling-restart benchmark (default 5000, issue 37's goal)",
    )
    bounded = parser.add_argument_group("bounded-state (issue 41's goal by default)")
    bounded.add_argument(
        "--minutes", type=_positive(float), default=30.0, help="how long it runs (default 30)"
    )
    bounded.add_argument(
        "--keys-per-period",
        type=_positive(int),
        default=1_000_000,
        help="new keys offered per period (default 1,000,000); the goal is twice as many",
    )
    bounded.add_argument(
        "--ttl",
        type=_duration_seconds,
        default=300.0,
        help='running_count\'s processing-time ttl (default "5 minutes")',
    )
    bounded.add_argument(
        "--period",
        type=_duration_seconds,
        default=None,
        help="the period of --keys-per-period (default: the ttl, as in the goal)",
    )
    parser.add_argument("--repetitions", type=int, default=None)
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument(
        "--no-docs",
        "--no-readme",  # its name while the summary was in README.md
        dest="no_docs",
        action="store_true",
        help="do not update the summary in docs/performance.md",
    )
    return parser.parse_args()


def main() -> int:
    arguments = parse_arguments()
    quick = arguments.quick
    repetitions = arguments.repetitions or (1 if quick else 3)
    selected = set(arguments.only or ALL)
    if quick and arguments.only is None:
        selected.discard("e2e")
        selected.discard("metrics")
    started = time.monotonic()
    from benchmarks import (
        bounded_state,
        fixed_cost,
        jdbc_changes,
        jdbc_mariadb,
        jdbc_sink,
        kafka_sink,
        kafka_source,
        latency,
        micro_batch,
        pipeline,
        rolling_restart,
        s3_sink,
        savepoints,
        sparse_state,
        stateful,
    )
    from eospack.lab.services import start_kafka, start_mariadb, start_postgres, start_s3
    from eospack.tools.spark import local_session

    workdir = Path(tempfile.mkdtemp(prefix="eospack-bench-"))
    report = Report()
    services = []
    report.notes.append(f"load average at the start: {_load_average()}")
    if "rolling-restart" in selected:
        try:
            rolling_restart.run(report, arguments.rate)
        except Exception as error:  # the row reports what failed; the other rows still run
            report.notes.append(f"rolling restart: FAILED: {error}")
            say(f"rolling restart: FAILED: {error}")
    if "savepoints" in selected:
        savepoints.run(report, [100_000] if quick else [1_000_000, 10_000_000])
    if "bounded-state" in selected:
        load = bounded_state.Load(
            minutes=arguments.minutes,
            keys_per_period=arguments.keys_per_period,
            period_seconds=arguments.period or arguments.ttl,
            ttl_seconds=arguments.ttl,
        )
        bounded_state.run(report, load, _load_average)
    shared = bool(selected - set(ON_DEMAND))
    if shared:
        say("starting services and Spark (local[2])")
    try:
        if not shared:
            raise _NothingShared
        kafka = start_kafka()
        services.append(kafka)
        postgres = start_postgres()
        services.append(postgres)
        s3 = start_s3(bucket="eospack-bench")
        services.append(s3)
        conf = {}
        jars = {}
        for name, wanted in (
            (
                "spark-kafka",
                {"source", "recovery", "kafka-sink", "fixed-cost", "micro-batch", "event-latency"},
            ),
            ("hadoop-aws", {"s3"}),
            ("postgresql-jdbc", {"jdbc", "recovery", "micro-batch", "event-latency"}),
            ("mariadb-jdbc", {"jdbc-mariadb"}),
        ):
            if wanted & selected:
                jars[name] = peer_jars(name, report)
        if jars.get("hadoop-aws"):
            conf.update(s3_sink.s3a_settings(s3.endpoint))
        event_log = workdir / "event-log"
        if "micro-batch" in selected:
            event_log.mkdir()
            conf.update(micro_batch.event_log_settings(event_log))
        session_started = time.monotonic()
        spark = local_session(
            app_name="eospack-benchmarks",
            conf=conf,
            extra_jars=[jar for names in jars.values() for jar in names],
        )
        report.notes.append(
            f"Spark session start: {time.monotonic() - session_started:.1f} s with the peers'"
            f" jars ({', '.join(name for name, found in jars.items() if found) or 'none'})"
        )
        bootstrap = kafka.endpoint.bootstrap_servers

        if "source" in selected:
            sizes = [100_000] if quick else [1_000_000, 10_000_000]
            kafka_source.run(
                report,
                spark,
                bootstrap,
                sizes,
                repetitions,
                spark_kafka=bool(jars.get("spark-kafka")),
                codec_size=100_000 if quick else 1_000_000,
                tuple_output=not quick,
            )
            if quick:
                report.notes.append(
                    "source: the tuple-output contender is measured in full runs only"
                )
        if "fixed-cost" in selected and "source" not in selected:
            # The source benchmark measures the same row after its large topics.
            fixed_cost.run(
                report, spark, bootstrap, repetitions, spark_kafka=bool(jars.get("spark-kafka"))
            )
        if "jdbc" in selected:
            sizes = [100_000] if quick else [100_000, 300_000, 1_000_000]
            jdbc_sink.run(
                report,
                spark,
                postgres,
                workdir,
                sizes,
                repetitions,
                spark_writer=bool(jars.get("postgresql-jdbc")),
            )
        if "jdbc-mariadb" in selected:
            mariadb = start_mariadb()
            services.append(mariadb)
            jdbc_mariadb.run(
                report,
                spark,
                mariadb,
                workdir,
                [100_000] if quick else [100_000, 300_000, 1_000_000],
                repetitions,
                spark_writer=bool(jars.get("mariadb-jdbc")),
            )
        if "jdbc-changes" in selected:
            jdbc_changes.run(
                report, spark, postgres, workdir, 100_000 if quick else 1_000_000, repetitions
            )
        if "latency" in selected:
            jdbc_sink.commit_latency(report, spark, postgres, workdir, 20 if quick else 100)
        if "stateful" in selected:
            rows, keys = (100_000, 1_000) if quick else (1_000_000, 10_000)
            stateful.run(report, spark, workdir, rows, keys, repetitions)
        if "sparse-state" in selected:
            sparse_state.run(report, spark, workdir, 100_000 if quick else 1_000_000)
        if "s3" in selected:
            rows = 100_000 if quick else 1_000_000
            s3_sink.run(
                report, spark, s3, workdir, rows, repetitions, s3a=bool(jars.get("hadoop-aws"))
            )
        if "kafka-sink" in selected:
            rows = 100_000 if quick else 1_000_000
            kafka_sink.run(
                report,
                spark,
                bootstrap,
                workdir,
                rows,
                repetitions,
                spark_kafka=bool(jars.get("spark-kafka")),
            )
        if "recovery" in selected:
            peer = [*jars.get("spark-kafka", []), *jars.get("postgresql-jdbc", [])]
            if not (jars.get("spark-kafka") and jars.get("postgresql-jdbc")):
                report.notes.append("recovery: Spark's own pipeline left out (jars missing)")
                peer = []
            pipeline.recovery(
                report, bootstrap, postgres, repetitions, warm_up=not quick, peer_jars=peer
            )
        if "micro-batch" in selected:
            micro_batch.run(
                report,
                spark,
                bootstrap,
                postgres,
                workdir,
                event_log,
                batches=5 if quick else 10,
                spark_peer=bool(jars.get("spark-kafka") and jars.get("postgresql-jdbc")),
            )
        if "event-latency" in selected:
            latency_peer = [*jars.get("spark-kafka", []), *jars.get("postgresql-jdbc", [])]
            if not (jars.get("spark-kafka") and jars.get("postgresql-jdbc")):
                latency_peer = []
            latency.run(report, bootstrap, postgres, quick, latency_peer)
        if "e2e" in selected:
            events = 20_000 if quick else 150_000
            pipeline.end_to_end(report, bootstrap, postgres, events, repetitions)
        if "metrics" in selected:
            events = 20_000 if quick else 150_000
            pipeline.metrics_overhead(report, bootstrap, postgres, events, repetitions)
        elif quick and arguments.only is None:
            report.notes.append(
                "end to end (7) and metrics overhead (15) are left out of quick runs: their"
                " pipeline launches take over a minute each (`--quick --only e2e metrics` runs"
                " them small)"
            )
    except _NothingShared:
        pass
    finally:
        for service in reversed(services):
            service.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    minutes = (time.monotonic() - started) / 60
    report.notes.append(f"load average at the end: {_load_average()}")
    report.notes.append(
        f"{'quick' if quick else 'full'} run, {repetitions} repetition(s), {minutes:.1f} min"
    )
    today = datetime.date.today().isoformat()
    output = (
        arguments.output
        or ROOT
        / "benchmarks"
        / "results"
        / f"{today}{'-quick' if quick else ''}{'' if shared else '-on-demand'}.md"
    )
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(report.markdown(f"eospack benchmarks, {today}"), encoding="utf-8")
    say(f"results written to {output}")
    if not arguments.no_docs and shared:  # on-demand rows are kept by hand in the page
        update_performance_page(report, output)
    print(report.summary_table())
    return 0


class _NothingShared(Exception):
    """Only on-demand benchmarks were selected: no shared services or Spark session."""


def peer_jars(name: str, report: Report) -> list[Path]:
    """The jars of a JVM peer's set, fetched with mvn on first use; [] with a note if not."""
    from eospack.lab.services import ServiceStartError
    from eospack.lab.services.maven import is_cached, mvn_executable, resolve_classpath

    if not is_cached(name) and mvn_executable() is None:
        report.notes.append(
            f"jar set {name} is not cached and mvn was not found: its peer is left out"
        )
        return []
    if not is_cached(name):
        say(f"fetching jar set {name} with mvn (first use only)")
    try:
        return resolve_classpath(name)
    except ServiceStartError as error:
        report.notes.append(f"{error}: its peer is left out")
        return []


def _positive(kind: type[float] | type[int]) -> Callable[[str], float]:
    """An argparse type: a positive number of ``kind``, else a one-line error."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be positive")
        return value

    return parse


def _duration_seconds(text: str) -> float:
    from benchmarks.bounded_state import duration_seconds

    return duration_seconds(text)


def _load_average() -> str:
    """1, 5 and 15 minute load averages: other processes on the machine distort timings."""
    return ", ".join(f"{load:.2f}" for load in os.getloadavg()) + f" ({os.cpu_count()} cores)"


def update_performance_page(report: Report, output: Path) -> None:
    """Make this run the current one for the benchmarks it compared, in
    ``benchmarks/results/summary.json``, and regenerate the page's tables from the results
    files (``benchmarks.report``: the page is made from results only)."""
    from benchmarks import report as page

    numbers = sorted({page.benchmark_number(f"| {c.benchmark} |") for c in report.comparisons})
    if not numbers or output.resolve().parent != page.RESULTS:
        return  # the page names results files of benchmarks/results/ only
    command = " ".join(["python -m benchmarks", *sys.argv[1:]])
    page.record_run(output, numbers, f"`{command}`")
    page.write_page()


if __name__ == "__main__":
    raise SystemExit(main())
