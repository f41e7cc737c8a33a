"""Named fault points: places in the protocol where a test can kill the process.

Arm one by starting the driver with ``EOSPACK_FAULT_POINT=<name>`` or
``<name>@<batch id>``. When reached, the point sends SIGKILL to the process group in
``EOSPACK_FAULT_KILL_PGID`` (a number, or ``session``: the group of this process's
session leader, i.e. a driver started with ``start_new_session=True`` and its JVM: a
whole-driver crash), then to its own process (a lost Python worker). Unarmed points
cost one check of a module constant: the environment is read once, at import.
"""

from __future__ import annotations

import os
import signal

AFTER_PREPARE = "after_prepare"
"""Executor: a task has prepared its piece and not yet returned its commit message."""
BEFORE_DECISION = "before_decision"
"""Driver: every task succeeded; no decision is recorded yet."""
AFTER_DECISION = "after_decision"
"""Driver: the decision is durable; no piece is committed yet."""
BETWEEN_PIECE_COMMITS = "between_piece_commits"
"""Driver: the first piece of a multi-piece batch is committed, the others are not."""
AFTER_COMMIT = "after_commit"
"""Driver: the sink committed the batch; Spark has not yet written its commit log."""

ALL_FAULT_POINTS = (
    AFTER_PREPARE,
    BEFORE_DECISION,
    AFTER_DECISION,
    BETWEEN_PIECE_COMMITS,
    AFTER_COMMIT,
)

FAULT_POINT_VARIABLE = "EOSPACK_FAULT_POINT"
KILL_GROUP_VARIABLE = "EOSPACK_FAULT_KILL_PGID"


def _parse(armed: str | None) -> tuple[str, int | None] | None:
    if not armed:
        return None
    name, _, batch = armed.partition("@")
    if name not in ALL_FAULT_POINTS:
        raise ValueError(
            f"{FAULT_POINT_VARIABLE}={armed!r} names no fault point: use one of "
            + ", ".join(ALL_FAULT_POINTS)
        )
    return name, int(batch) if batch else None


_ARMED = _parse(os.environ.get(FAULT_POINT_VARIABLE))


def is_armed(name: str, batch_id: int) -> bool:
    """Whether ``fault_point(name, batch_id)`` would kill the process (a caller that would
    otherwise skip past the point, such as concurrent piece commits, keeps it reachable)."""
    if _ARMED is None:
        return False
    armed_name, armed_batch = _ARMED
    return armed_name == name and (armed_batch is None or armed_batch == batch_id)


def fault_point(name: str, batch_id: int) -> None:
    """Kill the driver here if ``name`` (and ``batch_id``, when given) is armed."""
    if _ARMED is None:
        return
    armed_name, armed_batch = _ARMED
    if armed_name != name or (armed_batch is not None and armed_batch != batch_id):
        return
    group = os.environ.get(KILL_GROUP_VARIABLE)
    if group:
        try:
            os.killpg(os.getsid(0) if group == "session" else int(group), signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.kill(os.getpid(), signal.SIGKILL)
