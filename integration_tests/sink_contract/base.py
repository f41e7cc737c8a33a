"""One adapter per two-phase-commit sink: everything the contract suite needs to know of it.

Decisions (why the adapters look the way they do):

- An adapter class holds what is known without services (its name, format, fixtures,
  crash points, resource call names, documented options, option changes, the cases that do
  not apply and why), so that pytest can parametrize and mark cases at collection time. A
  bound adapter (``open``) holds one test's target: a table, an S3 prefix or a topic named
  after the test, and reads that target's state straight from the service.
- The end state is read from the service, never from the sink's own code paths: output
  rows as a ``Counter`` (a row twice counts 2), leftovers as one readable line each
  (prepared transactions, staged rows, multipart uploads in progress, open Kafka
  transactions), decisions normalised to ``done`` / ``pending`` / ``aborted`` (a fence).
  Leftovers and decisions are asked for the sink ids a test's runs used (an option change
  that gives the sink another id must not hide the first id's leftovers); S3 uploads and
  staged rows are listed for the whole target, which belongs to the test.
- The sink id of a run is what the sink derives: the connector's own option parser gives
  the target, the checkpoint's metadata the query id (``derive_sink_id``).
- Option changes across a restart keep the target and change how it is addressed or how
  the sink runs; each is a pure function of a bound adapter's options, so the same change
  runs in the chained default-lane test and alone in the chaos lane.
- A case that cannot apply to a sink is not silently passed: the adapter names the reason
  and the case skips with it (``not_applicable``).
- Known holes of a sink (issue 25) are marks on the adapter's parameters
  (``pytest.mark.xfail(strict=True)``), so that a fix turns them into failures to remove.
- 2pc-kafka on Kafka as production runs it (issue 37: a 3-node cluster, a SASL_SSL broker
  with a least-privilege user) is the same adapter bound to another fixture
  (``PRODUCTION_ADAPTERS``), kept out of ``ADAPTERS`` so that ``make test`` never starts
  those brokers; ``test_sink_contract_production_kafka.py`` runs them.
"""

from __future__ import annotations

import contextlib
import importlib
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest
from pyspark.sql.types import StructType

from eospack.commit_protocols import ALL_FAULT_POINTS, derive_sink_id

Options = dict[str, str]
Rows = Counter[tuple[int, str]]

EXACTLY_ONCE = "exactly-once"
AT_LEAST_ONCE = "at-least-once"


def hole(number: int, what: str) -> pytest.MarkDecorator:
    """A case that fails because of 2pc-kafka's hole ``number`` of issue 25 (being fixed)."""
    return pytest.mark.xfail(strict=True, reason=f"issue 25 hole {number}: {what}")


@dataclass(frozen=True)
class OptionChange:
    """One change a user could make across a restart, keeping the target."""

    name: str
    change: Callable[[BoundSink, Options], Options]
    """From the options of the run before to those of the restart."""
    mark: pytest.MarkDecorator | None = None
    refusal_allowed: str | None = None
    """If the sink may refuse the restart instead (a one-line error naming this option),
    after which the test restarts with the previous options; None: it must run."""
    follows: str | None = None
    """The change this one undoes (run first when this one runs alone)."""
    chaos_only: bool = False
    """Left out of the default lane's chain (a value that may differ, not another address
    of the target: the cost of a restart each, for what one real query rarely misses)."""


@dataclass(frozen=True)
class DocumentedOption:
    """One option of the sink's docs page table with a valid value (a function of the bound sink
    when the value depends on the service, e.g. a URL)."""

    name: str
    sample: str | Callable[[BoundSink], str]
    mark: pytest.MarkDecorator | None = None
    extra: Mapping[str, str] = field(default_factory=dict)
    """Options the sample needs with it (``upsertKeys`` with ``writeMode=upsert``)."""


@dataclass(frozen=True)
class CallFaults:
    """The sink's resource call names (``eospack.core.faults``)."""

    decide: str
    """The decision's write (for an atomic protocol, the commit itself)."""
    commit_piece: str | None
    """One piece's commit; None for a protocol that commits a batch in one transaction."""
    prepare: str | None
    """A task's last call before it reports its piece (a ``crash`` there kills its worker);
    None where the sink's task makes no named call (2pc-jdbc's staging protocol)."""
    every: tuple[str, ...]
    """Every call the chaos lane faults, before and after it applies."""


class BoundSink:
    """An adapter bound to one test's target (see the module docstring)."""

    adapter: type[SinkAdapter]

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path, name: str) -> None:
        self.request = request
        self.tmp_path = tmp_path
        self.name = name
        self.spark = request.getfixturevalue("spark")

    def base_options(self) -> Options:
        """The target and how to reach it: what every run of the test passes."""
        raise NotImplementedError

    def rows(self, options: Options) -> Rows:
        """The output rows as (id, grp), each as often as it is visible to readers."""
        raise NotImplementedError

    def stream_writer(self, options: Options) -> Any:
        """The sink's own stream writer for ``options``, as Spark makes it at query start
        (it says the target and sink id; tests use it to prepare a piece by hand)."""
        module, _, name = self.adapter.data_source.partition(":")
        source_class = getattr(importlib.import_module(module), name)
        source = source_class({key.lower(): value for key, value in options.items()})
        return source.streamWriter(StructType.fromDDL(self.adapter.schema), False)

    def sink_id(self, options: Options, query_id: str) -> str:
        """The id the sink derives: from the query id and the target its writer names."""
        writer = self.stream_writer(options)
        return writer.sink_id or derive_sink_id(query_id, writer.target)

    def leftovers(self, sink_ids: set[str], options: Options) -> list[str]:
        """Prepared, staged, in-progress or open work of these sinks, one line each."""
        raise NotImplementedError

    def decisions(self, sink_ids: set[str], options: Options) -> dict[tuple[str, int], str]:
        """Each decision of these sinks: ``done``, ``pending`` or ``aborted`` (a fence)."""
        raise NotImplementedError

    @contextlib.contextmanager
    def another_sink_mid_decision(self, options: Options) -> Iterator[None]:
        """While inside: another sink sharing this sink's ledger or prefix is stuck in the
        middle of writing a decision (it crashed, or hangs, with the write open)."""
        yield

    def slow_batch(self) -> tuple[Options, float]:
        """Options with a short timeout on prepared work, and how long a task must stall
        to outlive it; only for sinks whose ``timeout_not_applicable`` is None."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the bound adapter holds (clients, held transactions)."""


class SinkAdapter:
    """What the contract suite knows of one sink without services (see module docstring)."""

    name: ClassVar[str]
    sink_format: ClassVar[str]
    fixtures: ClassVar[tuple[str, ...]]
    data_source: ClassVar[str]
    """``module:Class`` of the sink's DataSource."""
    schema: ClassVar[str] = "id BIGINT, grp STRING, version BIGINT"
    """The schema the sink receives (``inputs.start_query``)."""
    as_kafka_records: ClassVar[bool] = False
    crash_points: ClassVar[tuple[str, ...]] = ALL_FAULT_POINTS
    default_crash_point: ClassVar[str] = "between_piece_commits"
    calls: ClassVar[CallFaults]
    documented_options: ClassVar[tuple[DocumentedOption, ...]]
    option_changes: ClassVar[tuple[OptionChange, ...]]
    timeout_not_applicable: ClassVar[str | None] = None
    """Why "a batch slower than the sink's timeout" cannot happen, or None."""
    marks: ClassVar[Mapping[str, pytest.MarkDecorator]] = {}
    """Per case (the test function's name): a known hole of this sink."""
    bound: ClassVar[type[BoundSink]]

    @classmethod
    def open(cls, request: pytest.FixtureRequest, tmp_path: Path, name: str) -> BoundSink:
        for fixture in cls.fixtures:
            request.getfixturevalue(fixture)
        sink = cls.bound(request, tmp_path, name)
        sink.adapter = cls
        return sink


# 2pc-jdbc ------------------------------------------------------------------------------


def _switch(name: str, value: str) -> Callable[[BoundSink, Options], Options]:
    return lambda _sink, options: {**options, name: value}
