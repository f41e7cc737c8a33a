"""A Spark Connect server on this machine, started with pip's pyspark (it ships
``spark-connect_2.13-<version>.jar`` and ``bin/spark-submit``).

The server is where Spark runs: its Python planners and workers import eospack, so eospack
is installed in the interpreter it runs (``PYSPARK_PYTHON``), and Spark's automatic lookup
of ``pyspark_*`` modules finds the formats there. Clients only send plans.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pyspark

from eospack.lab.services.base import free_port, port_accepts_connections, wait_until_ready

HOST = "127.0.0.1"
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
START_SECONDS = 120.0  # a JVM with Spark: about 10 s idle, more on a busy CI machine


class SparkConnectServer:
    """``remote_url`` (``sc://host:port``) for ``SparkSession.builder.remote``; ``stop()``."""

    def __init__(self) -> None:
        spark_home = Path(pyspark.__file__).parent
        self.port = free_port()
        self.remote_url = f"sc://{HOST}:{self.port}"
        self.log_file = Path(tempfile.mkstemp(prefix="eospack-spark-connect-", suffix=".log")[1])
        environment = {
            **os.environ,
            "SPARK_HOME": str(spark_home),
            "PYSPARK_PYTHON": sys.executable,
        }
        command = [
            str(spark_home / "bin" / "spark-submit"),
            "--class",
            SERVER_CLASS,
            "--master",
            "local[2]",
            "--conf",
            f"spark.connect.grpc.binding.port={self.port}",
            "--conf",
            f"spark.connect.grpc.binding.address={HOST}",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.sql.shuffle.partitions=2",
            "spark-internal",
        ]
        with open(self.log_file, "ab") as log:
            self.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=environment,
                start_new_session=True,
            )
        try:
            wait_until_ready(
                "spark connect server",
                lambda: port_accepts_connections(HOST, self.port),
                self.process.poll,
                self.log_file,
                timeout=START_SECONDS,
            )
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """SIGKILL the server's process group (its JVM and Python workers), wait, and remove
        its log."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=30)
        self.log_file.unlink(missing_ok=True)
