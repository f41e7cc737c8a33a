"""The sink contract: what every two-phase-commit sink must survive, written once.

Non-test modules (test modules import no test module, issue 29), used by
``test_sink_contract.py`` and by the sink tests that are not about the crash protocol
(``test_jdbc_crash.py``, ``test_kafka_sink.py``) for their end-state checks:

- ``inputs``: the parquet input (one file per batch) and the one query every sink runs;
- ``adapters``: one adapter per sink (2pc-jdbc prepared and staging on PostgreSQL,
  2pc-jdbc on SQLite, 2pc-s3, 2pc-kafka): options, output rows, leftovers, decisions,
  resource call names, documented options, option changes, what does not apply and why;
- ``harness``: ``ContractRun``, one checkpoint run again and again (in the test's session,
  or SIGKILLed in ``drivers/contract_driver.py``), and the contract's end-state check.

Adding a sink means adding its adapter to ``adapters.ADAPTERS``; 2pc-kafka on a 3-node
cluster and on a SASL_SSL broker are ``adapters.PRODUCTION_ADAPTERS``
(``test_sink_contract_production_kafka.py``, marker ``production_kafka``).
"""
