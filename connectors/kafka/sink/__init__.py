"""2pc-kafka, the two-phase-commit sink: options, the driver's data source, the executor's
writer, the ledger and the 2PC resource. It imports nothing from ``source/``
(tests/test_layout.py checks it)."""
