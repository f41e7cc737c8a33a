"""The ``eospack`` command: ``eospack services up|fetch``, ``eospack demo``, ``eospack doctor``,
``eospack supervise MODULE:FUNCTION``, ``eospack checkpoint inspect PATH``."""

from __future__ import annotations

import argparse
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from typing import Any, Literal

from eospack.tools.formats import entry_of, inspectable_sinks

WELL_KNOWN_PORTS = {"kafka": 9092, "postgresql": 5432, "mariadb": 3306, "s3": 9000}
"""What docker-compose.yml publishes, so that examples written for it run as written."""

COMPOSE_CREDENTIALS = {
    "postgresql": ("postgres", "postgres"),
    "mariadb": ("eospack", "eospack"),
    "s3": ("minioadmin", "minioadmin"),
}
"""docker-compose.yml's user/password pairs. The embedded PostgreSQL trusts every local
connection (any password is accepted) and the embedded S3 accepts any keys, so printing
these keeps one set of settings for both; the embedded MariaDB makes the same user as
docker-compose.yml's MySQL."""


def well_known_or_free_port(preferred: int, host: str = "127.0.0.1") -> tuple[int, str | None]:
    """``preferred`` when nothing listens there, else a free port and one line saying so.

    The port is checked by binding it, then released for the service: another process
    may take it in between, and the service's start then fails naming the port.
    """
    from eospack.lab.services.base import free_port

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, preferred))
        except OSError:
            port = free_port(host)
            return port, f"port {preferred} is taken, so this one listens on {port} instead"
    return preferred, None


def start_services(
    ports: dict[str, int] | None = None, kafka_brokers: int = 1, kafka_security: str = "none"
) -> tuple[list[Any], list[str]]:
    """Start Kafka, PostgreSQL, MariaDB (if ``ports`` names ``mariadb``) and S3 on ``ports``
    (default ``WELL_KNOWN_PORTS``, each one taken falling back to a free port), returning
    the services and their settings' lines.
    ``kafka_brokers`` > 1 or ``kafka_security="sasl_ssl"``: Apache Kafka as production runs
    it, on free ports (``eospack.lab.services.kafka_cluster``).
    A failure stops what was started and raises ``ServiceStartError``."""
    from eospack.lab.services import (
        services_mode,
        start_kafka,
        start_mariadb,
        start_postgres,
        start_s3,
    )

    preferred = ports or WELL_KNOWN_PORTS
    chosen: dict[str, int | None] = {}
    notes: dict[str, str] = {}
    for name, port in preferred.items():
        if services_mode() == "docker":
            chosen[name] = None
            continue
        chosen[name], note = well_known_or_free_port(port)
        if note:
            notes[name] = f"  ({note})"
    started: list[Any] = []
    try:
        print("starting kafka broker ...", flush=True)
        production = kafka_brokers != 1 or kafka_security != "none"
        if production:
            from eospack.lab.services.kafka_cluster import start_production_kafka

            started.append(kafka := start_production_kafka(kafka_brokers, kafka_security))
        else:
            started.append(kafka := start_kafka(port=chosen["kafka"]))
        print("starting postgresql ...", flush=True)
        started.append(postgres := start_postgres(port=chosen["postgresql"]))
        mariadb = None
        if "mariadb" in preferred:
            print("starting mariadb ...", flush=True)
            started.append(
                mariadb := start_mariadb(
                    port=chosen["mariadb"], credentials=COMPOSE_CREDENTIALS["mariadb"]
                )
            )
        print("starting s3 endpoint ...", flush=True)
        started.append(s3 := start_s3(port=chosen["s3"], credentials=COMPOSE_CREDENTIALS["s3"]))
    except BaseException:
        for service in reversed(started):
            service.stop()
        raise
    user, password = COMPOSE_CREDENTIALS["postgresql"]
    endpoint = postgres.endpoint
    if endpoint.password:
        user, password = endpoint.user, endpoint.password
    # Without the password: 2pc-jdbc refuses a url that carries one (it would show in plans).
    url = f"postgresql://{user}@{endpoint.host}:{endpoint.port}/{endpoint.database}"
    lines = [
        f"kafka.bootstrap.servers  {kafka.endpoint.bootstrap_servers}{notes.get('kafka', '')}",
        f"postgresql url           {url}  (password {password}: export PGPASSWORD for a server"
        f" that asks){notes.get('postgresql', '')}",
        f"postgresql jdbc url      {endpoint.jdbc_url}  (user {user}, password {password})",
        f"s3 endpointUrl           {s3.endpoint.endpoint_url}"
        f"  (bucket {s3.endpoint.bucket}, region {s3.endpoint.region}){notes.get('s3', '')}",
        f"s3 accessKeyId           {s3.endpoint.access_key_id}",
        f"s3 secretAccessKey       {s3.endpoint.secret_access_key}"
        "  (local test credentials, as docker-compose.yml's)",
    ]
    if mariadb is not None:
        maria = mariadb.endpoint
        lines.insert(
            3,
            f"mariadb jdbc url         {maria.jdbc_url}  (user {maria.user}, password"
            f" {maria.password}){notes.get('mariadb', '')}",
        )
    if production:
        from eospack.lab.services.kafka_cluster import settings_lines

        lines[:1] = settings_lines(kafka)
    return started, lines


def services_up(arguments: argparse.Namespace) -> int:
    """Start the broker, PostgreSQL, MariaDB and S3 on docker-compose.yml's ports where they are
    free, print their settings, run until Ctrl-C."""
    started, lines = start_services(
        kafka_brokers=arguments.kafka_brokers, kafka_security=arguments.kafka_security
    )
    try:
        print("\n".join(["", *lines, "", "running; press Ctrl-C to stop"]), flush=True)
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
    """Fetch the jar sets (Apache Kafka, Spark's Kafka connector, the MariaDB server) with
    mvn, output shown; once, then cached."""
    from eospack.lab.services import ServiceStartError
    from eospack.lab.services.maven import ARTIFACT_SETS, resolve_classpath

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
    from eospack.lab.demo import run_demo

    return run_demo(arguments)


def doctor(arguments: argparse.Namespace) -> int:
    from eospack.tools.doctor import java_check, run_doctor

    if not arguments.session or not java_check().passed:
        return run_doctor()
    from pyspark import SparkContext

    from eospack.tools.spark import local_session

    started_here = SparkContext._active_spark_context is None
    spark = local_session(app_name="eospack-doctor")
    try:
        return run_doctor(spark=spark)
    finally:
        if started_here:
            spark.stop()


DURATION_UNITS_SECONDS = {"ms": 0.001, "s": 1.0, "min": 60.0, "h": 3600.0}


def duration_seconds(text: str) -> float:
    """``500ms``, ``10s``, ``2min`` or ``1h`` as seconds (argparse type)."""
    number = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = text[len(number) :]
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in DURATION_UNITS_SECONDS or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: use e.g. 500ms, 10s, 2min")
    return value * DURATION_UNITS_SECONDS[unit]


def supervise(arguments: argparse.Namespace) -> int:
    """Import MODULE:FUNCTION, run the queries it starts, restart them by the strategy."""
    import importlib
    import logging

    from eospack.tools.supervisor import (
        ExponentialDelay,
        FailureRate,
        FixedDelay,
        PermanentQueryError,
        RestartsExhaustedError,
        RestartStrategy,
    )
    from eospack.tools.supervisor import supervise as run_supervised

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    module_name, _, function_name = arguments.target.partition(":")
    if not module_name or not function_name:
        print(f"eospack supervise: {arguments.target!r} is not MODULE:FUNCTION", file=sys.stderr)
        return 2
    sys.path.insert(0, ".")
    start_queries = getattr(importlib.import_module(module_name), function_name)
    strategy: RestartStrategy
    try:
        if arguments.strategy == "fixed-delay":
            attempts = 3 if arguments.attempts is None else arguments.attempts
            strategy = FixedDelay(attempts, arguments.delay)
        elif arguments.strategy == "exponential-delay":
            strategy = ExponentialDelay(
                arguments.initial_backoff,
                arguments.max_backoff,
                arguments.backoff_multiplier,
                arguments.reset_backoff_after,
                arguments.attempts,
            )
        else:
            strategy = FailureRate(
                arguments.max_failures_per_interval,
                arguments.failure_rate_interval,
                arguments.delay,
            )
    except ValueError as error:
        print(f"eospack supervise: {error}", file=sys.stderr)
        return 2
    try:
        restarts = run_supervised(start_queries, strategy)
    except (PermanentQueryError, RestartsExhaustedError) as error:
        print(f"eospack supervise: {error}", file=sys.stderr)
        return 1
    print(f"eospack supervise: the queries ended after {restarts} restarts", flush=True)
    return 0


def checkpoint(arguments: argparse.Namespace) -> int:
    """Print what a checkpoint holds (and a 2pc sink's decisions and leftovers).

    Each sink's options are parsed by the sink's own parser (``eospack.tools.formats``) before
    anything is read, so a bad option is the sink's one line naming it and its fix."""
    from eospack.core.checkpoint_files import is_local
    from eospack.tools.checkpoint import CheckpointInspectError, inspect_checkpoint

    try:
        sinks = inspected_sinks(arguments)
        for sink_format, options in sinks.items():
            entry_of(sink_format).parse(options)
    except (ValueError, OSError) as error:
        print(f"eospack checkpoint inspect: {error}", file=sys.stderr)
        return 2
    spark = None
    try:
        conf = spark_settings(arguments.conf)
    except ValueError as error:
        print(f"eospack checkpoint inspect: {error}", file=sys.stderr)
        return 2
    if arguments.state or not is_local(arguments.path):
        from eospack.tools.spark import local_session

        why = "operator state" if arguments.state else arguments.path
        print(f"eospack checkpoint inspect: reading {why} with Spark", file=sys.stderr)
        spark = local_session("eospack checkpoint inspect", conf=conf)
    try:
        report = inspect_checkpoint(arguments.path, spark=spark, sink_options=sinks)
    except (CheckpointInspectError, ValueError, ConnectionError, OSError) as error:
        print(f"eospack checkpoint inspect: {error}", file=sys.stderr)
        return 1
    print(report.to_json() if arguments.json else report.to_text(), flush=True)
    return 0


def inspected_sinks(arguments: argparse.Namespace) -> dict[str, dict[str, str]]:
    """Sink format -> the options ``checkpoint inspect`` reads it with: ``--format`` with
    its options (the deprecated flags of that format, then ``--option-file``, then each
    ``--option``: a later one wins, as in Spark's options), and each sink the deprecated
    flags name. Raises ``ValueError`` (one line, never a value) on a misused flag."""
    sinks = deprecated_flag_options(arguments)
    if arguments.format is None:
        if arguments.option or arguments.option_file:
            raise ValueError(
                "--option and --option-file need --format (the sink they are options of),"
                " e.g. --format 2pc-jdbc --option url=... --option dbtable=..."
            )
        return sinks
    known = [entry.name for entry in inspectable_sinks()]
    if arguments.format not in known:
        raise ValueError(
            f"--format {arguments.format!r} is not a sink that inspect reads: use one of"
            f" {', '.join(known)}"
        )
    options = dict(sinks.get(arguments.format, {}))
    if arguments.sink_id:
        options["sinkId"] = arguments.sink_id
    if arguments.option_file:
        options.update(option_file(arguments.option_file))
    options.update(option_arguments(arguments.option))
    sinks[arguments.format] = options
    return sinks


def option_arguments(arguments: Sequence[str]) -> dict[str, str]:
    """``--option KEY=VALUE`` arguments as sink options, a later key winning; an argument
    without ``=`` is refused by its position (neither key nor value is quoted: either could
    be a secret written in the wrong place)."""
    options = {}
    for number, argument in enumerate(arguments, start=1):
        key, separator, value = argument.partition("=")
        if not separator or not key.strip():
            raise ValueError(
                f"--option number {number} is not KEY=VALUE: give one sink option each,"
                " e.g. --option dbtable=orders"
            )
        options[key.strip()] = value
    return options


def option_file(path: str) -> dict[str, str]:
    """``key=value`` lines of ``path`` as sink options (blank lines and ``#`` comments
    skipped; keys and values stripped; a later line wins), so secrets need not be
    arguments. Errors name the line, never its text (it may hold a password)."""
    options = {}
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            key, separator, value = text.partition("=")
            if not separator or not key.strip():
                raise ValueError(
                    f"{path} line {number} is not key=value: write one sink option per line"
                    " (# starts a comment)"
                )
            options[key.strip()] = value.strip()
    return options


def deprecated_flag_options(arguments: argparse.Namespace) -> dict[str, dict[str, str]]:
    """The options the deprecated sink flags (``--jdbc-url``, ``--s3-path``,
    ``--kafka-bootstrap-servers`` and theirs) give, per sink format: each flag is an alias
    of one ``--option``. Kept for one release; they raise the same one-line refusals."""
    sinks: dict[str, dict[str, str]] = {}
    if arguments.ledger_table and not arguments.jdbc_url:
        raise ValueError("--ledger-table needs --jdbc-url")
    if arguments.jdbc_url or arguments.table:
        if not (arguments.jdbc_url and arguments.table):
            raise ValueError("give --jdbc-url and --table together")
        jdbc = {"url": arguments.jdbc_url, "dbtable": arguments.table}
        if arguments.user:
            jdbc["user"] = arguments.user
        if arguments.ledger_table:
            jdbc["ledgerTable"] = arguments.ledger_table
        if arguments.sink_id:
            jdbc["sinkId"] = arguments.sink_id
        sinks["2pc-jdbc"] = jdbc
    if arguments.s3_path:
        s3 = {"path": arguments.s3_path}
        for option, value in (
            ("endpointUrl", arguments.s3_endpoint_url),
            ("region", arguments.s3_region),
            ("sinkId", arguments.sink_id),
        ):
            if value:
                s3[option] = value
        sinks["2pc-s3"] = s3
    if arguments.kafka_bootstrap_servers:
        kafka = {"kafka.bootstrap.servers": arguments.kafka_bootstrap_servers}
        for option, value in (
            ("topic", arguments.topic),
            ("ledgerTopic", arguments.ledger_topic),
            ("sinkId", arguments.sink_id),
        ):
            if value:
                kafka[option] = value
        if arguments.kafka_command_config:
            kafka.update(kafka_command_config(arguments.kafka_command_config))
        sinks["2pc-kafka"] = kafka
    elif arguments.topic or arguments.ledger_topic or arguments.kafka_command_config:
        raise ValueError(
            "--topic, --ledger-topic and --kafka-command-config need --kafka-bootstrap-servers"
        )
    return sinks


def savepoint(arguments: argparse.Namespace) -> int:
    """Create a savepoint of a stopped query (with ``--stop``: stop a running one after its
    batch first), or prepare a new checkpoint from one."""
    from eospack.core.checkpoint_files import is_local
    from eospack.tools.savepoint import (
        SavepointError,
        create_savepoint,
        describe,
        restore_savepoint,
    )

    command = f"eospack savepoint {arguments.action}"
    try:
        conf = spark_settings(arguments.conf)
        mode = restore_mode(arguments)
        if arguments.stop and arguments.action != "create":
            raise ValueError("--stop is for create: drop it from restore")
        if arguments.timeout <= 0:
            raise ValueError(f"--timeout {arguments.timeout:g}: give a positive number of seconds")
    except ValueError as error:
        print(f"{command}: {error}", file=sys.stderr)
        return 2
    try:
        from eospack.tools.spark import local_session

        if arguments.action == "create" and arguments.stop:
            from eospack.tools.stop_with_savepoint import request_stop_with_savepoint

            spark = local_session("eospack savepoint", conf=conf)
            print(
                f"{command} --stop: asking the query on {arguments.source} to stop after its"
                f" batch (up to {arguments.timeout:g} s)",
                flush=True,
            )
            manifest = request_stop_with_savepoint(
                spark, arguments.source, arguments.target, arguments.timeout
            )
            print(f"{command}: wrote {arguments.target}\n{describe(manifest)}", flush=True)
        elif arguments.action == "create":
            print(f"{command}: reading the state of {arguments.source} with Spark", flush=True)
            manifest = create_savepoint(
                local_session("eospack savepoint", conf=conf), arguments.source, arguments.target
            )
            print(f"{command}: wrote {arguments.target}\n{describe(manifest)}", flush=True)
        else:
            spark = None
            if not (is_local(arguments.source) and is_local(arguments.target)):
                spark = local_session("eospack savepoint", conf=conf)
            manifest = restore_savepoint(
                arguments.source, arguments.target, mode, spark, arguments.allow_missing
            )
            state = restore_snippet(manifest.operators)
            allowed = (
                "\nMissing state allowed: savepoint operators the query does not claim are"
                " dropped, query operators without state start empty"
                if arguments.allow_missing
                else ""
            )
            print(
                f"{command}: {arguments.target} is ready ({mode})\n"
                f"{describe(manifest)}{allowed}\n"
                "Start the query with checkpointLocation set to it, taking its starting"
                " offsets and initial state from\n"
                f"  restored = eospack.RestoredCheckpoint({str(arguments.target)!r})\n"
                '  .option("startingOffsets", restored.starting_offsets())\n'
                f"{state}",
                flush=True,
            )
    except (SavepointError, OSError) as error:
        print(f"{command}: {error}", file=sys.stderr)
        return 1
    return 0


def restore_snippet(operators: Sequence[Any]) -> str:
    """How a restored query takes each savepoint operator's state, one line per operator
    with its own kind (``running_aggregate(...)``, not always ``running_count``): named ones
    through ``initial_states``, unnamed ones by position. With both, the names list
    stands at each position (operator id) of the query, None for an unnamed operator (which
    claims the savepoint's unnamed state there, else it would be refused as unclaimed)."""
    names: list[str | None] = [
        operator.operator_name for operator in operators if operator.operator_name
    ]
    if names and any(not operator.operator_name for operator in operators):
        by_position = {operator.operator_id: operator.operator_name for operator in operators}
        names = [by_position.get(position) or None for position in range(max(by_position) + 1)]
    lines = [f"  states = restored.initial_states({names!r})"] if names else []
    for operator in operators:
        if operator.operator_name:
            name = operator.operator_name
            lines.append(f"  {operator.name}(..., name={name!r}, initial_state=states[{name!r}])")
        else:
            position = "" if operator.operator_id == 0 else str(operator.operator_id)
            lines.append(
                f"  {operator.name}(..., initial_state=restored.initial_state({position}))"
            )
    return "\n".join(lines) or "  running_count(..., initial_state=restored.initial_state())"


def restore_mode(arguments: argparse.Namespace) -> Literal["no-claim", "claim"]:
    """The restore's ``--mode`` (default no-claim). ``--mode`` and ``--allow-missing`` given
    to create are refused: create has nothing to record them in, and a user who passed
    them would believe the savepoint carries them."""
    if arguments.action == "create":
        if arguments.allow_missing:
            raise ValueError(
                "--allow-missing is an option of restore (it is recorded in the new"
                " checkpoint); leave it out of create"
            )
        if arguments.mode is not None:
            raise ValueError("--mode is an option of restore; leave it out of create")
    return "claim" if arguments.mode == "claim" else "no-claim"


OBJECT_STORAGE_HELP = (
    "Paths are local paths, file:// URIs or any Hadoop file system URI (s3a://, abfss://,"
    " gs://, hdfs://), read and written through Spark's Hadoop file system: put the file"
    " system's jar on Spark's classpath (hadoop-aws for s3a, hadoop-azure for abfss,"
    " gcs-connector for gs) and its settings with --conf; credentials come from the file"
    " system's own chain (for s3a: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, a profile, an"
    " instance role), never an argument. See docs/operations.md, Checkpoints on object"
    " storage."
)


def spark_settings(settings: Sequence[str]) -> dict[str, str]:
    """``--conf KEY=VALUE`` arguments as Spark settings; an argument without ``=`` is
    refused by its key (a value is never quoted: it could be a secret)."""
    conf = {}
    for setting in settings:
        key, separator, value = setting.partition("=")
        if not separator or not key.strip():
            raise ValueError(
                f"--conf {key.strip()[:40]!r}... is not KEY=VALUE: give one Spark setting each"
            )
        conf[key.strip()] = value
    return conf


def add_conf_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting for the session eospack starts (repeatable), e.g."
        " spark.jars.packages=org.apache.hadoop:hadoop-aws:<Spark's Hadoop version> or"
        " spark.hadoop.fs.s3a.endpoint=...",
    )


def add_savepoint_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = OBJECT_STORAGE_HELP
    parser.add_argument("action", choices=["create", "restore"])
    parser.add_argument(
        "source",
        help="create: the stopped query's checkpointLocation; restore: the savepoint (a path"
        " or URI)",
    )
    parser.add_argument(
        "target",
        help="create: a new directory for the savepoint; restore: a new checkpoint (a path or URI)",
    )
    add_conf_argument(parser)
    parser.add_argument(
        "--mode",
        choices=["no-claim", "claim"],
        default=None,
        help="restore: no-claim copies the savepoint and never changes it (default); claim"
        " moves it into the new checkpoint, which owns it from then on",
    )
    parser.add_argument(
        "--allow-missing",
        action="store_true",
        help="restore: let the restored query drop the state of savepoint operators it does"
        " not name and start its operators the savepoint has no state for empty (Flink's"
        " --allowNonRestoredState); without it RestoredCheckpoint.initial_states refuses both",
    )
    parser.add_argument(
        "--stop",
        action="store_true",
        help="create: stop the query running on the checkpoint after its current batch, then"
        " write the savepoint (Flink's stop-with-savepoint); the query's driver must run"
        " eospack.honour_stop_requests(spark)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="create --stop: how long to wait for the query to stop (default 300)",
    )


def add_checkpoint_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = OBJECT_STORAGE_HELP
    parser.add_argument("action", choices=["inspect"])
    parser.add_argument(
        "path",
        help="the query's checkpointLocation: a path, a file:// URI, or a Hadoop file system"
        " URI such as s3a://bucket/prefix (read through Spark, which then starts)",
    )
    add_conf_argument(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument(
        "--state",
        action="store_true",
        help="also count each stateful_ops operator's keys and key groups (starts Spark)",
    )
    sink_names = ", ".join(entry.name for entry in inspectable_sinks())
    parser.add_argument(
        "--format",
        metavar="FORMAT",
        help=f"the sink the query writes to ({sink_names}): its decisions and leftovers are"
        " read with the options of --option and --option-file",
    )
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one of the sink's options, as the query set it (repeatable; a later one wins),"
        " e.g. --option url=jdbc:postgresql://db:5432/shop --option dbtable=orders; parsed"
        " by the sink itself, so a bad option is refused before anything is read",
    )
    parser.add_argument(
        "--option-file",
        metavar="FILE",
        help="a file of the sink's options, one KEY=VALUE a line (# comments), read before"
        " --option (which wins): the place for secrets (password, kafka.sasl.jaas.config,"
        " secretAccessKey), which are never printed",
    )
    parser.add_argument("--sink-id", help="the sink's sinkId option, if the query set one")
    deprecated = parser.add_argument_group(
        "deprecated sink flags",
        "Kept for one release, then removed: each is an alias of one --format/--option and"
        " goes through the same parsing.",
    )
    deprecated.add_argument(
        "--jdbc-url", help="deprecated: --format 2pc-jdbc --option url=URL (PostgreSQL or SQLite)"
    )
    deprecated.add_argument("--table", help="deprecated: --format 2pc-jdbc --option dbtable=TABLE")
    deprecated.add_argument(
        "--ledger-table", help="deprecated: --format 2pc-jdbc --option ledgerTable=TABLE"
    )
    deprecated.add_argument(
        "--user",
        help="deprecated: --format 2pc-jdbc --option user=USER (the password from"
        " EOSPACK_JDBC_PASSWORD or --option-file, never an argument)",
    )
    deprecated.add_argument(
        "--s3-path",
        help="deprecated: --format 2pc-s3 --option path=s3://bucket/prefix (credentials:"
        " boto3's default chain)",
    )
    deprecated.add_argument(
        "--s3-endpoint-url", help="deprecated: --format 2pc-s3 --option endpointUrl=URL"
    )
    deprecated.add_argument("--s3-region", help="deprecated: --format 2pc-s3 --option region=R")
    deprecated.add_argument(
        "--kafka-bootstrap-servers",
        help="deprecated: --format 2pc-kafka --option kafka.bootstrap.servers=HOST:PORT (the"
        " sink id follows the cluster's id, so the cluster must be up)",
    )
    deprecated.add_argument(
        "--topic",
        help="deprecated: --format 2pc-kafka --option topic=TOPIC; leave it out if the query"
        " wrote a topic column",
    )
    deprecated.add_argument(
        "--ledger-topic", help="deprecated: --format 2pc-kafka --option ledgerTopic=TOPIC"
    )
    deprecated.add_argument(
        "--kafka-command-config",
        metavar="FILE",
        help="deprecated: --format 2pc-kafka --option-file FILE with kafka.-prefixed keys; a"
        " properties file of the cluster's client settings (security.protocol, sasl.*, ssl.*)"
        " without the kafka. prefix, as Kafka's own tools take them",
    )


def kafka_command_config(path: str) -> dict[str, str]:
    """``key=value`` lines of a Kafka client properties file (``#`` and ``!`` comments,
    blank lines skipped) as the sink's ``kafka.<key>`` options. Errors never quote a
    value (a line may hold a password)."""
    options = {}
    with open(path, encoding="utf-8") as config:
        for number, line in enumerate(config, start=1):
            text = line.strip()
            if not text or text.startswith(("#", "!")):
                continue
            key, separator, value = text.partition("=")
            if not separator or not key.strip():
                raise ValueError(
                    f"{path} line {number} is not key=value: write one client setting per line"
                )
            options[f"kafka.{key.strip()}"] = value.strip()
    return options


def add_supervise_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", help="MODULE:FUNCTION that builds and starts the queries")
    parser.add_argument(
        "--strategy",
        choices=["fixed-delay", "exponential-delay", "failure-rate"],
        default="fixed-delay",
    )
    parser.add_argument(
        "--attempts",
        type=int,
        default=None,
        help="restarts in all (fixed-delay, default 3) or in a row (exponential-delay)",
    )
    parser.add_argument(
        "--delay",
        type=duration_seconds,
        default=10.0,
        help="wait before each restart (fixed-delay, failure-rate; 10s)",
    )
    parser.add_argument("--initial-backoff", type=duration_seconds, default=1.0)
    parser.add_argument("--max-backoff", type=duration_seconds, default=300.0)
    parser.add_argument("--backoff-multiplier", type=float, default=2.0)
    parser.add_argument(
        "--reset-backoff-after",
        type=duration_seconds,
        default=3600.0,
        help="a run up this long resets the backoff (exponential-delay; 1h)",
    )
    parser.add_argument("--max-failures-per-interval", type=int, default=3)
    parser.add_argument("--failure-rate-interval", type=duration_seconds, default=300.0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eospack", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    services_parser = commands.add_parser(
        "services",
        help="run the embedded services (up), or fetch the Apache Kafka and Spark Kafka"
        " connector jars and the MariaDB server with mvn into the cache (fetch)",
    )
    services_parser.add_argument("action", choices=["up", "fetch"])
    services_parser.add_argument(
        "--kafka-brokers",
        type=int,
        default=1,
        metavar="N",
        help="up: a KRaft cluster of N Apache Kafka nodes (RF 3, min.insync.replicas 2 for new"
        " topics; ~450 MB heap each) on free ports instead of one broker",
    )
    services_parser.add_argument(
        "--kafka-security",
        choices=["none", "sasl_ssl"],
        default="none",
        help="up: sasl_ssl starts a SASL_SSL broker (SCRAM-SHA-512, a generated CA, an"
        " authorizer, an application user with the least-privilege grant of"
        " docs/connectors/2pc-kafka.md); the users' settings go to properties files",
    )
    services_parser.set_defaults(handler=services)

    from eospack.lab.demo import add_demo_arguments

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
    doctor_parser.add_argument(
        "--session",
        action="store_true",
        help="also start the session eospack.tools.spark.local_session makes and check its"
        " settings (worker reuse, Python daemon, Spark home); in your own job call"
        " eospack.tools.doctor.run_doctor(spark=spark)",
    )
    doctor_parser.set_defaults(handler=doctor)

    supervise_parser = commands.add_parser(
        "supervise",
        help="run the queries MODULE:FUNCTION starts and restart them by a Flink-style"
        " strategy; errors no restart can fix stop at once",
    )
    add_supervise_arguments(supervise_parser)
    supervise_parser.set_defaults(handler=supervise)

    checkpoint_parser = commands.add_parser(
        "checkpoint",
        help="inspect a streaming checkpoint: batches, offsets, state, and a 2pc sink's"
        f" ({', '.join(entry.name for entry in inspectable_sinks())}) decisions and"
        " leftovers (reads only)",
    )
    add_checkpoint_arguments(checkpoint_parser)
    checkpoint_parser.set_defaults(handler=checkpoint)

    savepoint_parser = commands.add_parser(
        "savepoint",
        help="create a savepoint of a stopped query (last committed batch: offsets and per-key"
        " state), or restore one into a new checkpoint (no-claim or claim)",
    )
    add_savepoint_arguments(savepoint_parser)
    savepoint_parser.set_defaults(handler=savepoint)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = build_parser().parse_args(argv)
    return int(arguments.handler(arguments))


if __name__ == "__main__":
    sys.exit(main())
