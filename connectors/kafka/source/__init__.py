"""replayable-kafka, the source: options, planning, the executor's reader. It imports
nothing from ``sink/`` (tests/test_layout.py checks it)."""
