"""The contract suite's driver: one sink's contract query in a process of its own.

Killed at a fault point (``EOSPACK_FAULT_POINT``) or run to its end (exit 0); call faults
come through ``EOSPACK_FAULT_DIR`` in the environment. ``--master local[2,3]`` lets Spark
retry a failed task (``local[N]`` never does). The query is the one the tests run in their
own session (``sink_contract.inputs.start_query``), so a restart there continues this one.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from eospack.lab.testing import await_query
from eospack.tools.spark import local_session
from integration_tests.sink_contract.adapters import ADAPTERS, PRODUCTION_ADAPTERS
from integration_tests.sink_contract.inputs import start_query


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    adapters = {**ADAPTERS, **PRODUCTION_ADAPTERS}
    parser.add_argument("--sink", required=True, choices=sorted(adapters))
    parser.add_argument("--source", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--options", required=True, help="the sink's options as JSON")
    parser.add_argument("--master", default="local[2]")
    arguments = parser.parse_args()

    adapter = adapters[arguments.sink]
    spark = local_session(app_name=f"eospack-contract-{adapter.name}", master=arguments.master)
    query = start_query(
        spark,
        adapter.sink_format,
        arguments.source,
        arguments.checkpoint,
        json.loads(arguments.options),
        adapter.as_kafka_records,
    )
    await_query(query, timeout=180)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
