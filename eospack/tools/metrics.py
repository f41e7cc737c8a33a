"""The Prometheus endpoint of eospack's metrics (public as ``eospack.metrics.serve``).

``serve(spark, port=9464)`` starts an HTTP endpoint in the user's process that, at each
scrape, reads the snapshot files the pack's driver-side processes write
(``eospack.core.metrics``: why files, and what they cost) and answers in Prometheus' text
format. It points those processes at the directory by putting ``EOSPACK_METRICS_DIR`` into
the environment Spark gives every Python process of each eospack format, so it must be
called before the queries it should see start (a query started earlier records nothing).
Setting ``EOSPACK_METRICS_DIR`` in the environment before Spark starts does the same for
every process, Spark Connect servers and other sessions included; ``serve`` then reads
that directory. Opt-in: ``prometheus_client`` is an optional extra
(``pip install 'eospack[metrics]'``); nothing is recorded unless metrics are on.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eospack.core.errors import EospackError
from eospack.core.metrics import (
    METRICS,
    METRICS_DIR_VARIABLE,
    RECORDER,
    SECONDS_BUCKETS,
    Labels,
    MetricInfo,
    read_directory,
)
from eospack.tools.formats import FORMATS

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

INSTALL_HINT = "pip install 'eospack[metrics]'"


class MetricsUnavailableError(EospackError, ImportError):
    """Metrics were asked for but prometheus_client is not installed."""


@dataclass
class MetricsEndpoint:
    """A running endpoint: where it listens and which directory it reads."""

    port: int
    directory: str
    _server: Any
    _thread: Any
    _spark: Any = None
    _listener: Any = None
    address: str = "127.0.0.1"

    @property
    def url(self) -> str:
        """Where this process scrapes it: the bound address, or loopback for a wildcard."""
        host = "127.0.0.1" if self.address in ("", "0.0.0.0") else self.address
        host = "[::1]" if host == "::" else f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving, and stop recording in the processes Spark starts from now on."""
        self._server.shutdown()
        self._server.server_close()
        if os.environ.get(METRICS_DIR_VARIABLE) == self.directory:
            del os.environ[METRICS_DIR_VARIABLE]
        if self._spark is not None:
            _point_formats_at(self._spark, None)
            if self._listener is not None:
                self._spark.streams.removeListener(self._listener)


def serve(
    spark: SparkSession | None = None,
    port: int = 9464,
    addr: str = "127.0.0.1",
    directory: str | None = None,
) -> MetricsEndpoint:
    """Start the endpoint on ``addr:port`` (0 picks a free port) and turn metrics on for
    the queries ``spark`` starts from now on. ``directory``: where snapshots go (default
    ``EOSPACK_METRICS_DIR`` if set, else a new temporary directory)."""
    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError:
        raise MetricsUnavailableError(
            f"eospack metrics need the prometheus_client package: {INSTALL_HINT}"
        ) from None
    chosen = (
        directory
        or os.environ.get(METRICS_DIR_VARIABLE)
        or tempfile.mkdtemp(prefix="eospack-metrics-")
    )
    os.makedirs(chosen, exist_ok=True)
    os.environ[METRICS_DIR_VARIABLE] = chosen
    listener = None
    if spark is not None:
        _point_formats_at(spark, chosen)
        listener = _listen_to_progress(spark)
    registry = CollectorRegistry(auto_describe=True)
    registry.register(SnapshotCollector(chosen))
    server, thread = start_http_server(port, addr=addr, registry=registry)
    return MetricsEndpoint(
        server.server_port, chosen, server, thread, spark, listener, address=addr
    )


_REPORTED: dict[str, int] = {}
_REPORTED_LOCK = threading.Lock()


def _first_report(query_id: str, batch_id: int) -> bool:
    """True once per query and batch in this process: every endpoint served on a session
    adds a listener, and each hears every progress event, so a batch's late rows would
    count once per endpoint. Batch ids only grow within a query id (a restart from the
    checkpoint continues them; a batch replayed after a crash reported no progress)."""
    with _REPORTED_LOCK:
        if _REPORTED.get(query_id, -1) >= batch_id:
            return False
        _REPORTED[query_id] = batch_id
        return True


def _listen_to_progress(spark: SparkSession) -> Any:
    """A StreamingQueryListener recording what only Spark's progress knows: the rows its
    stateful operators dropped behind the watermark (``numRowsDroppedByWatermark``, per
    query id). None on Spark Connect, whose listeners run in the server."""
    from pyspark.sql.streaming import StreamingQueryListener

    from eospack.tools.registration import is_spark_connect

    if is_spark_connect(spark):
        return None

    class ProgressListener(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            progress = event.progress
            dropped = sum(
                operator.numRowsDroppedByWatermark for operator in progress.stateOperators
            )
            if dropped and _first_report(str(progress.id), progress.batchId):
                labels = {"query": str(progress.id)}
                RECORDER.add("eospack_state_late_rows_dropped_total", labels, dropped)
                RECORDER.flush()

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    listener = ProgressListener()
    spark.streams.addListener(listener)
    return listener


PORT_CONF = "spark.eospack.metrics.port"
"""A Spark conf (``--conf``, spark-defaults.conf, the session builder): ``eospack.register``
then serves the metrics on that port, as ``serve(spark, port=...)`` would."""
ADDRESS_CONF = "spark.eospack.metrics.address"
"""Where the conf-started endpoint listens (default 127.0.0.1; 0.0.0.0 for a scraper on
another host)."""
_SERVED_FROM_CONF: dict[tuple[str, str], MetricsEndpoint] = {}


class MetricsConfError(EospackError, ValueError):
    """``spark.eospack.metrics.port`` is not a port."""


def serve_from_conf(spark: SparkSession) -> MetricsEndpoint | None:
    """When ``spark.eospack.metrics.port`` is set: the endpoint it asks for, started on the
    first call in this process and returned again on later ones (``register`` calls this
    each time). None when unset. A value that is no port fails in one line naming the conf,
    before any query starts."""
    value = (spark.conf.get(PORT_CONF, None) or "").strip()
    if not value:
        return None
    address = (spark.conf.get(ADDRESS_CONF, None) or "127.0.0.1").strip()
    if not value.isdigit() or int(value) > 65535:
        raise MetricsConfError(
            f"{PORT_CONF}={value!r} is not a port: set it to a number from 1 to 65535 (0: a"
            " free one), or unset it"
        )
    key = (address, value)
    if key not in _SERVED_FROM_CONF:
        _SERVED_FROM_CONF[key] = serve(spark, port=int(value), addr=address)
    return _SERVED_FROM_CONF[key]


def _point_formats_at(spark: SparkSession, directory: str | None) -> None:
    """Put the directory into the environment map Spark hands every Python process of
    each eospack format (the source runner, the commit runner, planners, tasks); None
    takes it out."""
    from eospack.tools.registration import is_spark_connect, register

    if is_spark_connect(spark):
        return  # the server's processes read the variable from the server's environment
    register(spark)
    manager = spark._jsparkSession.sessionState().dataSourceManager()  # type: ignore[attr-defined]
    for entry in FORMATS.values():
        name = entry.data_source.load().name()
        environment = manager.lookupDataSource(name).dataSourceCls().envVars()
        if directory is None:
            environment.remove(METRICS_DIR_VARIABLE)
        else:
            environment.put(METRICS_DIR_VARIABLE, directory)


class SnapshotCollector:
    """A prometheus_client collector that reads the snapshot directory at each scrape."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        snapshot = read_directory(self.directory)
        for name, info in METRICS.items():
            if info.kind == "counter":
                counter = CounterMetricFamily(name, info.help, labels=info.labels)
                counters = ((key, value) for key, value in snapshot.counters.items())
                for values, total in _summed(name, info, counters):
                    counter.add_metric(values, total)
                yield counter
            elif info.kind == "gauge":
                gauge = GaugeMetricFamily(name, info.help, labels=info.labels)
                gauges = ((key, value) for key, (value, _) in snapshot.gauges.items())
                for values, total in _summed(name, info, gauges):
                    gauge.add_metric(values, total)
                yield gauge
            else:
                histogram = HistogramMetricFamily(name, info.help, labels=info.labels)
                for (metric, labels), observed in sorted(snapshot.histograms.items()):
                    if metric != name:
                        continue
                    buckets, running = [], 0
                    for bound, count in zip(SECONDS_BUCKETS, observed.counts, strict=True):
                        running += count
                        buckets.append(("+Inf" if bound == float("inf") else str(bound), running))
                    histogram.add_metric(_values(info.labels, labels), buckets, observed.total)
                yield histogram


def _summed(
    name: str, info: MetricInfo, samples: Iterable[tuple[tuple[str, Labels], float]]
) -> list[tuple[list[str], float]]:
    """The samples of ``name`` by the metric's declared labels, in label order. A label
    recorded but not declared (a stateful operator's ``key_group``) is summed away: each
    key group's newest gauge value, added up per operator."""
    totals: dict[tuple[str, ...], float] = {}
    for (metric, labels), value in samples:
        if metric == name:
            values = tuple(_values(info.labels, labels))
            totals[values] = totals.get(values, 0.0) + value
    return [(list(values), total) for values, total in sorted(totals.items())]


def _values(names: tuple[str, ...], labels: tuple[tuple[str, str], ...]) -> list[str]:
    given = dict(labels)
    return [given.get(name, "") for name in names]
