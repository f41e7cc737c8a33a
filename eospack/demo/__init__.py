"""``eospack demo``: two counters, one crashed again and again, must end equal.

See ``eospack.demo.run`` for the orchestration, ``eospack.demo.pipeline`` for the
Spark job each counter runs, and ``eospack.demo.verify`` for the verdict.
"""

from eospack.demo.run import add_demo_arguments, run_demo

__all__ = ["add_demo_arguments", "run_demo"]
