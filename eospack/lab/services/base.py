"""What every launched service shares: its error type, port checks and readiness waits."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from eospack.core.errors import EospackError

START_TIMEOUT_SECONDS = 30.0


class ServiceStartError(EospackError, RuntimeError):
    """A service could not be started; the message names the service and the reason."""


class Service(Protocol):
    """A running service: stop() releases its process, ports and files (idempotent)."""

    name: str

    def stop(self) -> None: ...


BrokerKind = Literal["kafka", "tansu"]


@dataclass(frozen=True)
class KafkaEndpoint:
    """Where a broker listens and which broker it is.

    ``kind`` is ``"kafka"`` for Apache Kafka (embedded JVM or Docker) and ``"tansu"`` for
    the tansu stand-in, which ignores read_committed, reports a partition's end offset as
    the base offset of its last batch + 1, and lacks CreatePartitions and DeleteRecords.
    """

    bootstrap_servers: str
    kind: BrokerKind = "kafka"


_STARTED_BROKERS: dict[str, BrokerKind] = {}


def remember_broker(endpoint: KafkaEndpoint) -> None:
    """Record which broker answers at ``endpoint.bootstrap_servers`` (see ``broker_kind``)."""
    _STARTED_BROKERS[endpoint.bootstrap_servers] = endpoint.kind


def broker_kind(bootstrap_servers: str) -> BrokerKind | None:
    """The kind of a broker this process started at that address; None for other brokers."""
    return _STARTED_BROKERS.get(bootstrap_servers)


@dataclass(frozen=True)
class PostgresEndpoint:
    host: str
    port: int
    user: str
    password: str = field(repr=False)
    database: str = "postgres"

    @property
    def url(self) -> str:
        """libpq URL, as psycopg and eospack's `url` option take it (password included)."""
        auth = f"{self.user}:{self.password}" if self.password else self.user
        return f"postgresql://{auth}@{self.host}:{self.port}/{self.database}"

    @property
    def jdbc_url(self) -> str:
        """JDBC URL without credentials: pass user and password as options."""
        return f"jdbc:postgresql://{self.host}:{self.port}/{self.database}"


@dataclass(frozen=True)
class MariaDBEndpoint:
    """A MariaDB or MySQL server as 2pc-jdbc reaches it (``jdbc_url`` plus the user and
    password options)."""

    host: str
    port: int
    user: str
    password: str = field(repr=False)
    database: str = "eospack"

    @property
    def jdbc_url(self) -> str:
        """JDBC URL without credentials: pass user and password as options."""
        return f"jdbc:mariadb://{self.host}:{self.port}/{self.database}"

    def connect(self, **kwargs: object):
        """A pymysql connection to the database (autocommit unless ``kwargs`` say)."""
        import pymysql

        settings: dict[str, object] = {"autocommit": True, "connect_timeout": 5, **kwargs}
        return pymysql.connect(
            host=self.host,
            port=self.port,
            user=self.user,
            password=self.password,
            database=self.database,
            **settings,  # type: ignore[arg-type]
        )


@dataclass(frozen=True)
class S3Endpoint:
    endpoint_url: str
    bucket: str
    access_key_id: str
    secret_access_key: str = field(repr=False)
    region: str = "us-east-1"

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
            region_name=self.region,
        )


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def ensure_port_free(service: str, port: int, host: str = "127.0.0.1") -> None:
    """Raise ServiceStartError naming ``service`` when ``host:port`` is taken."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as error:
            raise ServiceStartError(
                f"{service} could not start: port {port} on {host} is already in use"
                " (stop what holds it, or choose another port)"
            ) from error


def wait_until_ready(
    service: str,
    is_ready: Callable[[], bool],
    process_exit_code: Callable[[], int | None],
    log_file: Path | None,
    timeout: float = START_TIMEOUT_SECONDS,
) -> None:
    """Poll ``is_ready`` until it returns True; fail fast if the process exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code = process_exit_code()
        if code is not None:
            raise ServiceStartError(
                f"{service} exited with code {code} while starting: {_log_tail(log_file)}"
            )
        try:
            if is_ready():
                return
        except Exception:
            pass
        time.sleep(0.05)
    raise ServiceStartError(
        f"{service} was not ready within {timeout:.0f} s: {_log_tail(log_file)}"
    )


def _log_tail(log_file: Path | None, lines: int = 3) -> str:
    """The log's last lines, Java stack frames left out (the exception line says why)."""
    if log_file is None or not log_file.exists():
        return "no log"
    tail = [
        line
        for line in log_file.read_text(errors="replace").strip().splitlines()
        if not _JAVA_STACK_FRAME.match(line)
    ][-lines:]
    return " | ".join(tail) or "empty log"


_JAVA_STACK_FRAME = re.compile(r"^\s+(at |\.\.\. \d+ more)")


def port_accepts_connections(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False
