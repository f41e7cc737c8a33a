"""Attacks on ``eospack savepoint create --stop`` (issue 41), pure logic: the requester
(``request_stop_with_savepoint``) and ``StopRequestListener`` talk through files in a local
checkpoint; the query, Spark's stop (``stop_after_batch``) and the savepoint are fakes.

The property: the requester's outcome matches the query's. It either reports that nothing
stopped, and the query was not made to stop, or the query stopped and the savepoint is
written. FIXED: a listener seeing the request late stopped the query up to a second past
the deadline (``max(1.0, remaining)``), and a query made to stop just before the deadline
ended after the requester's last check: both times the requester said "no query stopped"
and the query then stopped without a savepoint (under ``supervise``, for good). FIXED too:
a second request while one waits overwrote it. And restores killed midway, on a local
disk and on a model of an object store: the next start must refuse them, never restore
a manifest over part of the state or begin afresh without a word.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from eospack.lab.testing import wait_until
from eospack.tools import savepoint as savepoint_module
from eospack.tools import stop_with_savepoint as stopping
from eospack.tools.stop_with_savepoint import (
    STOP_REQUEST,
    StopRequestListener,
    StopWithSavepointError,
    request_stop_with_savepoint,
)

QUERY_ID, RUN_ID = "query-1", "run-1"
TIMEOUT = 2.0
WAIT_SECONDS = 30.0


class Scene:
    """A checkpoint, a fake query in a fake session, the listener, and what happened."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.checkpoint = tmp_path / "checkpoint"
        self.checkpoint.mkdir()
        (self.checkpoint / "metadata").write_text(json.dumps({"id": QUERY_ID}) + "\n")
        self.destination = tmp_path / "savepoint"
        self.query = SimpleNamespace(id=QUERY_ID, runId=RUN_ID, name="q")
        session = SimpleNamespace(streams=SimpleNamespace(get=lambda _: self.query))
        self.listener = StopRequestListener(session)  # type: ignore[arg-type]
        self.marked: list[float] = []  # when the query was made to stop (time.time())
        self.savepoints: list[str] = []
        self.outcome: dict[str, Any] = {}
        monkeypatch.setattr(stopping, "checkpoint_of", lambda query: str(self.checkpoint))
        monkeypatch.setattr(stopping, "require_committed_boundary", lambda files: 7)
        monkeypatch.setattr(stopping, "create_savepoint", self.create_savepoint)

    def create_savepoint(self, spark: Any, checkpoint: Any, destination: Any) -> Any:
        self.savepoints.append(str(destination))
        return SimpleNamespace(batch_id=7)

    def request(self) -> threading.Thread:
        """``eospack savepoint create --stop --timeout TIMEOUT`` in a thread."""

        def requester() -> None:
            try:
                self.outcome["manifest"] = request_stop_with_savepoint(
                    None,  # type: ignore[arg-type]  # local paths need no session
                    self.checkpoint,
                    self.destination,
                    timeout=TIMEOUT,
                    poll_seconds=0.02,
                )
            except StopWithSavepointError as error:
                self.outcome["error"] = str(error)

        thread = threading.Thread(target=requester, daemon=True)
        thread.start()
        wait_until(lambda: (self.checkpoint / STOP_REQUEST).exists(), WAIT_SECONDS, "the request")
        return thread

    def deadline(self) -> float:
        request = json.loads((self.checkpoint / STOP_REQUEST).read_text())
        return float(request["deadline"])

    def query_ends(self) -> None:
        """Spark's QueryTerminatedEvent of a query that ended normally."""
        self.listener.onQueryTerminated(SimpleNamespace(id=QUERY_ID, runId=RUN_ID, exception=None))

    def assert_outcomes_agree(self) -> None:
        if self.marked:
            assert self.outcome.get("manifest") is not None, self.outcome
            assert self.savepoints == [str(self.destination)]
        else:
            assert "no query on" in self.outcome.get("error", ""), self.outcome
            assert self.savepoints == []
        assert sorted(p.name for p in self.checkpoint.iterdir()) == ["metadata"]


def test_fixed_a_listener_that_sees_the_request_late_never_stops_the_query_unseen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The query's batch ends 0.3 s before the deadline and its progress event reaches the
    listener then; the query's next batch ends 0.3 s after the deadline (a stop in it is
    possible as long as ``stop_after_batch`` was given time)."""
    scene = Scene(tmp_path, monkeypatch)

    def stop_after_batch(query: Any, timeout: float) -> None:
        called = time.time()
        batch_ends = deadline + 0.3
        if batch_ends > called + timeout:
            raise StopWithSavepointError("no batch boundary within the timeout")
        wait_until(lambda: time.time() >= batch_ends, WAIT_SECONDS, "the batch's end")
        scene.marked.append(time.time())

    monkeypatch.setattr(stopping, "stop_after_batch", stop_after_batch)
    requester = scene.request()
    deadline = scene.deadline()
    wait_until(lambda: time.time() >= deadline - 0.3, WAIT_SECONDS, "0.3 s before the deadline")
    scene.listener.onQueryProgress(SimpleNamespace(progress=scene.query))
    requester.join(WAIT_SECONDS)
    wait_until(
        lambda: scene.marked or RUN_ID not in scene.listener.honoured,
        WAIT_SECONDS,
        "the listener to stop the query or leave it",
    )
    if scene.marked:
        scene.query_ends()
    requester.join(WAIT_SECONDS)
    scene.assert_outcomes_agree()


def test_fixed_a_query_made_to_stop_before_the_deadline_that_ends_after_it_is_savepointed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The listener sees the request at once; the query's batch ends (it is made to stop)
    just before the listener's time is up, and its termination event comes after the
    requester's deadline (a slow commit, a busy listener bus)."""
    scene = Scene(tmp_path, monkeypatch)

    def stop_after_batch(query: Any, timeout: float) -> None:
        batch_ends = time.time() + timeout - 0.05
        wait_until(lambda: time.time() >= batch_ends, WAIT_SECONDS, "the batch's end")
        scene.marked.append(time.time())

    monkeypatch.setattr(stopping, "stop_after_batch", stop_after_batch)
    requester = scene.request()
    deadline = scene.deadline()
    scene.listener.onQueryProgress(SimpleNamespace(progress=scene.query))
    wait_until(lambda: scene.marked, WAIT_SECONDS, "the query made to stop")
    wait_until(lambda: time.time() > deadline + 0.2, WAIT_SECONDS, "the requester's deadline")
    scene.query_ends()
    requester.join(WAIT_SECONDS)
    assert not requester.is_alive()
    scene.assert_outcomes_agree()


class ObjectStore:
    """Keys to text, as an object store holds them; ``watched`` is a restored savepoint's
    prefix: every put checks that its manifest is never there before all its state."""

    def __init__(self, watched: str, state: list[str]) -> None:
        self.objects: dict[str, str] = {}
        self.watched, self.state = watched, state
        self.seen_early: list[list[str]] = []

    def put(self, key: str, text: str) -> None:
        self.objects[key] = text
        if f"{self.watched}/manifest.json" in self.objects:
            held = sorted(k for k in self.objects if k.startswith(f"{self.watched}/state/"))
            if held != [f"{self.watched}/{name}" for name in self.state]:
                self.seen_early.append(held)


class StoreFiles:
    """``HadoopFiles`` over ``ObjectStore`` with S3A's semantics: a directory is a prefix;
    a rename or move copies object by object (in key order), then deletes."""

    def __init__(self, store: ObjectStore, prefix: str) -> None:
        self.store, self.prefix = store, prefix.strip("/")
        self.location = f"s3a://bucket/{self.prefix}"

    def key(self, relative: str) -> str:
        return "/".join(part for part in (self.prefix, relative.strip("/")) if part)

    def uri(self, relative: str = "") -> str:
        return f"s3a://bucket/{self.key(relative)}"

    def under(self, relative: str) -> list[str]:
        key = self.key(relative)
        return sorted(k for k in self.store.objects if k == key or k.startswith(f"{key}/"))

    def read_text(self, relative: str) -> str | None:
        return self.store.objects.get(self.key(relative))

    def write_text(self, relative: str, text: str) -> None:
        self.store.put(self.key(relative), text)

    def names(self, relative: str = "") -> list[str]:
        key = self.key(relative)
        return sorted({k[len(key) + 1 :].split("/")[0] for k in self.under(relative) if k != key})

    def exists(self, relative: str = "") -> bool:
        return bool(self.under(relative))

    def is_directory(self, relative: str = "") -> bool:
        return any(k != self.key(relative) for k in self.under(relative))

    def delete(self, relative: str) -> None:
        for key in self.under(relative):
            del self.store.objects[key]

    def copy_to(self, relative: str, target: StoreFiles, target_relative: str) -> None:
        source = self.key(relative)
        for key in self.under(relative):
            target.store.put(
                target.key(target_relative) + key[len(source) :], self.store.objects[key]
            )

    def move_to(self, relative: str, target: StoreFiles, target_relative: str) -> None:
        self.copy_to(relative, target, target_relative)
        self.delete(relative)

    def rename(self, relative: str, target_relative: str) -> None:
        self.move_to(relative, self, target_relative)


@pytest.mark.parametrize("mode", ["no-claim", "claim"])
def test_fixed_a_restore_on_object_storage_never_shows_a_manifest_over_part_of_the_state(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rename on S3A copies object by object, ``manifest.json`` before ``state/`` (key
    order): a restore killed in it left the restored manifest over part of the state, which
    the next start restored from (keys lost without a word). Checked at every object put."""
    state = [f"state/operator-0/part-{index}.parquet" for index in range(3)]
    store = ObjectStore(f"checkpoint/{savepoint_module.RESTORED_DIRECTORY}", state)
    manifest = savepoint_module.Manifest(
        batch_id=3,
        source_offsets=[],
        operators=[
            savepoint_module.OperatorSnapshot(0, "running_count", 6, "state/operator-0", [], 4)
        ],
        checkpoint="s3a://bucket/query",
        eospack_version="test",
        created_at="2026-11-29T00:00:00Z",
    )
    for name in state:
        store.put(f"savepoint/{name}", "rows")
    store.put("savepoint/manifest.json", manifest.to_json())
    monkeypatch.setattr(
        savepoint_module,
        "checkpoint_files",
        lambda location, spark=None: StoreFiles(store, str(location).removeprefix("s3a://bucket/")),
    )
    monkeypatch.setattr(savepoint_module, "as_hadoop", lambda files, spark=None: files)

    savepoint_module.restore_savepoint(
        "s3a://bucket/savepoint",
        "s3a://bucket/checkpoint",
        mode,
        spark=None,  # type: ignore[arg-type]
    )
    assert store.seen_early == []
    restored = f"checkpoint/{savepoint_module.RESTORED_DIRECTORY}"
    assert sorted(k for k in store.objects if k.startswith("checkpoint/")) == sorted(
        [f"{restored}/{name}" for name in [*state, "manifest.json", "restore-options.json"]]
    )
    assert sorted(k for k in store.objects if k.startswith("savepoint/")) == (
        [] if mode == "claim" else sorted(f"savepoint/{n}" for n in [*state, "manifest.json"])
    )


class Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs (no ``except Exception``)."""


@pytest.mark.parametrize("mode", ["no-claim", "claim"])
def test_fixed_a_local_restore_killed_midway_is_refused_by_the_next_start_in_one_line(
    mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restore killed while it copies (no-claim, or claim across file systems: the
    savepoint on /dev/shm): the next start on the new checkpoint must refuse it in one line.
    It began afresh instead (the copy was staged under a hidden name: no state, offsets
    from the default), and a claim across file systems showed the manifest over part of
    the state."""
    if mode == "claim" and (
        not Path("/dev/shm").is_dir() or os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev
    ):
        pytest.skip("needs /dev/shm on a file system of its own")
    holder = Path(
        tempfile.mkdtemp(prefix="eospack-restore-", dir="/dev/shm" if mode == "claim" else tmp_path)
    )
    try:
        saved = holder / "savepoint"
        (saved / "state" / "operator-0").mkdir(parents=True)
        for index in range(3):
            (saved / "state" / "operator-0" / f"part-{index}.parquet").write_text("rows")
        manifest = savepoint_module.Manifest(
            batch_id=3,
            source_offsets=[{"topic": {"0": 5}}],
            operators=[
                savepoint_module.OperatorSnapshot(0, "running_count", 6, "state/operator-0", [], 4)
            ],
            checkpoint="/query",
            eospack_version="test",
            created_at="2026-11-29T00:00:00Z",
        )
        (saved / "manifest.json").write_text(manifest.to_json())
        copied: list[str] = []
        copy_file = shutil.copyfile

        def killed_at_the_second_state_file(source: Any, target: Any, **options: Any) -> Any:
            if os.fspath(source).endswith(".parquet"):
                copied.append(os.fspath(source))
                if len(copied) == 2:
                    raise Killed
            return copy_file(source, target, **options)

        monkeypatch.setattr(shutil, "copyfile", killed_at_the_second_state_file)
        with pytest.raises(Killed):
            savepoint_module.restore_savepoint(saved, tmp_path / "checkpoint", mode)  # type: ignore[arg-type]
        monkeypatch.undo()
        with pytest.raises(savepoint_module.SavepointError) as refused:
            savepoint_module.RestoredCheckpoint(tmp_path / "checkpoint")
        assert "\n" not in str(refused.value) and "manifest.json" in str(refused.value)
    finally:
        shutil.rmtree(holder, ignore_errors=True)


def test_fixed_a_second_stop_request_while_one_waits_is_refused_and_leaves_the_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two ``create --stop`` on one checkpoint: the second overwrote the first's request
    and removed its acknowledgement, so the first, its query stopped, could report that
    nothing stopped (or wait for a stop that was now the second's)."""
    scene = Scene(tmp_path, monkeypatch)
    first = {"id": "first", "deadline": time.time() + 600, "stop_by": time.time() + 595}
    (scene.checkpoint / STOP_REQUEST).write_text(json.dumps(first))
    (scene.checkpoint / stopping.ACKNOWLEDGED).write_text(json.dumps({"request": "first"}))
    with pytest.raises(StopWithSavepointError) as refused:
        request_stop_with_savepoint(
            None,  # type: ignore[arg-type]  # local paths need no session
            scene.checkpoint,
            tmp_path / "other-savepoint",
            timeout=TIMEOUT,
            poll_seconds=0.02,
        )
    assert "\n" not in str(refused.value) and "already" in str(refused.value)
    assert json.loads((scene.checkpoint / STOP_REQUEST).read_text()) == first
    assert (scene.checkpoint / stopping.ACKNOWLEDGED).exists()
    assert scene.savepoints == []
