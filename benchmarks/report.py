"""``python -m benchmarks.report [--check]``: the generated blocks of ``docs/performance.md``.

The page's tables are made from the committed results files only, so a figure on the page
can always be traced to a run, and a hand edit or a pasted table is caught
(``tests/test_performance_page.py`` fails when the committed page differs from what this
module makes). Which results file is current for which benchmark is listed in
``benchmarks/results/summary.json``: several files share a date and a name does not say
which run superseded which, so the choice is written down rather than guessed.

Two blocks, each between its markers: the summary (per section, the ``## Ratios`` rows of
one results file whose benchmark number the section lists) and the on-demand rolling
restart of a 3-broker cluster (one row per listed run, parsed from the run's note). The
prose around the blocks is hand-written and left alone. A full ``python -m benchmarks`` run
records itself in the manifest (:func:`record_run`) and regenerates the page.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
MANIFEST = RESULTS / "summary.json"
PAGE = ROOT / "docs" / "performance.md"
SUMMARY_START, SUMMARY_END = "<!-- benchmarks:start -->", "<!-- benchmarks:end -->"
ROLLING_START, ROLLING_END = "<!-- rolling-restart:start -->", "<!-- rolling-restart:end -->"
RATIO_HEADER = (
    "| benchmark | size | eospack | baseline | ratio | target | met |",
    "| --- | --- | --- | --- | --- | --- | --- |",
)
ROLLING_HEADER = (
    "| run | offered / achieved | records | query failures | task retries | lost | doubled"
    " | left Ongoing | restart of 3 nodes | batches during it"
    " | batch p50 / p99 (addBatch p50 / p99) | caught up after the producer stopped |",
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
)
ROLLING_NOTE = re.compile(
    r"rolling restart \(issue 37 goal: (?P<offered>[\d,]+) events/s offered\): producer"
    r" achieved (?P<achieved>[\d,]+) events/s, (?P<records>[\d,]+) records; query failures"
    r" (?P<failures>\d+), task failures retried (?P<retries>\d+); lost (?P<lost>\d+), doubled"
    r" (?P<doubled>\d+); transactions left Ongoing (?P<ongoing>\d+); restart of 3 nodes"
    r" (?P<restart>[\d.]+) s; (?P<batches>\d+) batches with rows started during it: batch"
    r" \(triggerExecution\) p50 (?P<p50>[\d.]+) s, p99 (?P<p99>[\d.]+) s, max [\d.]+ s;"
    r" addBatch \(write and commit\) p50 (?P<add50>[\d.]+) s, p99 (?P<add99>[\d.]+) s;"
    r".*; caught up (?P<caught_up>[\d.]+) s after the producer stopped"
)


class ReportError(ValueError):
    """A results file or the manifest lacks what the page needs: fix the file, not the page."""


@dataclass(frozen=True)
class Section:
    """The rows of benchmarks ``numbers`` from one results file, under a one-line caption."""

    file: str
    caption: str
    numbers: tuple[str, ...]


def load_manifest(manifest: Path = MANIFEST) -> tuple[list[Section], list[str]]:
    """The summary's sections and the rolling-restart runs, in page order."""
    data = json.loads(manifest.read_text(encoding="utf-8"))
    sections = [
        Section(entry["file"], entry["caption"], tuple(entry["benchmarks"]))
        for entry in data["summary"]
    ]
    return sections, list(data["rolling_restart"])


def ratio_rows(results: Path) -> list[str]:
    """The rows of the ``## Ratios`` table of a results file, as written by the harness."""
    lines = results.read_text(encoding="utf-8").splitlines()
    try:
        start = lines.index("## Ratios")
    except ValueError:
        raise ReportError(f"{results}: no '## Ratios' section") from None
    table = [line for line in lines[start + 1 :] if line.strip()]
    rows: list[str] = []
    for line in table:
        if not line.startswith("|"):
            break
        rows.append(line)
    if tuple(rows[:2]) != RATIO_HEADER:
        raise ReportError(f"{results}: the Ratios table does not start with the harness' header")
    return rows[2:]


def benchmark_number(row: str) -> str:
    """``"9"`` for a row of ``| 9. kafka sink ... |``: the number the manifest selects by."""
    return row.strip("| ").split(".", 1)[0]


def summary_block(sections: list[Section], results: Path = RESULTS) -> str:
    parts: list[str] = []
    for section in sections:
        rows = [
            row
            for row in ratio_rows(results / section.file)
            if benchmark_number(row) in section.numbers
        ]
        if not rows:
            raise ReportError(f"{section.file}: no rows of benchmarks {list(section.numbers)}")
        path = f"benchmarks/results/{section.file}"
        parts.append(f"From `{path}` ({section.caption}):\n\n" + "\n".join([*RATIO_HEADER, *rows]))
    return "\n\n".join(parts)


def rolling_restart_block(files: list[str], results: Path = RESULTS) -> str:
    rows = list(ROLLING_HEADER)
    for index, name in enumerate(files, start=1):
        text = results.joinpath(name).read_text(encoding="utf-8")
        found = ROLLING_NOTE.search(text)
        if found is None:
            raise ReportError(f"{name}: no rolling-restart note in the harness' format")
        run = found.groupdict()
        rows.append(
            f"| {index} (`benchmarks/results/{name}`) | {run['offered']} / {run['achieved']}"
            f" events/s | {run['records']} | {run['failures']} | {run['retries']}"
            f" | {run['lost']} | {run['doubled']} | {run['ongoing']} | {run['restart']} s"
            f" | {run['batches']} | {run['p50']} s / {run['p99']} s ({run['add50']} s /"
            f" {run['add99']} s) | {run['caught_up']} s |"
        )
    return "\n".join(rows)


def replace_block(text: str, start: str, end: str, body: str) -> str:
    """``text`` with what lies between ``start`` and ``end`` replaced by ``body``."""
    if text.count(start) != 1 or text.count(end) != 1:
        raise ReportError(f"the page needs exactly one {start} and one {end}")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body}\n{end}{tail}"


def render_page(text: str, manifest: Path = MANIFEST, results: Path = RESULTS) -> str:
    """The page ``text`` with both generated blocks made anew from the results files."""
    sections, rolling = load_manifest(manifest)
    text = replace_block(text, SUMMARY_START, SUMMARY_END, summary_block(sections, results))
    return replace_block(text, ROLLING_START, ROLLING_END, rolling_restart_block(rolling, results))


def write_page(page: Path = PAGE, manifest: Path = MANIFEST, results: Path = RESULTS) -> bool:
    """Regenerate ``page`` in place; True when it changed."""
    before = page.read_text(encoding="utf-8")
    after = render_page(before, manifest, results)
    if after != before:
        page.write_text(after, encoding="utf-8")
    return after != before


def record_run(output: Path, numbers: list[str], caption: str, manifest: Path = MANIFEST) -> None:
    """Make ``output`` the current results of benchmarks ``numbers`` in the manifest.

    Earlier sections lose those numbers (a section left with none is dropped) and a new
    section for ``output`` is appended, so the page shows each benchmark's latest full run.
    """
    data = json.loads(manifest.read_text(encoding="utf-8"))
    kept = []
    for entry in data["summary"]:
        entry["benchmarks"] = [number for number in entry["benchmarks"] if number not in numbers]
        if entry["benchmarks"]:
            kept.append(entry)
    kept.append({"file": output.name, "caption": caption, "benchmarks": sorted(set(numbers))})
    data["summary"] = kept
    manifest.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__)
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the page differs, write nothing"
    )
    arguments = parser.parse_args(argv)
    current = PAGE.read_text(encoding="utf-8")
    if arguments.check:
        if render_page(current) != current:
            print(f"{PAGE.relative_to(ROOT)} differs from its results: python -m benchmarks.report")
            return 1
        return 0
    changed = write_page()
    print(f"{PAGE.relative_to(ROOT)} {'rewritten' if changed else 'already current'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
