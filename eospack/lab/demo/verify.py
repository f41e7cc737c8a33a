"""What the demo checks at the end, as pure functions of what it read back."""

from __future__ import annotations

import itertools
import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


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
    """Compare a pipeline's output with what was produced.

    ``current`` maps key -> printed count; ``history`` holds every printed
    (key, count, version, position) row, where position orders one key's rows: the
    micro-batch id of a 2pc-jdbc history row, the offset of a 2pc-kafka record. Lost and
    duplicated compare per key with ``produced``; a row printed twice for the same
    (key, version) is a duplicate too (what at-least-once delivery does on replay). A
    regression is a count that goes down as the position goes up in the history, plus the
    ``observed_regressions`` seen while sampling (decreases of ``current`` over time).
    """
    lost = sum(max(count - current.get(key, 0), 0) for key, count in produced.items())
    duplicated = sum(max(count - produced.get(key, 0), 0) for key, count in current.items())
    history = list(history)
    printed = Counter((key, version) for key, _, version, _ in history)
    duplicated += sum(times - 1 for times in printed.values())
    by_key: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for key, count, _, position in history:
        by_key[key].append((position, count))
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


@dataclass
class PrintedCounts:
    """A pipeline's 2pc-kafka output as a read_committed consumer has read it so far.

    Fed record by record (``add``) in offset order per partition, as a consumer returns
    them: the sink partitions by key, so that is also the order in which each key's counts
    were printed. ``current`` is the last count per key, ``history`` every record as
    (key, count, version, offset) for ``check_pipeline``, and ``regressions`` the records
    whose count is below the key's previous one. Built incrementally so that the demo's
    consumer reads each record once, during the run and at the end alike.
    """

    current: dict[str, int] = field(default_factory=dict)
    history: list[tuple[str, int, int, int]] = field(default_factory=list)
    regressions: int = 0

    def add(self, key: bytes | str | None, value: bytes | str | None, offset: int) -> bool:
        """Take one record (value: the pipeline's ``{"count": c, "version": v}``); return
        whether its count went below the key's previous one."""
        if key is None or value is None:
            raise ValueError(f"output record at offset {offset} has no key or no value")
        name = key.decode() if isinstance(key, bytes) else key
        try:
            printed = json.loads(value)
            count, version = int(printed["count"]), int(printed["version"])
        except (ValueError, TypeError, KeyError) as error:
            raise ValueError(
                f"output record of {name} at offset {offset} is not a printed count:"
                f" {value!r} ({error})"
            ) from None
        went_down = count < self.current.get(name, 0)
        self.regressions += went_down
        self.current[name] = count
        self.history.append((name, count, version, offset))
        return went_down

    @property
    def counted(self) -> int:
        return sum(self.current.values())


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
