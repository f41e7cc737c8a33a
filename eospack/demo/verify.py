"""What the demo checks at the end, as pure functions of what it read back."""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class PipelineResult:
    """One pipeline's verdict: every field but ``counted`` and ``crashes`` must be 0."""

    name: str
    crashes: int
    counted: int
    lost: int
    duplicated: int
    history_regressions: int
    leftovers: int

    @property
    def verified(self) -> bool:
        return not (self.lost or self.duplicated or self.history_regressions or self.leftovers)


def check_pipeline(
    name: str,
    crashes: int,
    produced: Mapping[str, int],
    current: Mapping[str, int],
    history: Iterable[tuple[str, int, int, int]],
    observed_regressions: int,
    leftovers: int,
) -> PipelineResult:
    """Compare a pipeline's tables with what was produced.

    ``current`` maps key -> printed count; ``history`` holds every printed
    (key, count, version, batch_id) row. Lost and duplicated compare per key with
    ``produced``; a history row printed twice for the same (key, version) is a duplicate too
    (what at-least-once delivery does on replay). A regression is a count that goes down as
    the micro-batch id goes up in the history, or a decrease seen while sampling ``current``.
    """
    lost = sum(max(count - current.get(key, 0), 0) for key, count in produced.items())
    duplicated = sum(max(count - produced.get(key, 0), 0) for key, count in current.items())
    history = list(history)
    printed = Counter((key, version) for key, _, version, _ in history)
    duplicated += sum(times - 1 for times in printed.values())
    by_key: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for key, count, _, batch_id in history:
        by_key[key].append((batch_id, count))
    regressions = observed_regressions
    for rows in by_key.values():
        counts = [count for _, count in sorted(set(rows))]
        regressions += sum(1 for before, after in itertools.pairwise(counts) if after < before)
    return PipelineResult(
        name=name,
        crashes=crashes,
        counted=sum(current.values()),
        lost=lost,
        duplicated=duplicated,
        history_regressions=regressions,
        leftovers=leftovers,
    )


def count_decreases(previous: Mapping[str, int], latest: Mapping[str, int]) -> int:
    """Keys whose printed count went down between two samples of a current table."""
    return sum(1 for key, count in latest.items() if count < previous.get(key, 0))


def verification_table(produced: int, results: list[PipelineResult]) -> str:
    rows = [
        ("produced", *(str(produced) for _ in results)),
        ("counted", *(str(r.counted) for r in results)),
        ("lost", *(str(r.lost) for r in results)),
        ("duplicated", *(str(r.duplicated) for r in results)),
        ("history regressions", *(str(r.history_regressions) for r in results)),
        ("leftover prepared/staged", *(str(r.leftovers) for r in results)),
        ("crashes", *(str(r.crashes) for r in results)),
        ("verified", *("yes" if r.verified else "NO" for r in results)),
    ]
    header = ("", *(r.name for r in results))
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) for row in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)
