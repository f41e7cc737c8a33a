"""The manual's Python examples as runnable code: collection, substitution, givens, checks.

Used by ``test_manual_examples.py`` only. Every fenced ``python`` block of README.md and
docs/**/*.md is an example; one whose fence is directly preceded by
``<!-- example: not run (reason) -->`` is skipped for that reason (an empty reason fails).

How an example runs against the test services (the manual is written for
``eospack services up`` on docker-compose.yml's ports, or for a user's own systems):

``SUBSTITUTIONS`` (applied to the block's text, in order)
    ``"<host>:9092"`` (any list of such)  -> the test broker's bootstrap servers
    ``"jdbc:postgresql://..."``           -> the test PostgreSQL's JDBC URL
    ``.option("user", "...")``            -> ``.option("user", "postgres")``
    ``.format("2pc-s3")``                 -> the same, plus the test S3's endpointUrl,
                                             region and keys (a user's AWS chain otherwise)
    ``s3://<bucket>/``                    -> ``s3://<test bucket>/<unique prefix>/``
    ``"/checkpoints/..."``, ``"/tmp/..."`` -> the same path under the test's tmp_path
    topics named by ``subscribe``/``topic`` options -> the name plus a unique suffix
Passwords: the test PostgreSQL trusts local connections, as ``eospack services up``
prints, so an example's password (docker-compose.yml's ``postgres``) is left as written;
an example that reads ``os.environ`` gets ``EOSPACK_KAFKA`` (bootstrap servers) and
``EOSPACK_POSTGRES`` (libpq URL), the variables the README's quick start exports.

``GIVEN_NAMES``: a fragment (a connector page's usage lines) may use, without defining it,
``spark`` (the test session), ``df`` (a stream of produced keyed records with the columns
the manual's fragments use: key, value, user, shop, sku, amount, qty, order_id, ts, day,
country, k, n, t), ``counts`` (``running_count(df, "key", output_mode="append")``) and
``secret`` (the password).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

FENCE = re.compile(r"^```python\n(.*?)^```", flags=re.DOTALL | re.MULTILINE)
NOT_RUN = re.compile(r"^<!-- example: not run \((.*)\) -->\s*$")
ANY_MARKER = re.compile(r"^<!-- example:")


@dataclass(frozen=True)
class Example:
    page: Path
    line: int
    code: str
    not_run_reason: str | None
    """None: runs. A string (maybe empty: a test fails then): why it does not run."""

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def manual_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def collect_examples() -> list[Example]:
    """Every fenced python block of the manual, read now (pages come and go)."""
    return [example for page in manual_pages() for example in examples_in(page, page.read_text())]


def examples_in(page: Path, text: str) -> list[Example]:
    """The fenced python blocks of ``text``; a marker counts only on the fence's line above."""
    examples = []
    lines = text.splitlines()
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = lines[line - 2] if line >= 2 else ""
        marker = NOT_RUN.match(before)
        reason = marker.group(1).strip() if marker else None
        if reason is None and ANY_MARKER.match(before):
            reason = ""
        examples.append(Example(page, line, match.group(1), reason))
    return examples


@dataclass
class Services:
    bootstrap_servers: str
    jdbc_url: str
    postgres_url: str
    s3_endpoint: Any
    tmp_path: Path
    suffix: str


def s3_options(services: Services) -> str:
    endpoint = services.s3_endpoint
    return "".join(
        f'.option("{name}", "{value}")'
        for name, value in (
            ("endpointUrl", endpoint.endpoint_url),
            ("region", endpoint.region),
            ("accessKeyId", endpoint.access_key_id),
            ("secretAccessKey", endpoint.secret_access_key),
        )
    )


SUBSTITUTIONS: list[tuple[re.Pattern[str], Callable[[re.Match[str], Services], str]]] = [
    (
        re.compile(r'"[\w.-]+:9092(,[\w.-]+:9092)*"'),
        lambda _, services: f'"{services.bootstrap_servers}"',
    ),
    (re.compile(r'"jdbc:postgresql://[^"]*"'), lambda _, services: f'"{services.jdbc_url}"'),
    (re.compile(r'\.option\("user", "[^"]*"\)'), lambda _, __: '.option("user", "postgres")'),
    (
        re.compile(r'\.format\("2pc-s3"\)'),
        lambda match, services: match.group(0) + s3_options(services),
    ),
    (
        re.compile(r"s3://[\w.-]+/"),
        lambda _, services: f"s3://{services.s3_endpoint.bucket}/{services.suffix}/",
    ),
    (
        re.compile(r'"/(checkpoints|tmp)/([^"]*)"'),
        lambda match, services: f'"{services.tmp_path / match.group(1) / match.group(2)}"',
    ),
]

TOPIC_OPTION = re.compile(r'\.option\("(?:subscribe|topic)", "([\w.-]+)"\)')
SUBSCRIBED = re.compile(r'\.option\("subscribe", "([\w.-]+)"\)')
SINK_TOPIC = re.compile(r'\.option\("topic", "([\w.-]+)"\)')
DBTABLE = re.compile(r'\.option\("dbtable", "([\w.]+)"\)')
S3_PATH = re.compile(r'\.start\("(s3://[^"]+)"\)')


def substitute(code: str, services: Services) -> str:
    """The example's code pointed at the test services (see the module docstring)."""
    for pattern, replacement in SUBSTITUTIONS:
        code = pattern.sub(lambda match, r=replacement: r(match, services), code)
    for topic in set(TOPIC_OPTION.findall(code)):
        code = code.replace(f'"{topic}"', f'"{topic}_{services.suffix}"')
    return code


def unique_suffix() -> str:
    return uuid.uuid4().hex[:8]


GIVEN_NAMES = ("spark", "df", "counts", "secret")

GIVEN_COLUMNS = (
    "CAST(key AS STRING) AS key",
    "CAST(value AS STRING) AS value",
    "CAST(key AS STRING) AS user",
    "'shop1' AS shop",
    "CAST(key AS STRING) AS sku",
    "CAST(CAST(value AS STRING) AS DOUBLE) AS amount",
    "CAST(CAST(value AS STRING) AS BIGINT) AS qty",
    "CONCAT(CAST(key AS STRING), '-', CAST(offset AS STRING)) AS order_id",
    "timestamp AS ts",
    "DATE_FORMAT(timestamp, 'yyyy-MM-dd') AS day",
    "'NL' AS country",
    "CAST(key AS STRING) AS k",
    "CAST(partition AS BIGINT) AS n",
    "offset AS t",
)


def uses(code: str, name: str) -> bool:
    """``name`` is read by the block without being assigned or imported in it."""
    read = re.search(rf"(?<![\w.\"']){name}\b(?!\s*=[^=])", code) is not None
    assigned = re.search(rf"^\s*{name}\s*=[^=]", code, flags=re.MULTILINE) is not None
    return read and not assigned


def given_namespace(spark: Any, code: str, services: Services, given_topic: str) -> dict:
    """The names a fragment uses without defining them (``GIVEN_NAMES``)."""
    namespace: dict[str, Any] = {"__name__": "__manual_example__", "spark": spark}
    if uses(code, "df") or uses(code, "counts"):
        namespace["df"] = (
            spark.readStream.format("replayable-kafka")
            .option("kafka.bootstrap.servers", services.bootstrap_servers)
            .option("subscribe", given_topic)
            .option("startingOffsets", "earliest")
            .load()
            .selectExpr(*GIVEN_COLUMNS)
        )
    if uses(code, "counts"):
        from eospack.stateful_ops import running_count

        namespace["counts"] = running_count(namespace["df"], "key", output_mode="append")
    if uses(code, "secret"):
        namespace["secret"] = "postgres"
    return namespace


POSTGRES_TYPES = {
    "string": "text",
    "double": "double precision",
    "bigint": "bigint",
    "int": "integer",
    "timestamp": "timestamptz",
}


def create_table_like(postgres_url: str, table: str, frame: Any) -> None:
    """Create ``table`` (and its schema) with ``frame``'s columns, for an example that
    appends into an existing table."""
    import psycopg

    columns = ", ".join(f'"{name}" {POSTGRES_TYPES[kind]}' for name, kind in frame.dtypes)
    with psycopg.connect(postgres_url, autocommit=True) as connection:
        if "." in table:
            connection.execute(f'CREATE SCHEMA IF NOT EXISTS "{table.split(".")[0]}"')
        connection.execute(f"DROP TABLE IF EXISTS {table}")
        connection.execute(f"CREATE TABLE {table} ({columns})")
