"""eospack.core.metrics without Spark: the snapshot files, their merge across processes,
recording off by default, and serve() refused in one line without prometheus_client."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from eospack.core import metrics
from eospack.core.metrics import METRICS_DIR_VARIABLE, Recorder, read_directory

ROOT = Path(__file__).resolve().parent.parent


def test_recording_is_off_without_the_directory(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv(METRICS_DIR_VARIABLE, raising=False)
    recorder = Recorder()
    recorder.add("eospack_sink_batches_committed_total", {"sink": "s"})
    assert recorder.snapshot.counters == {}


def test_processes_merge_counters_histograms_add_and_the_newest_gauge_wins(
    monkeypatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(METRICS_DIR_VARIABLE, str(tmp_path))
    first, second = Recorder(), Recorder()
    second._file_name = "other.json"
    labels = {"sink": "2pc-jdbc", "sink_id": "a"}
    first.add("eospack_sink_rows_committed_total", labels, 10)
    second.add("eospack_sink_rows_committed_total", labels, 5)
    first.observe("eospack_sink_commit_seconds", labels, 0.003)
    second.observe("eospack_sink_commit_seconds", labels, 7.0)
    first.set("eospack_kafka_source_lag_records", {"partition": 0}, 9)
    first.flush()
    second.set("eospack_kafka_source_lag_records", {"partition": 0}, 0)
    second.flush()
    merged = read_directory(tmp_path)
    key = ("eospack_sink_rows_committed_total", tuple(sorted(labels.items())))
    assert merged.counters[key] == 15
    histogram = merged.histograms[("eospack_sink_commit_seconds", key[1])]
    assert histogram.count == 2 and histogram.total == pytest.approx(7.003)
    assert histogram.counts[0] == 1 and histogram.counts[metrics.SECONDS_BUCKETS.index(10.0)] == 1
    assert merged.gauges[("eospack_kafka_source_lag_records", (("partition", "0"),))][0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([first._file_name, "other.json"])
    assert json.loads((tmp_path / "other.json").read_text())["counters"]


def test_an_unwritable_directory_never_raises(monkeypatch, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(METRICS_DIR_VARIABLE, str(blocker / "metrics"))
    recorder = Recorder()
    recorder.add("eospack_sink_batches_committed_total", {"sink": "s"})
    recorder.flush()


def test_serve_without_prometheus_client_names_the_install_command(monkeypatch) -> None:
    from eospack.tools.metrics import MetricsUnavailableError, serve

    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(MetricsUnavailableError) as raised:
        serve(None, port=0)
    assert str(raised.value) == (
        "eospack metrics need the prometheus_client package: pip install 'eospack[metrics]'"
    )


def test_the_grafana_dashboard_queries_exactly_the_recorded_metrics() -> None:
    """docs/grafana-dashboard.json: every expression names metrics eospack records (a
    histogram through its ``_bucket``/``_count``/``_sum``), and every metric has a panel."""
    import re

    dashboard = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text())
    expressions = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    used = set()
    for name in re.findall(r"eospack_[a-z_]+", " ".join(expressions)):
        base = re.sub(r"_(bucket|count|sum)$", "", name)
        info = metrics.METRICS.get(base)
        assert info is not None, f"{name} is not a recorded metric"
        assert base == name or info.kind == "histogram", name
        used.add(base)
    assert used == set(metrics.METRICS)
    documented = (ROOT / "docs" / "metrics.md").read_text()
    assert all(f"`{name}`" in documented for name in metrics.METRICS)


def test_flush_soon_rewrites_the_file_once_for_the_recordings_that_come_meanwhile(
    monkeypatch, tmp_path: Path
) -> None:
    """Executor-side recordings (many key groups per batch) ask flush_soon: one rewrite,
    within the delay, holding all of them."""
    from eospack.lab.testing import wait_until

    monkeypatch.setenv(METRICS_DIR_VARIABLE, str(tmp_path))
    recorder = Recorder()
    writes: list[int] = []
    flush = recorder.flush
    monkeypatch.setattr(recorder, "flush", lambda: (flush(), writes.append(1)))
    for key_group in range(50):
        labels = {"query": "q", "operator": "running_count", "key_group": str(key_group)}
        recorder.set("eospack_state_keys", labels, key_group)
        recorder.flush_soon(delay_seconds=0.2)
    wait_until(lambda: len(writes) == 1, 10, "the delayed flush")
    gauges = read_directory(tmp_path).gauges
    assert sorted(value for (name, _), (value, _) in gauges.items()) == list(range(50))
    assert len(writes) == 1


def test_a_recording_that_comes_while_the_timer_writes_is_written_too(
    monkeypatch, tmp_path: Path
) -> None:
    """The last key group of a batch may record while the timer's flush is writing the
    file (after it took its copy): that recording must get a flush of its own, or the
    scrape shows the older value until the worker records again."""
    from eospack.lab.testing import wait_until

    monkeypatch.setenv(METRICS_DIR_VARIABLE, str(tmp_path))
    recorder = Recorder()
    labels = {"query": "q", "operator": "running_count", "key_group": "0"}
    flush = recorder.flush
    late: list[bool] = []

    def flush_then_a_late_recording() -> None:
        flush()
        if not late:  # still on the timer's thread: a recording arrives now
            late.append(True)
            recorder.set("eospack_state_keys", labels, 2)
            recorder.flush_soon(delay_seconds=0.05)

    monkeypatch.setattr(recorder, "flush", flush_then_a_late_recording)
    recorder.set("eospack_state_keys", labels, 1)
    recorder.flush_soon(delay_seconds=0.05)

    def written() -> float | None:
        gauges = read_directory(tmp_path).gauges
        return next((value for (name, _), (value, _) in gauges.items()), None)

    wait_until(lambda: written() == 2, 10, "the late recording written")
