"""``--plot``: printed count over time per pipeline, with count_1's crashes marked; with
``--metrics`` also each pipeline's source lag and the sinks' commit latency beneath."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


def plot_timeline(timeline: Any, labels: Mapping[str, str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with_metrics = bool(timeline.lag or timeline.commit_ms)
    figure, panes = plt.subplots(
        3 if with_metrics else 1,
        1,
        figsize=(9, 9 if with_metrics else 4.5),
        dpi=110,
        sharex=True,
        squeeze=False,
    )
    counts = panes[0][0]
    for name, samples in timeline.totals.items():
        if samples:
            times, totals = zip(*samples, strict=True)
            counts.step(times, totals, where="post", label=labels.get(name, name))
    counts.set_ylabel("sum of printed counts")
    counts.set_title("eospack demo: printed counts, exactly once across crashes")
    if with_metrics:
        lag, latency = panes[1][0], panes[2][0]
        for name, samples in timeline.lag.items():
            times, values = zip(*samples, strict=True)
            lag.step(times, values, where="post", label=labels.get(name, name))
        lag.set_ylabel("source lag (records)")
        if timeline.commit_ms:
            times, values = zip(*timeline.commit_ms, strict=True)
            latency.plot(times, values, marker=".", label="all sinks")
        latency.set_ylabel("mean commit latency (ms)")
    for row in panes:
        axes = row[0]
        for index, moment in enumerate(timeline.crash_times):
            axes.axvline(
                moment,
                color="red",
                linestyle="--",
                linewidth=1,
                label="SIGKILL of count_1" if index == 0 else None,
            )
        axes.legend(loc="upper left")
        axes.grid(alpha=0.3)
    panes[-1][0].set_xlabel("seconds since start")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
