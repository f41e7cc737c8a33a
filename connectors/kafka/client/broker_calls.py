"""Calls to the broker through the call-fault rig (``eospack.core.faults``).

Names: ``kafka.metadata``, ``kafka.end_offsets``, ``kafka.beginning_offsets`` and
``kafka.offsets_for_times`` (driver planning), ``kafka.poll`` (executor reads). An armed
fault becomes kafka-python's own error, so the source handles it exactly as a real one:
KafkaConnectionError for a call that fails before or after it applied, KafkaTimeoutError
for a stall. With faults off (no ``EOSPACK_FAULT_DIR``) a call costs one module-constant
check (and a cached import) more than calling kafka-python directly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from kafka.errors import KafkaError

Result = TypeVar("Result")


def broker_call(call: str, action: Callable[[], Result]) -> Result:
    """Run ``action`` as the broker call ``call``, through any armed fault."""
    # Imported where a call is made: the package of ``faults`` loads the commit protocols
    # (pyarrow among them), which a Spark planner process that never calls Kafka skips.
    from eospack.core import faults

    if not faults.enabled():
        return action()
    return faults.run_call(call, action, error=_injected_error)


def _injected_error(description: str) -> KafkaError:
    from kafka.errors import KafkaConnectionError, KafkaTimeoutError

    # CallFault.describe() reads "injected fault: <call> <mode>[ in batch <n>]".
    mode = description.removeprefix("injected fault: ").split(" ")[1]
    if mode == "stall":
        return KafkaTimeoutError(description)
    return KafkaConnectionError(description)
