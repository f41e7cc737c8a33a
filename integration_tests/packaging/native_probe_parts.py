"""A script run by an installed eospack's own Python: which native extension it loads,
how it was compiled, and one record batch decoded through it (``eospack._native``).

The batch (zstd, a null value) is written by the pure-Python reference encoder and decoded
by the extension's ``decode_records`` directly, so a wheel's extension is checked on its
own: loads on this Python (the stable ABI), finds its codecs, hands Arrow data to pyarrow.
It prints one line ``RESULT <json>``: ``file``, ``build`` ("release" or "debug"),
``selected`` (the extension is the data path eospack runs), ``values``, ``next_offset``.
Shared by ``test_fresh_install.py`` and ``test_wheel_matrix.py``.
"""

from __future__ import annotations

VALUES = [b"a" * 100, b"b", None]

NATIVE_PROBE = """
import json
import pyarrow as pa
import eospack._native as native
from eospack.connectors.kafka.records import native_path, record_batches as rb

values = [b"a" * 100, b"b", None]
rows = pa.RecordBatch.from_pydict({"value": pa.array(values, pa.binary())})
settings = rb.EncodeSettings(1, 1 << 16, 1 << 20, "zstd", 1_700_000_000_000)
(encoded,), _ = rb.encode(rows, settings, 0, native=False)
decoded = native.decode_records(bytes(encoded.data), 0, "t", 0, True, [], False)
schema, array, next_offset, _ = decoded
batch = pa.RecordBatch._import_from_c_capsule(schema, array)
print("RESULT " + json.dumps({
    "file": native.__file__,
    "build": native.build_profile(),
    "selected": native_path.NATIVE is native,
    "values": [v if v is None else v.decode() for v in batch.column("value").to_pylist()],
    "next_offset": next_offset,
}))
"""

EXPECTED_VALUES = [value if value is None else value.decode() for value in VALUES]
