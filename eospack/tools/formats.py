"""The one registry of eospack's formats: each format's name, role, classes and page.

Why: a format used to be listed in about ten places (``register``, ``eospack doctor``,
``eospack checkpoint inspect``, the public errors, the docs); a list that forgot one format
failed only when a user met it. Everything that needs "every format" reads ``FORMATS``,
and ``tests/test_format_registry.py`` checks the rest (the ``pyspark_*`` modules,
``pyproject.toml``, the docs and ``mkdocs.yml``) against it. Adding a format is one folder
under ``connectors/``, one entry here and one adapter in the sink contract suite.

Guaranteed: importing this module imports no connector, pyspark, pandas or Kafka client
(``import eospack`` reads it). Every class and function is named by module path and
attribute (:class:`Reference`) and imported only when :meth:`Reference.load` is called.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from eospack.core.errors import EospackError

Role = Literal["source", "sink"]


@dataclass(frozen=True)
class Reference:
    """An attribute of a module, imported on :meth:`load` only (keeps the registry cheap)."""

    module: str
    name: str

    def load(self) -> Any:
        """The attribute itself; importing its module may load pyspark or a client library."""
        return getattr(importlib.import_module(self.module), self.name)

    def __str__(self) -> str:
        return f"{self.module}:{self.name}"


@dataclass(frozen=True)
class FormatEntry:
    """One format: what ``format(name)`` is and where each piece of it lives."""

    name: str
    """What users pass to ``format(...)``."""
    role: Role
    data_source: Reference
    """The ``pyspark.sql.datasource.DataSource`` subclass (the ``pyspark_*`` module's
    ``DefaultSource``)."""
    options_class: Reference
    """The typed frozen options object the connector parses its options into."""
    parse_options: Reference
    """``(Mapping[str, str]) -> options_class``: the connector's one parser of its options;
    a bad option raises the connector's one-line option error naming the option and the fix."""
    docs_page: str
    """The user's page, relative to the repository (in ``mkdocs.yml``'s nav)."""
    public_errors: tuple[Reference, ...] = ()
    """Errors users catch, served as ``eospack.<name>`` (``eospack.__all__``)."""
    sink_inspector: Reference | None = None
    """Sinks: ``(query_id, options) -> SinkState``, read only; ``eospack checkpoint
    inspect`` reads the sink through it."""
    left_behind: str = "{leftovers} leftovers"
    """Sinks: the report's "left behind" line, formatted with the counts of
    ``eospack.tools.checkpoint.SinkLedger``'s lists (``prepared_transactions``, ``staged_rows``,
    ``multipart_uploads``, ``open_transactions``, ``leftovers``)."""

    @property
    def lookup_module(self) -> str:
        """The top-level module Spark's automatic lookup imports for this format."""
        return "pyspark_" + self.name.replace("-", "_")

    def parse(self, options: Mapping[str, str]) -> Any:
        """``options`` parsed exactly as the connector parses them (same errors)."""
        return self.parse_options.load()(options)


_JDBC = "eospack.connectors.jdbc"
_KAFKA = "eospack.connectors.kafka"
_S3 = "eospack.connectors.s3"

FORMATS: Mapping[str, FormatEntry] = {
    entry.name: entry
    for entry in (
        FormatEntry(
            name="replayable-kafka",
            role="source",
            data_source=Reference(f"{_KAFKA}.source.data_source", "ReplayableKafkaDataSource"),
            options_class=Reference(f"{_KAFKA}.source.options", "KafkaSourceOptions"),
            parse_options=Reference(f"{_KAFKA}.source.options", "parse_options"),
            docs_page="docs/connectors/replayable-kafka.md",
            public_errors=tuple(
                Reference(f"{_KAFKA}.errors", name)
                for name in (
                    "KafkaSourceOptionError",
                    "KafkaBrokerUnreachableError",
                    "KafkaAuthenticationError",
                    "KafkaDataLossError",
                    "KafkaReadTimeoutError",
                    "KafkaCodecMissingError",
                )
            ),
        ),
        FormatEntry(
            name="2pc-jdbc",
            role="sink",
            data_source=Reference(f"{_JDBC}.sink", "TwoPhaseJdbcDataSource"),
            options_class=Reference(f"{_JDBC}.options", "JdbcSinkOptions"),
            parse_options=Reference(f"{_JDBC}.options", "parse_options"),
            docs_page="docs/connectors/2pc-jdbc.md",
            public_errors=tuple(
                Reference(f"{_JDBC}.errors", name)
                for name in (
                    "JdbcSinkOptionError",
                    "JdbcConnectionError",
                    "JdbcSchemaError",
                    "JdbcWriteError",
                )
            ),
            sink_inspector=Reference(f"{_JDBC}.resource", "inspect_sink"),
            left_behind="{prepared_transactions} prepared transactions, {staged_rows} staged rows",
        ),
        FormatEntry(
            name="2pc-s3",
            role="sink",
            data_source=Reference(f"{_S3}.sink", "TwoPhaseS3DataSource"),
            options_class=Reference(f"{_S3}.options", "S3SinkOptions"),
            parse_options=Reference(f"{_S3}.options", "parse_sink_options"),
            docs_page="docs/connectors/2pc-s3.md",
            public_errors=tuple(
                Reference(f"{_S3}.errors", name)
                for name in ("S3OptionError", "S3AccessError", "S3WriteError")
            ),
            sink_inspector=Reference(f"{_S3}.resource", "inspect_sink"),
            left_behind="{multipart_uploads} multipart uploads in progress",
        ),
        FormatEntry(
            name="2pc-kafka",
            role="sink",
            data_source=Reference(f"{_KAFKA}.sink.data_source", "TwoPhaseKafkaDataSource"),
            options_class=Reference(f"{_KAFKA}.sink.options", "KafkaSinkOptions"),
            parse_options=Reference(f"{_KAFKA}.sink.options", "parse_options"),
            docs_page="docs/connectors/2pc-kafka.md",
            public_errors=(
                Reference(f"{_KAFKA}.errors", "KafkaSinkOptionError"),
                Reference(f"{_KAFKA}.errors", "KafkaSendError"),
                Reference(f"{_KAFKA}.errors", "PreparedTransactionLostError"),
                Reference(f"{_KAFKA}.errors", "LedgerFencedError"),
            ),
            sink_inspector=Reference(f"{_KAFKA}.sink.resource", "inspect_sink"),
            left_behind="{open_transactions} open transactions",
        ),
    )
}
"""Every format, in the order ``register`` registers them and the docs list them."""


class UnknownFormatError(EospackError, ValueError):
    """A format name that is not in the registry (the message lists the known ones)."""


def sinks() -> list[FormatEntry]:
    """The sinks, in registry order."""
    return [entry for entry in FORMATS.values() if entry.role == "sink"]


def inspectable_sinks() -> list[FormatEntry]:
    """The sinks ``eospack checkpoint inspect`` can read."""
    return [entry for entry in sinks() if entry.sink_inspector is not None]


def entry_of(name: str, entries: list[FormatEntry] | None = None) -> FormatEntry:
    """The entry of ``name`` among ``entries`` (default every format); otherwise one line
    naming the known ones."""
    candidates = {entry.name: entry for entry in (entries or FORMATS.values())}
    entry = candidates.get(name)
    if entry is None:
        known = ", ".join(candidates)
        raise UnknownFormatError(f"format {name!r} is not known here: use one of {known}")
    return entry


def public_error_homes() -> dict[str, str]:
    """Each format's public error name -> the module that defines it (for ``eospack``'s
    lazy public names); an error shared by formats appears once."""
    homes: dict[str, str] = {}
    for entry in FORMATS.values():
        for error in entry.public_errors:
            if homes.setdefault(error.name, error.module) != error.module:
                raise RuntimeError(f"{error.name} has two homes in eospack.tools.formats")
    return homes
