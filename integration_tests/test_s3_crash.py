"""Kept only for the imports of ``test_s3_faults.py`` (``Bucket``, ``named_upload_ids``,
``write_source``), which now live in the non-test package ``sink_contract``; delete this
module once that import moves (issue 29: test modules import no test module).

2pc-s3's driver SIGKILLed at every crash point, and every other case a sink must pass,
are the contract suite's (``test_sink_contract.py``, adapter ``s3``).
"""

from integration_tests.sink_contract.adapters import Bucket, named_upload_ids
from integration_tests.sink_contract.inputs import write_source

__all__ = ["Bucket", "named_upload_ids", "write_source"]
