"""``eospack.tools.formats``: the one registry of formats, and everything that must agree with it.

A format forgotten in one list used to fail only when a user met that list (``register``
missing a format, ``doctor`` not checking its module, a page that says "three formats").
These tests hold the registry against the code that reads it, the ``pyspark_*`` modules
Spark looks up, ``pyproject.toml``, ``mkdocs.yml`` and every list of formats in the manual.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

import eospack
from eospack.tools import checkpoint, doctor
from eospack.tools.formats import FORMATS, FormatEntry, UnknownFormatError, entry_of, sinks

ROOT = Path(__file__).resolve().parent.parent
SINK_NAMES = {entry.name for entry in sinks()}

# The fewest options each format accepts, for checking its parser (a new format adds one).
MINIMAL_OPTIONS = {
    "replayable-kafka": {"kafka.bootstrap.servers": "broker:9092", "subscribe": "events"},
    "2pc-jdbc": {"url": "jdbc:sqlite:/nonexistent/sink.db", "dbtable": "orders"},
    "2pc-s3": {"path": "s3://bucket/prefix"},
    "2pc-kafka": {"kafka.bootstrap.servers": "broker:9092", "topic": "events"},
}

# Lists that name a subset on purpose: the set of formats and why.
DELIBERATE_SUBSETS = {
    frozenset({"replayable-kafka", "2pc-kafka"}): "the two formats that talk to Kafka",
}


def entries() -> list[FormatEntry]:
    return list(FORMATS.values())


def test_the_registry_names_four_formats_one_source_and_three_sinks() -> None:
    assert list(FORMATS) == ["replayable-kafka", "2pc-jdbc", "2pc-s3", "2pc-kafka"]
    assert [entry.role for entry in entries()] == ["source", "sink", "sink", "sink"]
    assert all(name == entry.name for name, entry in FORMATS.items())


@pytest.mark.parametrize("entry", entries(), ids=lambda entry: entry.name)
def test_each_entry_resolves_to_its_data_source_options_and_parser(entry: FormatEntry) -> None:
    source = entry.data_source.load()
    assert source.name() == entry.name
    options_class = entry.options_class.load()
    assert options_class.__dataclass_params__.frozen  # a frozen dataclass
    assert isinstance(entry.parse(MINIMAL_OPTIONS[entry.name]), options_class)
    assert (ROOT / entry.docs_page).is_file()
    for error in entry.public_errors:
        assert error.name in eospack.__all__
        assert getattr(eospack, error.name) is error.load()


def test_every_format_has_minimal_options_here() -> None:
    assert set(MINIMAL_OPTIONS) == set(FORMATS)


@pytest.mark.parametrize("entry", entries(), ids=lambda entry: entry.name)
def test_each_format_has_its_lookup_module_with_the_registrys_data_source(
    entry: FormatEntry,
) -> None:
    """Spark's lookup lists top-level ``pyspark_*`` files: each must exist, be packaged, and
    expose the registry's class as ``DefaultSource``."""
    assert (ROOT / f"{entry.lookup_module}.py").is_file()
    module = __import__(entry.lookup_module)
    assert module.DefaultSource is entry.data_source.load()


def test_pyproject_packages_exactly_the_registrys_lookup_modules() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    packaged = pyproject["tool"]["setuptools"]["py-modules"]
    assert sorted(packaged) == sorted(entry.lookup_module for entry in entries())
    assert sorted(path.stem for path in ROOT.glob("pyspark_*.py")) == sorted(packaged)


def test_sinks_and_only_sinks_have_an_inspector_that_checkpoint_inspect_uses() -> None:
    for entry in entries():
        assert (entry.sink_inspector is not None) == (entry.role == "sink"), entry.name
        if entry.sink_inspector is not None:
            assert callable(entry.sink_inspector.load())
    assert set(checkpoint.SINK_INSPECTORS) == SINK_NAMES


def test_doctor_checks_every_formats_lookup_module() -> None:
    assert {entry.lookup_module: entry.name for entry in entries()} == doctor.FORMAT_MODULES


def test_an_unknown_format_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(UnknownFormatError) as raised:
        entry_of("2pc-jbdc")
    assert str(raised.value) == (
        "format '2pc-jbdc' is not known here: use one of replayable-kafka, 2pc-jdbc, 2pc-s3,"
        " 2pc-kafka"
    )
    with pytest.raises(UnknownFormatError, match="use one of 2pc-jdbc, 2pc-s3, 2pc-kafka$"):
        entry_of("replayable-kafka", sinks())


def test_a_bad_option_raises_the_connectors_own_error_naming_it() -> None:
    with pytest.raises(eospack.JdbcSinkOptionError) as raised:
        FORMATS["2pc-jdbc"].parse({**MINIMAL_OPTIONS["2pc-jdbc"], "batchsize": "zero"})
    assert str(raised.value).startswith("Option batchsize is 'zero': use ")


def test_importing_the_registry_loads_no_connector_pyspark_or_client() -> None:
    code = (
        "import sys, eospack.tools.formats\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('pandas', 'pyarrow', 'pyspark',"
        " 'kafka', 'psycopg', 'boto3') or m.startswith('eospack.connectors')]\n"
        "print(heavy)\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert completed.stdout.strip() == "[]"


# The manual: every list of formats names them all.

NAME = r"`?(?:replayable-kafka|2pc-jdbc|2pc-s3|2pc-kafka)`?"
QUALIFIER = r"(?:\s*\([^)]*\)|\s+(?!and\b|or\b)[a-z]+(?:(?:,\s*|\s+and\s+)[A-Za-z]+)*)?"
SEPARATOR = r"(?:\s*,\s*(?:and\s+|or\s+)?|\s+(?:and|or)\s+|\s*/\s*)"
FORMAT_LIST = re.compile(rf"{NAME}{QUALIFIER}(?:{SEPARATOR}{NAME}{QUALIFIER})+")
FORMAT_NAME = re.compile(r"(?<![\w-])(replayable-kafka|2pc-jdbc|2pc-s3|2pc-kafka)(?![\w-])")
COUNT_WORDS = {"two": 2, "three": 3, "four": 4, "five": 5, "both": 2}
COUNTED = re.compile(
    r"\b(two|three|four|five|both)\s+(?:of\s+the\s+)?((?:2pc|two-phase[- ]commit)\s+)?"
    r"(formats|sinks)\b",
    flags=re.IGNORECASE,
)


def manual_texts() -> dict[str, str]:
    """README.md, docs/, CONTRIBUTING.md, the connectors' READMEs and the ``connectors``
    package docstring, each with its whitespace folded (lists wrap across lines)."""
    pages = [
        ROOT / "README.md",
        ROOT / "CONTRIBUTING.md",
        *sorted((ROOT / "docs").rglob("*.md")),
        *sorted(ROOT.glob("connectors/*/README.md")),
    ]
    texts = {str(page.relative_to(ROOT)): page.read_text(encoding="utf-8") for page in pages}
    package = ROOT / "connectors" / "__init__.py"
    texts["connectors/__init__.py"] = package.read_text(encoding="utf-8")
    return {name: re.sub(r"\s+", " ", text) for name, text in texts.items()}


def incomplete_lists(text: str) -> list[str]:
    """Each list of two or more formats in ``text`` that names neither every format nor
    every sink (nor a deliberate subset)."""
    wrong = []
    for match in FORMAT_LIST.finditer(text):
        named = frozenset(FORMAT_NAME.findall(re.sub(r"\([^)]*\)", "", match.group(0))))
        if len(named) < 2 or named >= SINK_NAMES or named in DELIBERATE_SUBSETS:
            continue
        wrong.append(match.group(0))
    return wrong


def miscounted(text: str) -> list[str]:
    """Each "<number> formats" / "<number> (2PC) sinks" whose number is not the registry's."""
    wrong = []
    for match in COUNTED.finditer(text):
        expected = len(FORMATS) if match.group(3).lower() == "formats" else len(SINK_NAMES)
        if COUNT_WORDS[match.group(1).lower()] != expected or match.group(1).lower() == "both":
            wrong.append(match.group(0))
    return wrong


def test_every_list_of_formats_in_the_manual_names_every_format_or_every_sink() -> None:
    wrong = {
        name: found for name, text in manual_texts().items() if (found := incomplete_lists(text))
    }
    assert wrong == {}


def test_every_count_of_formats_or_sinks_in_the_manual_is_the_registrys() -> None:
    wrong = {name: found for name, text in manual_texts().items() if (found := miscounted(text))}
    assert wrong == {}


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("fails (or `2pc-jdbc`, `2pc-s3`) in your session", ["`2pc-jdbc`, `2pc-s3`"]),
        (
            "Sources and sinks: replayable-kafka, 2pc-jdbc and 2pc-s3.",
            ["replayable-kafka, 2pc-jdbc and 2pc-s3"],
        ),
        ("2pc-jdbc prepared, staging and SQLite, 2pc-s3, 2pc-kafka", []),
        ("every 2PC sink (`2pc-jdbc`, `2pc-s3`, `2pc-kafka`)", []),
        ("replayable-kafka and 2pc-kafka talk to Kafka", []),
        ("replayable-kafka -> running_count -> 2pc-jdbc", []),
    ],
)
def test_the_list_finder_finds_a_list_that_forgets_a_format(text: str, found: list[str]) -> None:
    assert incomplete_lists(text) == found


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("registers the three formats and", ["three formats"]),
        ("both 2PC sinks roll back", ["both 2PC sinks"]),
        ("closes the gap with four formats", []),
        ("call faults of the three sinks", []),
    ],
)
def test_the_count_finder_finds_a_wrong_number(text: str, found: list[str]) -> None:
    assert miscounted(text) == found


def test_the_formats_tables_and_the_site_nav_have_every_formats_page() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    index = (ROOT / "docs" / "connectors" / "index.md").read_text(encoding="utf-8")
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8").split("\nnav:", 1)[1]
    for entry in entries():
        page = entry.docs_page.removeprefix("docs/")
        assert f"| `{entry.name}` |" in readme and f"]({entry.docs_page})" in readme, entry.name
        assert f"| `{entry.name}` |" in index, entry.name
        assert re.search(rf"^\s+- [^\n]*: {re.escape(page)}$", nav, flags=re.MULTILINE), page
