"""Fakes of the state handles the segment log (``segment_log_state.handle_rows``) and the
key-groups layout (``StatefulOperator._call``) call, for unit tests that drive both layouts
side by side without Spark."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

from eospack.stateful_ops import segment_log_state
from eospack.stateful_ops.base import MARKER_COLUMN, SETTINGS_KEY_GROUP, Clock

LAYOUT = segment_log_state.Layout(SETTINGS_KEY_GROUP, Clock, MARKER_COLUMN)


class ListState:
    """TWS ListState's calls as ``handle_rows`` makes them."""

    def __init__(self) -> None:
        self.items: list[tuple[bytes]] | None = None

    def exists(self) -> bool:
        return self.items is not None

    def get(self) -> Iterator[tuple[bytes]]:
        return iter(list(self.items or []))

    def appendValue(self, value: tuple[bytes]) -> None:
        self.items = [*(self.items or []), value]

    def put(self, values: list[tuple[bytes]]) -> None:
        self.items = list(values)

    def clear(self) -> None:
        self.items = None


class Timers:
    def __init__(self) -> None:
        self.registered: list[int] = []

    def listTimers(self) -> Iterator[int]:
        return iter(list(self.registered))

    def deleteTimer(self, at_ms: int) -> None:
        self.registered.remove(at_ms)

    def registerTimer(self, at_ms: int) -> None:
        self.registered.append(at_ms)


def new_handle() -> Any:
    return SimpleNamespace(log=ListState(), timers=Timers(), settings=None)


class EventTimeGroupState:
    """GroupState with EventTimeTimeout, as the key-groups layout's ``_call`` uses it."""

    def __init__(self) -> None:
        self.row: tuple[Any, ...] | None = None
        self.timeout_ms: int | None = None
        self.hasTimedOut = False
        self.watermark_ms = 0

    @property
    def exists(self) -> bool:
        return self.row is not None

    @property
    def get(self) -> tuple[Any, ...]:
        assert self.row is not None
        return self.row

    def update(self, row: tuple[Any, ...]) -> None:
        self.row = row

    def remove(self) -> None:
        self.row = None

    def setTimeoutTimestamp(self, at_ms: int) -> None:
        assert at_ms >= self.watermark_ms, "Spark refuses a timeout behind the watermark"
        self.timeout_ms = at_ms

    def getCurrentWatermarkMs(self) -> int:
        return self.watermark_ms

    def getCurrentProcessingTimeMs(self) -> int:
        return 1_000
