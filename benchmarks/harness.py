"""Measuring, comparing and reporting: medians after a warm-up, ratios against baselines."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


AMOUNT_UNITS = ("s", "keys", "bytes")
"""Units whose figures are amounts (seconds taken, keys held, bytes written) rather than
rates: ``seconds`` holds the amounts, and comparisons divide amounts, not rates."""


@dataclass(frozen=True)
class Figure:
    """Repeated timings of one contender doing ``units`` of work each time; with unit
    ``keys`` or ``bytes``, ``seconds`` holds key counts or sizes (amounts, as for unit ``s``)."""

    label: str
    seconds: tuple[float, ...]
    units: float
    unit: str = "records/s"

    @property
    def median_seconds(self) -> float:
        return statistics.median(self.seconds)

    @property
    def rate(self) -> float:
        return self.units / self.median_seconds if self.median_seconds > 0 else float("inf")

    def describe(self) -> str:
        if self.unit == "s":
            return f"{self.median_seconds:.2f} s"
        if self.unit == "keys":
            return f"{self.median_seconds:,.0f} keys"
        if self.unit == "bytes":
            return f"{_human(self.median_seconds)}B"
        return f"{_human(self.rate)} {self.unit}"


@dataclass(frozen=True)
class Comparison:
    """``subject`` against ``baseline``; the ratio is rate/rate, or amount/amount for the
    ``AMOUNT_UNITS`` (time/time, keys/keys, bytes/bytes)."""

    benchmark: str
    size: str
    subject: Figure
    baseline: Figure
    target: float | None = None
    higher_is_better: bool = True
    note: str = ""

    @property
    def ratio(self) -> float:
        if self.subject.unit in AMOUNT_UNITS:
            return self.subject.median_seconds / self.baseline.median_seconds
        return self.subject.rate / self.baseline.rate

    @property
    def target_met(self) -> bool | None:
        if self.target is None:
            return None
        return self.ratio >= self.target if self.higher_is_better else self.ratio <= self.target

    def target_text(self) -> str:
        if self.target is None:
            return "-"
        return f"{'>=' if self.higher_is_better else '<='} {self.target:g}x"


@dataclass
class Report:
    comparisons: list[Comparison] = field(default_factory=list)
    figures: list[tuple[str, Figure]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, comparison: Comparison) -> None:
        self.comparisons.append(comparison)
        met = {True: "met", False: "NOT met", None: ""}[comparison.target_met]
        say(
            f"  {comparison.benchmark} [{comparison.size}]: {comparison.subject.label}"
            f" {comparison.subject.describe()} vs {comparison.baseline.label}"
            f" {comparison.baseline.describe()} -> {comparison.ratio:.2f}x {met}"
        )

    def add_figure(self, benchmark: str, figure: Figure) -> None:
        self.figures.append((benchmark, figure))
        say(f"  {benchmark}: {figure.label} {figure.describe()}")

    def summary_table(self) -> str:
        lines = [
            "| benchmark | size | eospack | baseline | ratio | target | met |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for c in self.comparisons:
            met = {True: "yes", False: "**no**", None: "-"}[c.target_met]
            lines.append(
                f"| {c.benchmark} | {c.size} | {c.subject.label}: {c.subject.describe()}"
                f" | {c.baseline.label}: {c.baseline.describe()} | {c.ratio:.2f}x"
                f" | {c.target_text()} | {met} |"
            )
        return "\n".join(lines)

    def markdown(self, title: str) -> str:
        raw = [
            "| benchmark | contender | units | seconds per repetition | rate |",
            "| --- | --- | --- | --- | --- |",
        ]
        seen: set[int] = set()
        everything = [(c.benchmark, f) for c in self.comparisons for f in (c.subject, c.baseline)]
        for benchmark, figure in [*everything, *self.figures]:
            if id(figure) in seen:
                continue
            seen.add(id(figure))
            timings = ", ".join(
                f"{s:,.0f}" if figure.unit == "keys" else f"{s:.3f}" for s in figure.seconds
            )
            raw.append(
                f"| {benchmark} | {figure.label} | {figure.units:g} | {timings}"
                f" | {figure.describe()} |"
            )
        notes = "\n".join(f"- {note}" for note in self.notes)
        return (
            f"# {title}\n\n{machine_description()}\n\n## Ratios\n\n{self.summary_table()}\n\n"
            f"## Raw figures (medians of the repetitions after one warm-up)\n\n"
            + "\n".join(raw)
            + (f"\n\n## Notes\n\n{notes}\n" if notes else "\n")
        )


def measure(
    run: Callable[[], object],
    repetitions: int,
    warmups: int = 1,
    setup: Callable[[], object] | None = None,
) -> tuple[float, ...]:
    """Seconds of ``run()`` per repetition, after ``warmups`` untimed runs; ``setup`` is untimed."""
    timings = []
    for index in range(warmups + repetitions):
        if setup is not None:
            setup()
        started = time.perf_counter()
        run()
        elapsed = time.perf_counter() - started
        if index >= warmups:
            timings.append(elapsed)
    return tuple(timings)


def scaling_note(label: str, by_size: dict[int, Figure]) -> str:
    """Seconds per 100k units at each size: flat or falling means time grows linearly
    (no per-batch cost that grows with what was committed before)."""
    per_unit = {size: figure.median_seconds / (size / 100_000) for size, figure in by_size.items()}
    sizes = sorted(per_unit)
    growth = per_unit[sizes[-1]] / per_unit[sizes[0]]
    steps = ", ".join(f"{per_unit[size]:.2f} s at {size:,}" for size in sizes)
    verdict = "linear or better" if growth <= 1.1 else f"{growth:.2f}x per record: NOT linear"
    return f"scale, {label}: seconds per 100k rows {steps} -> {verdict}"


def machine_description() -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False)
    java_line = (java.stderr.splitlines() or ["java: unknown"])[0]
    import pyspark

    return (
        f"Machine: {os.cpu_count()} cores ({cpu}), {memory:.0f} GiB, {platform.system()}"
        f" {platform.release()}; Python {platform.python_version()}, PySpark"
        f" {pyspark.__version__}, {java_line}."
    )


def _human(value: float) -> str:
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= limit:
            return f"{value / limit:.2f}{suffix}"
    return f"{value:.2f}"
