"""``eospack demo``: two counters, one crashed again and again, must end equal.

See ``eospack.lab.demo.run`` for the orchestration, ``eospack.lab.demo.pipeline`` for the
Spark job each counter runs, and ``eospack.lab.demo.verify`` for the verdict.
"""

from eospack.lab.demo.run import add_demo_arguments, run_demo

__all__ = ["add_demo_arguments", "run_demo"]
