"""Injected call faults: a resource call that fails before it applies, after it applied (its
answer lost), or stalls past its timeout; the fault rig of the crash and stress tests.

Off in production: unless the process was started with ``EOSPACK_FAULT_DIR`` set,
``claim`` returns None after one check of a module constant. With it set (a test sets it for
a child driver; Spark's Python workers inherit it), every armed fault is one JSON file in
that directory, written by ``arm``. The first matching call in any process of the
application claims the file by renaming it (atomic), so a fault fires exactly once, in
whichever executor or driver process makes the call first, and is logged as one JSON line in
``injected.log`` for the test's counts.

Calls are named ``<resource>.<call>``, e.g. ``postgres.commit_piece``, ``postgres.decide``,
``s3.PutObject``, ``s3.CompleteMultipartUpload``, ``kafka.poll``. Each resource turns a
claimed fault into its own client's error (``run_call``): the caller sees exactly what a
dropped connection or a timeout looks like.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, TypeVar

FAULT_DIRECTORY_VARIABLE = "EOSPACK_FAULT_DIR"
INJECTED_LOG = "injected.log"

Mode = Literal["before", "after", "stall", "crash", "kill-executor", "slow"]
MODES: tuple[Mode, ...] = ("before", "after", "stall", "crash", "kill-executor", "slow")
EXECUTOR_MAIN_CLASS = "CoarseGrainedExecutorBackend"

Result = TypeVar("Result")


@dataclass(frozen=True)
class CallFault:
    """One armed fault: which call, how it fails, and optionally in which batch only."""

    call: str
    mode: Mode
    batch_id: int | None = None
    stall_seconds: float = 0.0

    def describe(self) -> str:
        batch = f" in batch {self.batch_id}" if self.batch_id is not None else ""
        return f"injected fault: {self.call} {self.mode}{batch}"


_DIRECTORY = os.environ.get(FAULT_DIRECTORY_VARIABLE) or None


def enabled() -> bool:
    return _DIRECTORY is not None


def is_armed(call: str) -> bool:
    """Whether a fault for ``call`` waits to be claimed (in any batch), without claiming it:
    for code that takes another path only while a test arms that call."""
    if _DIRECTORY is None:
        return False
    try:
        entries = list(os.scandir(_DIRECTORY))
    except FileNotFoundError:
        return False
    for entry in entries:
        if not entry.name.endswith(".fault"):
            continue
        try:
            if json.loads(Path(entry.path).read_text()).get("call") == call:
                return True
        except (OSError, ValueError, AttributeError):
            continue
    return False


def claim(call: str, batch_id: int | None = None) -> CallFault | None:
    """The armed fault for ``call`` (and ``batch_id``) if this process wins it, else None."""
    if _DIRECTORY is None:
        return None
    directory = Path(_DIRECTORY)
    try:
        entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
    except FileNotFoundError:
        return None
    for entry in entries:
        if not entry.name.endswith(".fault"):
            continue
        try:
            fault = CallFault(**json.loads(Path(entry.path).read_text()))
        except (OSError, ValueError, TypeError):
            continue
        if fault.call != call or (fault.batch_id is not None and fault.batch_id != batch_id):
            continue
        claimed = f"{entry.path}.{os.getpid()}.claimed"
        try:
            os.rename(entry.path, claimed)
        except OSError:
            continue  # another process claimed it first
        with open(directory / INJECTED_LOG, "a", encoding="utf-8") as log:
            record = {**asdict(fault), "pid": os.getpid(), "seen_batch": batch_id}
            log.write(json.dumps(record) + "\n")
        return fault
    return None


def run_call(
    call: str,
    action: Callable[[], Result],
    *,
    error: Callable[[str], BaseException],
    lose_connection: Callable[[], None] = lambda: None,
    batch_id: int | None = None,
) -> Result:
    """Run ``action`` as the named call, through any armed fault.

    ``before``: the connection is lost and ``error`` raised, nothing applied. ``after``:
    the action applies, then the connection is lost and ``error`` raised (the answer is
    lost). ``stall``: the call hangs ``stall_seconds``, then fails like ``before`` (a client
    timeout). ``crash``: the action applies, then this process is SIGKILLed (a Python
    worker, or the driver, dying right after the call). Two modes for a cluster's
    executors: ``kill-executor``: the action applies, then the executor JVM that runs this
    Python worker is SIGKILLed, and the worker with it (a lost executor); ``slow``: the
    call waits ``stall_seconds`` and then applies normally (a straggler, for speculation).
    """
    fault = claim(call, batch_id)
    if fault is None:
        return action()
    if fault.mode == "slow":
        time.sleep(fault.stall_seconds)
        return action()
    if fault.mode in ("after", "crash", "kill-executor"):
        action()
        if fault.mode == "kill-executor":
            kill_executor()
        if fault.mode in ("crash", "kill-executor"):
            os.kill(os.getpid(), signal.SIGKILL)
    elif fault.mode == "stall":
        time.sleep(fault.stall_seconds)
    lose_connection()
    raise error(fault.describe())


def kill_executor() -> None:
    """SIGKILL the executor JVM among this process's ancestors; refuse in any other process
    (in ``local[N]`` the nearest JVM is the driver, which a test kills by fault points)."""
    pid = os.getppid()
    while pid > 1:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            status = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        if EXECUTOR_MAIN_CLASS.encode() in command:
            os.kill(pid, signal.SIGKILL)
            return
        pid = int(status.rsplit(")", 1)[1].split()[1])
    raise RuntimeError(f"kill-executor fault: no {EXECUTOR_MAIN_CLASS} among the ancestors")


def arm(
    directory: Path,
    call: str,
    mode: Mode,
    batch_id: int | None = None,
    stall_seconds: float = 0.0,
    times: int = 1,
) -> list[Path]:
    """Test side: arm ``times`` faults of one kind; each fires once."""
    if mode not in MODES:
        raise ValueError(f"fault mode {mode!r}: use one of {', '.join(MODES)}")
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for _ in range(times):
        path = directory / f"{time.time_ns()}-{uuid.uuid4().hex[:6]}.fault"
        temporary = path.with_suffix(".writing")
        temporary.write_text(json.dumps(asdict(CallFault(call, mode, batch_id, stall_seconds))))
        os.rename(temporary, path)
        paths.append(path)
    return paths


def injected(directory: Path) -> list[dict[str, object]]:
    """Test side: the faults that fired, in order."""
    log = directory / INJECTED_LOG
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def pending(directory: Path) -> list[CallFault]:
    """Test side: armed faults that no call has claimed yet."""
    return [CallFault(**json.loads(path.read_text())) for path in sorted(directory.glob("*.fault"))]
