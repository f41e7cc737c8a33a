"""Files in a streaming checkpoint, wherever Spark keeps it: a local directory or any
Hadoop file system URI (``s3a://``, ``abfss://``, ``gs://``, ``hdfs://``, ...).

Why: Spark writes a checkpoint through Hadoop's ``FileSystem`` API, so a checkpoint on
object storage is read here the same way, through the running SparkSession's JVM
(``org.apache.hadoop.fs.Path(...).getFileSystem(<the session's Hadoop configuration>)``):
the same file system classes, settings and credentials as the query itself, and no second
client. Local paths and ``file:`` URIs are read with Python's file I/O (no JVM round trip),
so inspecting a local checkpoint stays fast and needs no Spark.

Every part of eospack that reads or writes files in a checkpoint or a savepoint
(``eospack checkpoint inspect``, savepoints, a restored operator's bootstrap, 2pc-kafka's
record) goes through ``checkpoint_files``.

Guarantees: a missing file reads as None and a missing directory lists empty; any other
failure is a ``CheckpointFilesError``, one line naming the location and, when the file
system is not on Spark's classpath, which jar provides it. A Hadoop location needs a
SparkSession in this process (a driver, never an executor or one of Spark's Python
planner workers, which have no JVM): without one, ``CheckpointFilesError`` says so.
Secrets never appear in a message: Hadoop's messages name paths, not credentials.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from eospack.core.errors import EospackError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

FILE_SYSTEM_JARS = {
    "s3a": "org.apache.hadoop:hadoop-aws (the version of Spark's Hadoop) with its AWS SDK bundle",
    "abfs": "org.apache.hadoop:hadoop-azure (the version of Spark's Hadoop)",
    "abfss": "org.apache.hadoop:hadoop-azure (the version of Spark's Hadoop)",
    "wasb": "org.apache.hadoop:hadoop-azure (the version of Spark's Hadoop)",
    "wasbs": "org.apache.hadoop:hadoop-azure (the version of Spark's Hadoop)",
    "gs": "com.google.cloud.bigdataoss:gcs-connector (its shaded jar)",
}
"""Which jar gives Spark's Hadoop the file system of each scheme (the message's fix)."""


class CheckpointFilesError(EospackError, OSError):
    """A checkpoint's files cannot be read or written here; the message says why."""


def is_local(location: str | Path) -> bool:
    """True for a plain path or a ``file:`` URI (read with Python's file I/O)."""
    scheme = urlsplit(str(location)).scheme
    return scheme == "file" or len(scheme) <= 1  # "C:" is a drive, not a scheme


def local_directory(location: str | Path) -> Path:
    """The local path of a plain path or ``file:`` URI."""
    text = str(location)
    if urlsplit(text).scheme == "file":
        return Path(unquote(urlsplit(text).path))
    return Path(text)


def spark_path(location: str | Path) -> str:
    """``location`` as Spark's readers and writers must be given it: a URI stays, a local
    path becomes a ``file://`` URI (a bare path would mean the cluster's default file
    system, HDFS on most clusters)."""
    text = str(location)
    scheme = urlsplit(text).scheme
    if scheme and len(scheme) > 1:
        return text
    return Path(text).absolute().as_uri()


def join(location: str, *parts: str) -> str:
    """``location`` with ``parts`` appended, ``/``-separated (a URI stays a URI)."""
    return "/".join([location.rstrip("/"), *(part.strip("/") for part in parts if part)])


class CheckpointFiles:
    """The files below one location; paths given to its methods are relative to it
    (``"offsets/3"``, ``""`` for the location itself)."""

    location: str

    def read_text(self, relative: str) -> str | None:
        """The file's text (UTF-8, undecodable bytes replaced), None when it does not exist."""
        raise NotImplementedError

    def is_file(self, relative: str) -> bool:
        raise NotImplementedError

    def is_directory(self, relative: str) -> bool:
        raise NotImplementedError

    def names(self, relative: str = "") -> list[str]:
        """The names of the directory's entries; empty when it does not exist."""
        raise NotImplementedError

    def file_sizes(self, relative: str) -> Iterator[tuple[str, int]]:
        """Every file below the directory, recursively: (path relative to it, bytes)."""
        raise NotImplementedError

    def write_text(self, relative: str, text: str) -> None:
        """Write the file whole: a reader sees no file or all of it (a temporary file
        renamed into place; object stores show an object only once it is complete)."""
        raise NotImplementedError

    def put(self, local: Path, relative: str) -> None:
        """Copy a local file or directory (recursively) to ``relative``."""
        raise NotImplementedError

    def get(self, relative: str, local: Path) -> None:
        """Copy the file ``relative`` to the local path ``local`` (whole, then renamed)."""
        raise NotImplementedError

    def exists(self, relative: str = "") -> bool:
        return self.is_file(relative) or self.is_directory(relative)

    def uri(self, relative: str = "") -> str:
        return join(self.location, relative)


class LocalFiles(CheckpointFiles):
    """A local directory, read and written with Python's file I/O."""

    def __init__(self, location: str | Path) -> None:
        self.root = local_directory(location)
        self.location = str(self.root)

    def path(self, relative: str = "") -> Path:
        return self.root / relative if relative else self.root

    def read_text(self, relative: str) -> str | None:
        try:
            return self.path(relative).read_text(encoding="utf-8", errors="replace")
        except (FileNotFoundError, NotADirectoryError):
            return None

    def is_file(self, relative: str) -> bool:
        return self.path(relative).is_file()

    def is_directory(self, relative: str) -> bool:
        return self.path(relative).is_dir()

    def names(self, relative: str = "") -> list[str]:
        directory = self.path(relative)
        if not directory.is_dir():
            return []
        return [entry.name for entry in directory.iterdir()]

    def file_sizes(self, relative: str) -> Iterator[tuple[str, int]]:
        directory = self.path(relative)
        for file in directory.rglob("*"):
            if file.is_file():
                yield str(file.relative_to(directory)), file.stat().st_size

    def write_text(self, relative: str, text: str) -> None:
        path = self.path(relative)
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as file:
                file.write(text)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise

    def put(self, local: Path, relative: str) -> None:
        target = self.path(relative)
        target.parent.mkdir(parents=True, exist_ok=True)
        if local.is_dir():
            shutil.copytree(local, target)
        else:
            shutil.copyfile(local, target)

    def get(self, relative: str, local: Path) -> None:
        local.parent.mkdir(parents=True, exist_ok=True)
        temporary = local.with_name(f".{local.name}.partial")
        shutil.copyfile(self.path(relative), temporary)
        os.replace(temporary, local)


class HadoopFiles(CheckpointFiles):
    """A location on any Hadoop file system, through the SparkSession's JVM with the Hadoop
    configuration Spark's streaming queries use (``spark.hadoop.*`` and SQL settings)."""

    def __init__(self, spark: SparkSession, location: str) -> None:
        self.spark = spark
        self.location = location.rstrip("/") or location
        jvm = getattr(spark, "_jvm", None)
        if jvm is None:
            raise CheckpointFilesError(
                f"{location}: a checkpoint on a Hadoop file system is read through the JVM of"
                " a classic SparkSession, which a Spark Connect client has not: run eospack's"
                " checkpoint and savepoint tools where the checkpoint is reachable with Spark"
            )
        self.jvm: Any = jvm
        self.configuration: Any = spark._jsparkSession.sessionState().newHadoopConf()
        if urlsplit(self.location).scheme == "file":  # no .crc files beside a local copy
            local = self.jvm.org.apache.hadoop.fs.FileSystem.getLocal(self.configuration)
            self.file_system: Any = local.getRawFileSystem()
        else:
            self.file_system = self._call(
                lambda: self.hadoop_path("").getFileSystem(self.configuration), ""
            )

    def hadoop_path(self, relative: str) -> Any:
        return self.jvm.org.apache.hadoop.fs.Path(self.uri(relative))

    def _call(self, action: Any, relative: str, missing: Any = ...) -> Any:
        """Run ``action``; a missing file answers ``missing`` (when given), any other
        Java failure becomes one line."""
        from py4j.protocol import Py4JJavaError

        try:
            return action()
        except Py4JJavaError as error:
            java = error.java_exception
            name = java.getClass().getName()
            if missing is not ... and name == "java.io.FileNotFoundException":
                return missing
            raise CheckpointFilesError(self._explain(relative, name, java)) from None

    def _explain(self, relative: str, name: str, java: Any) -> str:
        scheme = urlsplit(self.location).scheme
        message = str(java.getMessage() or "").strip().splitlines()
        text = message[0] if message else name
        if name.endswith("UnsupportedFileSystemException") or (
            name.endswith("ClassNotFoundException") or "ClassNotFoundException" in text
        ):
            if scheme == "s3":
                return (
                    f"{self.location}: Spark's classpath has no Hadoop file system for s3://"
                    " (EMR's EMRFS has it): elsewhere use s3a:// with"
                    f" {FILE_SYSTEM_JARS['s3a']} on the classpath (see docs/operations.md,"
                    " Checkpoints on object storage)"
                )
            jar = FILE_SYSTEM_JARS.get(scheme, f"the Hadoop file system jar of {scheme}://")
            return (
                f"{self.location}: Spark's classpath has no Hadoop file system for"
                f" {scheme}:// ({text[:200]}): put {jar} on it (spark.jars.packages or"
                " spark.jars; see docs/operations.md, Checkpoints on object storage)"
            )
        return f"{self.uri(relative)}: {name.rsplit('.', 1)[-1]}: {text[:300]}"

    def read_text(self, relative: str) -> str | None:
        io_utils = self.jvm.org.apache.commons.io.IOUtils

        def read() -> bytes:
            stream = self.file_system.open(self.hadoop_path(relative))
            try:
                return bytes(io_utils.toByteArray(stream))
            finally:
                stream.close()

        data = self._call(read, relative, missing=None)
        return None if data is None else data.decode("utf-8", errors="replace")

    def _status(self, relative: str) -> Any:
        return self._call(
            lambda: self.file_system.getFileStatus(self.hadoop_path(relative)),
            relative,
            missing=None,
        )

    def is_file(self, relative: str) -> bool:
        status = self._status(relative)
        return status is not None and bool(status.isFile())

    def is_directory(self, relative: str) -> bool:
        status = self._status(relative)
        return status is not None and bool(status.isDirectory())

    def names(self, relative: str = "") -> list[str]:
        statuses = self._call(
            lambda: self.file_system.listStatus(self.hadoop_path(relative)), relative, missing=[]
        )
        return [str(status.getPath().getName()) for status in statuses]

    def file_sizes(self, relative: str) -> Iterator[tuple[str, int]]:
        base = self.hadoop_path(relative)
        files = self._call(lambda: self.file_system.listFiles(base, True), relative, missing=None)
        if files is None:
            return
        prefix = str(self.file_system.makeQualified(base).toUri().getPath()).rstrip("/") + "/"
        while self._call(files.hasNext, relative):
            status = files.next()
            path = str(status.getPath().toUri().getPath())
            yield path.removeprefix(prefix), int(status.getLen())

    def write_text(self, relative: str, text: str) -> None:
        target = self.hadoop_path(relative)
        name = relative.rsplit("/", 1)[-1]
        temporary = self.hadoop_path(join(relative.rpartition("/")[0], f".{name}.tmp"))

        def write() -> None:
            stream = self.file_system.create(temporary, True)
            try:
                stream.write(text.encode("utf-8"))
            finally:
                stream.close()
            self.file_system.delete(target, False)
            if not self.file_system.rename(temporary, target):
                raise CheckpointFilesError(f"{self.uri(relative)}: could not be renamed into place")

        self._call(write, relative)

    def put(self, local: Path, relative: str) -> None:
        # each file through create(), as Spark writes a checkpoint: copyFromLocalFile's
        # single PUT of a file body fails on some S3 endpoints that Spark's writes pass
        files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.is_file())
        for file in files:
            below = "" if file == local else str(file.relative_to(local))
            self._write_bytes(join(relative, below), file.read_bytes())

    def _write_bytes(self, relative: str, data: bytes) -> None:
        def write() -> None:
            stream = self.file_system.create(self.hadoop_path(relative), False)
            try:
                stream.write(data)
            finally:
                stream.close()

        self._call(write, relative)

    def get(self, relative: str, local: Path) -> None:
        local.parent.mkdir(parents=True, exist_ok=True)
        temporary = local.with_name(f".{local.name}.partial")
        temporary.unlink(missing_ok=True)
        destination = self.jvm.org.apache.hadoop.fs.Path(temporary.resolve().as_uri())
        self._call(
            lambda: self.file_system.copyToLocalFile(
                False, self.hadoop_path(relative), destination, True
            ),
            relative,
        )
        os.replace(temporary, local)

    def copy_to(self, relative: str, target: HadoopFiles, target_relative: str) -> None:
        """Copy a file or directory (recursively) to another Hadoop location."""
        file_util = self.jvm.org.apache.hadoop.fs.FileUtil
        self._call(
            lambda: file_util.copy(
                self.file_system,
                self.hadoop_path(relative),
                target.file_system,
                target.hadoop_path(target_relative),
                False,
                self.configuration,
            ),
            relative,
        )

    def move_to(self, relative: str, target: HadoopFiles, target_relative: str) -> None:
        """Move a file or directory to another location: a rename on the same file system
        (an object store copies, then deletes), else a copy, then a delete."""
        same = bool(self.file_system.getUri().equals(target.file_system.getUri()))
        if not same:
            self.copy_to(relative, target, target_relative)
            self.delete(relative)
            return
        renamed = self._call(
            lambda: self.file_system.rename(
                self.hadoop_path(relative), target.hadoop_path(target_relative)
            ),
            relative,
        )
        if not renamed:
            raise CheckpointFilesError(
                f"{self.uri(relative)} could not be moved to {target.uri(target_relative)}"
            )

    def rename(self, relative: str, target_relative: str) -> None:
        """Rename within this location's file system (an object store copies, then deletes)."""
        renamed = self._call(
            lambda: self.file_system.rename(
                self.hadoop_path(relative), self.hadoop_path(target_relative)
            ),
            relative,
        )
        if not renamed:
            raise CheckpointFilesError(
                f"{self.uri(relative)} could not be renamed to {self.uri(target_relative)}"
            )

    def delete(self, relative: str) -> None:
        self._call(lambda: self.file_system.delete(self.hadoop_path(relative), True), relative)


def checkpoint_files(location: str | Path, spark: SparkSession | None = None) -> CheckpointFiles:
    """The files below ``location``: local I/O for a path or ``file:`` URI, else Hadoop's
    file system through ``spark`` (default: this process's active SparkSession)."""
    if is_local(location):
        return LocalFiles(location)
    return HadoopFiles(session_for(str(location), spark), str(location))


def as_hadoop(files: CheckpointFiles, spark: SparkSession | None = None) -> HadoopFiles:
    """``files`` through Hadoop's API (a local directory as its ``file:`` URI), so that a
    copy or move between a local and a Hadoop location is one call."""
    if isinstance(files, HadoopFiles):
        return files
    assert isinstance(files, LocalFiles)
    uri = files.root.resolve().as_uri()
    return HadoopFiles(session_for(uri, spark), uri)


def session_for(location: str, spark: SparkSession | None = None) -> SparkSession:
    """``spark``, else the active SparkSession; a Hadoop location cannot be read without."""
    if spark is not None:
        return spark
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is None:
        raise CheckpointFilesError(
            f"{location}: a checkpoint on a Hadoop file system is read through Spark: start"
            " a SparkSession (with the file system's jar and settings) in this process first"
        )
    return active
