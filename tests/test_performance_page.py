"""docs/performance.md's tables are made from the committed results files only.

The page once carried raw per-repetition rows pasted under the summary's headers; a figure
that no results file holds cannot be traced to a run. ``python -m benchmarks.report``
regenerates the blocks between the page's markers, so the committed page must be exactly
what it makes from ``benchmarks/results/`` and ``benchmarks/results/summary.json``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import report

ROOT = Path(__file__).resolve().parent.parent


def test_committed_page_is_what_the_generator_makes() -> None:
    page = report.PAGE.read_text(encoding="utf-8")
    assert report.render_page(page) == page, (
        "docs/performance.md differs from its results files: run `python -m benchmarks.report`"
        " (edit the prose outside the markers, and the results or summary.json, not the tables)"
    )


def test_every_table_row_has_its_header_width() -> None:
    """A row pasted under another table's header renders in the wrong columns."""
    lines = report.PAGE.read_text(encoding="utf-8").splitlines()
    header_cells = 0
    for number, line in enumerate(lines, start=1):
        if not line.startswith("|"):
            header_cells = 0
            continue
        cells = line.count("|") - 1
        if header_cells == 0:
            header_cells = cells
        assert cells == header_cells, (
            f"docs/performance.md:{number}: {cells} cells, not {header_cells}"
        )


def test_every_section_names_a_committed_results_file() -> None:
    sections, rolling = report.load_manifest()
    for name in [*(section.file for section in sections), *rolling]:
        assert (report.RESULTS / name).is_file(), name
    numbers = [number for section in sections for number in section.numbers]
    assert len(numbers) == len(set(numbers)), "a benchmark is current in two results files"


def test_a_hand_edited_table_is_caught() -> None:
    page = report.PAGE.read_text(encoding="utf-8")
    edited = page.replace("| 9. kafka sink", "| 9. kafka sink (edited)", 1)
    assert edited != page
    assert report.render_page(edited) == page


def test_record_run_makes_a_run_current_for_its_benchmarks(tmp_path: Path) -> None:
    manifest = tmp_path / "summary.json"
    manifest.write_text(report.MANIFEST.read_text(encoding="utf-8"), encoding="utf-8")
    report.record_run(tmp_path / "2099-01-01.md", ["9"], "`python -m benchmarks`", manifest)
    sections, _ = report.load_manifest(manifest)
    owners = [section.file for section in sections if "9" in section.numbers]
    assert owners == ["2099-01-01.md"]


def test_a_results_file_without_ratios_is_refused(tmp_path: Path) -> None:
    (tmp_path / "broken.md").write_text("# no tables\n", encoding="utf-8")
    with pytest.raises(report.ReportError):
        report.ratio_rows(tmp_path / "broken.md")
