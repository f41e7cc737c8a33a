"""A Spark standalone cluster on this machine: a Master and two Workers, started with the
``bin/spark-class`` that pip's pyspark ships.

Why not only ``local-cluster``: its executors all report one host, and Spark never runs a
speculative copy of a task on a host where an attempt of it already runs, so speculation
cannot happen there. Here each Worker binds its own loopback address (127.0.0.2,
127.0.0.3), so its executor is another host to the scheduler, as on a real cluster.
Executors run this interpreter (``PYSPARK_PYTHON``), with eospack installed: the "installed
on every node" way of shipping it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import pyspark

from eospack.lab.services.base import free_port, wait_until_ready

WORKER_HOSTS = ("127.0.0.2", "127.0.0.3")
MASTER_HOST = "127.0.0.1"


class StandaloneCluster:
    """``master_url`` to connect drivers; ``stop()`` ends every process of the cluster."""

    def __init__(self) -> None:
        self.spark_home = Path(pyspark.__file__).parent
        self.directory = Path(tempfile.mkdtemp(prefix="eospack-spark-cluster-"))
        self.port, self.ui_port = free_port(), free_port()
        self.master_url = f"spark://{MASTER_HOST}:{self.port}"
        self.processes: list[subprocess.Popen[bytes]] = []
        try:
            self._start(
                "master",
                "org.apache.spark.deploy.master.Master",
                "--host",
                MASTER_HOST,
                "--port",
                str(self.port),
                "--webui-port",
                str(self.ui_port),
            )
            for index, host in enumerate(WORKER_HOSTS):
                self._start(
                    f"worker-{index}",
                    "org.apache.spark.deploy.worker.Worker",
                    "--host",
                    host,
                    "--cores",
                    "1",
                    "--memory",
                    "1g",
                    "--webui-port",
                    "0",
                    "--work-dir",
                    str(self.directory / f"work-{index}"),
                    self.master_url,
                )
            wait_until_ready(
                "spark standalone cluster",
                lambda: self.alive_workers() == len(WORKER_HOSTS),
                self._exit_code,
                self.directory / "master.log",
            )
        except BaseException:
            self.stop()
            raise

    def _start(self, name: str, main_class: str, *arguments: str) -> None:
        environment = {
            **os.environ,
            "SPARK_HOME": str(self.spark_home),
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_LOG_DIR": str(self.directory),
        }
        with open(self.directory / f"{name}.log", "ab") as log:
            self.processes.append(
                subprocess.Popen(
                    [str(self.spark_home / "bin" / "spark-class"), main_class, *arguments],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=environment,
                    start_new_session=True,
                )
            )

    def _exit_code(self) -> int | None:
        codes = [process.poll() for process in self.processes]
        return next((code for code in codes if code is not None), None)

    def alive_workers(self) -> int:
        status = f"http://{MASTER_HOST}:{self.ui_port}/json/"
        try:
            with urllib.request.urlopen(status, timeout=2) as answer:
                return int(json.load(answer).get("aliveworkers", 0))
        except (OSError, ValueError):
            return 0

    def executor_logs(self) -> str:
        """What the executors of every application so far wrote to stderr (eospack's task
        side logs: a task rolling back another attempt's leftover piece, for example)."""
        logs = sorted(self.directory.glob("work-*/*/*/stderr"))
        return "".join(path.read_text(errors="replace") for path in logs)

    def stop(self) -> None:
        """SIGKILL each process group (a Worker's executors are in its group) and wait."""
        for process in self.processes:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for process in self.processes:
            process.wait(timeout=30)
