"""The ``eospack`` command: ``eospack services up|fetch``, ``eospack demo``, ``eospack doctor``."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence


def services_up(_: argparse.Namespace) -> int:
    """Start the broker, PostgreSQL and S3, print their settings, run until Ctrl-C."""
    from eospack.services import start_kafka, start_postgres, start_s3

    started = []
    try:
        print("starting kafka broker ...", flush=True)
        started.append(kafka := start_kafka())
        print("starting postgresql ...", flush=True)
        started.append(postgres := start_postgres())
        print("starting s3 endpoint ...", flush=True)
        started.append(s3 := start_s3())
        print(
            "\n".join(
                [
                    "",
                    f"kafka.bootstrap.servers  {kafka.endpoint.bootstrap_servers}",
                    f"postgresql url           {postgres.endpoint.url}",
                    f"postgresql jdbc url      {postgres.endpoint.jdbc_url}"
                    f"  (user {postgres.endpoint.user})",
                    f"s3 endpointUrl           {s3.endpoint.endpoint_url}"
                    f"  (bucket {s3.endpoint.bucket}, region {s3.endpoint.region})",
                    f"s3 accessKeyId           {s3.endpoint.access_key_id}",
                    "s3 secretAccessKey       (test credentials: see eospack/services/embedded.py)",
                    "",
                    "running; press Ctrl-C to stop",
                ]
            ),
            flush=True,
        )
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass
    finally:
        for service in reversed(started):
            service.stop()
        print("stopped", flush=True)
    return 0


def services_fetch(_: argparse.Namespace) -> int:
    """Fetch the jar sets (Apache Kafka, Spark's Kafka connector) with mvn, output shown;
    once, then cached."""
    from eospack.services import ServiceStartError
    from eospack.services.maven import ARTIFACT_SETS, resolve_classpath

    try:
        for name in ARTIFACT_SETS:
            jars = resolve_classpath(name, progress=sys.stdout)
            print(f"{name}: {len(jars)} jars ready ({jars[0].name}, ...)", flush=True)
    except ServiceStartError as error:
        print(error, file=sys.stderr, flush=True)
        return 1
    return 0


def services(arguments: argparse.Namespace) -> int:
    return services_fetch(arguments) if arguments.action == "fetch" else services_up(arguments)


def demo(arguments: argparse.Namespace) -> int:
    from eospack.demo import run_demo

    return run_demo(arguments)


def doctor(_: argparse.Namespace) -> int:
    from eospack.doctor import run_doctor

    return run_doctor()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eospack", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    services_parser = commands.add_parser(
        "services",
        help="run the embedded services (up), or fetch the Apache Kafka and Spark Kafka"
        " connector jars with mvn into the cache (fetch)",
    )
    services_parser.add_argument("action", choices=["up", "fetch"])
    services_parser.set_defaults(handler=services)

    from eospack.demo import add_demo_arguments

    demo_parser = commands.add_parser(
        "demo", help="crash-and-recover demonstration of exactly-once counting"
    )
    add_demo_arguments(demo_parser)
    demo_parser.set_defaults(handler=demo)

    doctor_parser = commands.add_parser(
        "doctor",
        help="check, without starting Spark, that Java fits and that Spark's automatic lookup"
        " finds eospack's formats",
    )
    doctor_parser.set_defaults(handler=doctor)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = build_parser().parse_args(argv)
    return int(arguments.handler(arguments))


if __name__ == "__main__":
    sys.exit(main())
