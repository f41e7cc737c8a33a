"""``--plot``: printed count over time per pipeline, with count_1's crashes marked."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


def plot_timeline(timeline: Any, labels: Mapping[str, str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(9, 4.5), dpi=110)
    for name, samples in timeline.totals.items():
        if samples:
            times, totals = zip(*samples, strict=True)
            axes.step(times, totals, where="post", label=labels.get(name, name))
    for index, moment in enumerate(timeline.crash_times):
        axes.axvline(
            moment,
            color="red",
            linestyle="--",
            linewidth=1,
            label="SIGKILL of count_1" if index == 0 else None,
        )
    axes.set_xlabel("seconds since start")
    axes.set_ylabel("sum of printed counts")
    axes.set_title("eospack demo: printed counts, exactly once across crashes")
    axes.legend(loc="upper left")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
