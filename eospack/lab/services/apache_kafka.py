"""Apache Kafka as a local JVM process: one KRaft node, controller and broker combined.

Why: tansu, the pip-only stand-in, ignores read_committed, misreports end offsets and
lacks CreatePartitions and DeleteRecords. This is the real broker, from the jars of
``eospack/lab/services/poms/kafka-broker.xml`` (fetched once with mvn into the cache, see
``maven.py``), started with ``java``; no Docker, no Kafka download outside Maven.

Guarantees: after the constructor returns, the broker answers metadata requests with
itself unfenced (topics can be created and written). Data lives in a temporary log
directory that survives ``kill()`` (SIGKILL) and a later ``start()`` on the same ports;
``stop()`` shuts down cleanly (SIGTERM, SIGKILL after 15 s) and deletes the directory.
``pause()``/``resume()`` freeze and continue the JVM. Start failures raise
``ServiceStartError``, one line naming the broker and the cause.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
import uuid
from collections.abc import Mapping
from typing import Any

from eospack.lab.services.base import (
    KafkaEndpoint,
    ServiceStartError,
    ensure_port_free,
    free_port,
    port_accepts_connections,
    remember_broker,
    wait_until_ready,
)
from eospack.lab.services.embedded import LOOPBACK, _ChildProcess
from eospack.lab.services.maven import resolve_classpath

START_TIMEOUT_SECONDS = 90.0
NODE_ID = 1
HEAP = "512m"
MINIMUM_JAVA = 17

LOG4J2_PROPERTIES = """\
status = error
appender.console.type = Console
appender.console.name = console
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.console.ref = console
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = info
logger.markers.name = kafka.coordinator.transaction.TransactionMarkerChannelManager
logger.markers.level = info
"""


def java_executable() -> str:
    """``$JAVA_HOME/bin/java`` or ``java`` on PATH, at least Java 17 (Kafka 4's minimum)."""
    from eospack.core.java import JavaNotFoundError, java_major_version

    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    try:
        major = java_major_version()
    except JavaNotFoundError as error:
        raise ServiceStartError(
            f"{ApacheKafka.name} could not start: {error} (or set EOSPACK_BROKER=tansu)"
        ) from error
    if major < MINIMUM_JAVA or java is None:
        raise ServiceStartError(
            f"{ApacheKafka.name} could not start: Kafka 4 needs Java {MINIMUM_JAVA}+ but"
            f" {java} is Java {major} (install Java 17 or 21, or set EOSPACK_BROKER=tansu)"
        )
    return java


def new_cluster_id() -> str:
    """A random Kafka cluster id: 16 bytes, URL-safe base64 without padding, not '-' first."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


class ApacheKafka(_ChildProcess):
    """A one-node Apache Kafka 4 (KRaft) on loopback with test-friendly settings.

    Settings: replication factor 1 and min ISR 1 for internal topics, no initial
    rebalance delay, default transaction timeouts (15 min max), log cleaner and
    retention checks that start after 1 s (so compaction and retention tests run fast),
    and a 3 s broker session, so a restart after ``kill`` re-registers within seconds
    (a pause longer than that fences the broker briefly after ``resume``). Heap 512 MiB.
    """

    name = "kafka broker (apache kafka)"

    def __init__(
        self,
        port: int | None = None,
        controller_port: int | None = None,
        heap: str = HEAP,
    ) -> None:
        self.java = java_executable()
        self.classpath = resolve_classpath("kafka-broker")
        self.port = port or free_port()
        ensure_port_free(self.name, self.port)
        self.controller_port = controller_port or free_port()
        while self.controller_port == self.port:
            self.controller_port = free_port()
        ensure_port_free(self.name, self.controller_port)
        self.heap = heap
        super().__init__()
        self.log_dir = self.workdir / "data"
        self.config_file = self.workdir / "server.properties"
        self.log4j_file = self.workdir / "log4j2.properties"
        self.config_file.write_text(self._server_properties())
        self.log4j_file.write_text(LOG4J2_PROPERTIES)
        self.endpoint = KafkaEndpoint(bootstrap_servers=f"{LOOPBACK}:{self.port}", kind="kafka")
        try:
            self.format_storage(new_cluster_id(), "--standalone")
            self.start()
        except BaseException:
            self.stop()
            raise
        remember_broker(self.endpoint)

    def _server_properties(self) -> str:
        settings = {
            "process.roles": "broker,controller",
            "node.id": str(NODE_ID),
            "controller.quorum.bootstrap.servers": f"{LOOPBACK}:{self.controller_port}",
            "listeners": f"PLAINTEXT://{LOOPBACK}:{self.port},"
            f"CONTROLLER://{LOOPBACK}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.log_dir),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "broker.heartbeat.interval.ms": "500",
            "broker.session.timeout.ms": "3000",
            "log.initial.task.delay.ms": "1000",
            "log.cleaner.backoff.ms": "1000",
        }
        return "".join(f"{key}={value}\n" for key, value in settings.items())

    def _java_command(self, main_class: str, *arguments: str, heap: str) -> list[str]:
        return [
            self.java,
            f"-Xmx{heap}",
            "-Xms64m",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.log4j_file}",
            "-cp",
            os.pathsep.join(str(jar) for jar in self.classpath),
            main_class,
            *arguments,
        ]

    def format_storage(self, cluster_id: str, *extra: str) -> None:
        """Write the KRaft metadata of a new node (``kafka-storage format``)."""
        command = self._java_command(
            "kafka.tools.StorageTool",
            "format",
            "--cluster-id",
            cluster_id,
            "--config",
            str(self.config_file),
            *extra,
            heap="256m",
        )
        try:
            result = subprocess.run(
                command, capture_output=True, text=True, timeout=120, check=False
            )
        except subprocess.TimeoutExpired as error:
            raise ServiceStartError(
                f"{self.name} could not format its storage within 120 s"
            ) from error
        if result.returncode != 0:
            # The command line may hold SCRAM passwords: only the tool's last lines are shown.
            lines = (result.stderr or result.stdout).strip().splitlines()[-2:]
            raise ServiceStartError(
                f"{self.name} could not format its storage (exit code {result.returncode}):"
                f" {' | '.join(lines) or 'no output'}"
            )

    def start(self) -> None:
        """Start (or restart after ``kill``) the broker on the same ports and log directory."""
        if self.process is not None and self.process.poll() is None:
            return
        self._launch(self._java_command("kafka.Kafka", str(self.config_file), heap=self.heap))
        wait_until_ready(
            self.name,
            self._answers_metadata,
            self._exit_code,
            self.log_file,
            timeout=START_TIMEOUT_SECONDS,
        )

    def _answers_metadata(self) -> bool:
        return port_accepts_connections(LOOPBACK, self.port) and node_is_unfenced(
            self.endpoint.bootstrap_servers, NODE_ID, {}
        )

    def kill(self) -> None:
        """End the broker abruptly (SIGKILL), keeping its log directory for ``start``."""
        self._terminate(signal.SIGKILL)


def node_is_unfenced(bootstrap: str, node_id: int, config: Mapping[str, Any]) -> bool:
    """Whether the cluster behind ``bootstrap`` lists ``node_id`` as a registered, unfenced
    broker (``config``: the client's security settings, for a secured listener)."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(
        bootstrap_servers=bootstrap,
        client_id="eospack-readiness",
        request_timeout_ms=5_000,
        **config,
    )
    try:
        cluster = admin.describe_cluster()
    finally:
        admin.close()
    return any(
        broker["broker_id"] == node_id and not broker.get("is_fenced")
        for broker in cluster["brokers"]
    )
