"""``eospack demo --metrics``: serve the pipelines' metrics while the demo runs, and say at
the end what a scrape of the endpoint shows (docs/metrics.md, docs/grafana-dashboard.json).

The pipelines are separate driver processes (SIGKILLed and restarted); each inherits the
snapshot directory through ``EOSPACK_METRICS_DIR`` (``serve`` sets it in this process's
environment before they start), so counters survive the kills and one endpoint shows them all.
"""

from __future__ import annotations

import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from eospack.tools.metrics import MetricsEndpoint, serve


def start_metrics(port: int, workdir: Path) -> MetricsEndpoint:
    """The endpoint on 127.0.0.1:``port`` (0: a free one), reading ``workdir/metrics``.
    Raises ``MetricsUnavailableError`` (one line, the install command) without
    prometheus_client."""
    return serve(port=port, directory=str(workdir / "metrics"))


@dataclass
class SinkFigures:
    batches: float = 0.0
    commits: float = 0.0
    commit_seconds: float = 0.0
    waiting: float | None = None
    rolled_forward: float = 0.0
    rolled_back: float = 0.0


@dataclass
class Scrape:
    """What the demo reports of one scrape: the lag per query and partition, per sink id
    its batches, commit latency, pieces waiting and recoveries."""

    lag: dict[str, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    sinks: dict[str, SinkFigures] = field(default_factory=lambda: defaultdict(SinkFigures))

    def lines(self) -> list[str]:
        said = []
        for query, partitions in sorted(self.lag.items()):
            said.append(
                f"metrics: source lag of {query}: {max(partitions.values()):.0f} records at most"
                f" over {len(partitions)} partitions"
            )
        for sink_id, figures in sorted(self.sinks.items()):
            mean = figures.commit_seconds / figures.commits * 1000 if figures.commits else 0.0
            waiting = "-" if figures.waiting is None else f"{figures.waiting:.0f}"
            said.append(
                f"metrics: sink {sink_id}: {figures.batches:.0f} batches committed, commit"
                f" latency histogram of {figures.commits:.0f} commits (mean {mean:.1f} ms),"
                f" pieces waiting {waiting}, recoveries rolled {figures.rolled_forward:.0f}"
                f" batches forward and {figures.rolled_back:.0f} pieces back"
            )
        return said


def scrape(url: str) -> Scrape:
    """Read the endpoint once (Prometheus' text format)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    seen = Scrape()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels, value = sample.labels, float(sample.value)
            sink = seen.sinks[labels["sink_id"]] if "sink_id" in labels else None
            if sample.name == "eospack_kafka_source_lag_records":
                seen.lag[labels["query"]][f"{labels['topic']}/{labels['partition']}"] = value
            elif sink is None:
                continue
            elif sample.name == "eospack_sink_batches_committed_total":
                sink.batches += value
            elif sample.name == "eospack_sink_commit_seconds_count":
                sink.commits += value
            elif sample.name == "eospack_sink_commit_seconds_sum":
                sink.commit_seconds += value
            elif sample.name == "eospack_sink_pieces_waiting":
                sink.waiting = value
            elif sample.name == "eospack_sink_recovery_rolled_forward_batches_total":
                sink.rolled_forward += value
            elif sample.name == "eospack_sink_recovery_rolled_back_pieces_total":
                sink.rolled_back += value
    return seen
