"""``create_savepoint`` killed (SIGKILL) between its state files and its manifest.

Runs in a process of its own: it creates a savepoint of ``--checkpoint`` at
``--destination`` (a local path or ``s3a://`` URI) and, once every operator's Parquet is
written and before the manifest is, prints ``STATE WRITTEN`` and kills itself with SIGKILL
(no ``finally``, no ``atexit``: what a crash or ``kill -9`` leaves). For ``s3a://`` the
endpoint comes from ``EOSPACK_KILL_S3_ENDPOINT``, ``EOSPACK_KILL_S3_REGION``,
``EOSPACK_KILL_S3_ACCESS_KEY`` and ``EOSPACK_KILL_S3_SECRET_KEY`` (never printed) and S3A's
jars from ``--class-path``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from eospack.tools import savepoint
from eospack.tools.spark import local_session
from integration_tests.s3.object_store_parts import configure_session


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--destination", required=True)
    parser.add_argument("--class-path", default="")
    arguments = parser.parse_args()
    conf = {"spark.driver.extraClassPath": arguments.class_path} if arguments.class_path else None
    spark = local_session("eospack-savepoint-kill", conf=conf)
    if os.environ.get("EOSPACK_KILL_S3_ENDPOINT"):
        endpoint = SimpleNamespace(
            endpoint_url=os.environ["EOSPACK_KILL_S3_ENDPOINT"],
            region=os.environ["EOSPACK_KILL_S3_REGION"],
            access_key_id=os.environ["EOSPACK_KILL_S3_ACCESS_KEY"],
            secret_access_key=os.environ["EOSPACK_KILL_S3_SECRET_KEY"],
        )
        configure_session(spark, endpoint)

    def killed(self: savepoint.Manifest) -> str:
        print("STATE WRITTEN", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("not reached")

    savepoint.Manifest.to_json = killed  # type: ignore[method-assign]
    savepoint.create_savepoint(spark, arguments.checkpoint, arguments.destination)
    print("NOT KILLED", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
