"""``python -m benchmarks [--quick] [--only NAME ...]``: the pack against its baselines.

Every benchmark runs its contenders in the same process, on the same data and the same
embedded services, and reports medians of the repetitions after one warm-up. Results go
to ``benchmarks/results/<date>.md`` and the summary table into README.md.
"""

from __future__ import annotations

import argparse
import datetime
import re
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks.harness import Report, say

ROOT = Path(__file__).resolve().parent.parent
ALL = ("source", "jdbc", "latency", "stateful", "recovery", "s3", "e2e")
README_START, README_END = "<!-- benchmarks:start -->", "<!-- benchmarks:end -->"


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small sizes, one repetition, without the end-to-end benchmark (under 3 minutes)",
    )
    parser.add_argument("--only", nargs="+", choices=ALL, default=None)
    parser.add_argument("--repetitions", type=int, default=None)
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--no-readme", action="store_true", help="do not update README.md")
    return parser.parse_args()


def main() -> int:
    arguments = parse_arguments()
    quick = arguments.quick
    repetitions = arguments.repetitions or (1 if quick else 3)
    selected = set(arguments.only or ALL)
    if quick and arguments.only is None:
        selected.discard("e2e")
    started = time.monotonic()
    from benchmarks import jdbc_sink, kafka_source, pipeline, s3_sink, stateful
    from eospack.services import start_kafka, start_postgres, start_s3
    from eospack.spark import local_session

    workdir = Path(tempfile.mkdtemp(prefix="eospack-bench-"))
    report = Report()
    services = []
    say("starting services and Spark (local[2])")
    try:
        kafka = start_kafka()
        services.append(kafka)
        postgres = start_postgres()
        services.append(postgres)
        s3 = start_s3(bucket="eospack-bench")
        services.append(s3)
        conf = {}
        if jdbc_sink.POSTGRES_JDBC_JAR.exists():
            conf["spark.jars"] = str(jdbc_sink.POSTGRES_JDBC_JAR)
        spark = local_session(app_name="eospack-benchmarks", conf=conf)
        bootstrap = kafka.endpoint.bootstrap_servers

        if "source" in selected:
            sizes = [100_000] if quick else [100_000, 300_000, 1_000_000]
            kafka_source.run(report, spark, bootstrap, sizes, repetitions)
        if "jdbc" in selected:
            sizes = [100_000] if quick else [100_000, 300_000, 1_000_000]
            jdbc_sink.run(report, spark, postgres, workdir, sizes, repetitions)
        if "latency" in selected:
            jdbc_sink.commit_latency(report, spark, postgres, workdir, 20 if quick else 100)
        if "stateful" in selected:
            rows, keys = (100_000, 1_000) if quick else (1_000_000, 10_000)
            stateful.run(report, spark, workdir, rows, keys, repetitions)
        if "s3" in selected:
            s3_sink.run(report, spark, s3, workdir, 100_000 if quick else 1_000_000, repetitions)
        if "recovery" in selected:
            pipeline.recovery(report, bootstrap, postgres, repetitions, warm_up=not quick)
        if "e2e" in selected:
            events = 20_000 if quick else 150_000
            pipeline.end_to_end(report, bootstrap, postgres, events, repetitions)
        elif quick and arguments.only is None:
            report.notes.append(
                "end to end (7) is left out of quick runs: its two pipeline launches take"
                " over a minute (`--quick --only e2e` runs it small)"
            )
    finally:
        for service in reversed(services):
            service.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    minutes = (time.monotonic() - started) / 60
    report.notes.append(
        f"{'quick' if quick else 'full'} run, {repetitions} repetition(s), {minutes:.1f} min"
    )
    today = datetime.date.today().isoformat()
    output = (
        arguments.output
        or ROOT / "benchmarks" / "results" / f"{today}{'-quick' if quick else ''}.md"
    )
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(report.markdown(f"eospack benchmarks, {today}"), encoding="utf-8")
    say(f"results written to {output}")
    if not arguments.no_readme:
        update_readme(report, output)
    print(report.summary_table())
    return 0


def update_readme(report: Report, output: Path) -> None:
    readme = ROOT / "README.md"
    text = readme.read_text(encoding="utf-8")
    if README_START not in text:
        return
    summary = (
        f"{README_START}\nFrom `{output.relative_to(ROOT)}` (medians after a warm-up; ratio ="
        f" eospack / baseline; for recovery a ratio of times, lower is better):\n\n"
        f"{report.summary_table()}\n{README_END}"
    )
    pattern = re.escape(README_START) + ".*?" + re.escape(README_END)
    readme.write_text(re.sub(pattern, lambda _: summary, text, flags=re.DOTALL), encoding="utf-8")


if __name__ == "__main__":
    raise SystemExit(main())
