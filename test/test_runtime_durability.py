"""Disk durability: no crash, kill or failed step of a save can lose a capsule; names persist.

Each test here fails on the two-file format this replaced (an old manifest beside new
tensors after a kill between the two renames; temp files left forever; names forgotten
across restarts; a device overwrite deleting the saved files).
"""
from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from capsule_files import read_manifest
from flashrt_ros.runtime import disk
from flashrt_ros.runtime.errors import AlreadyExists, CapsuleIOError
from flashrt_ros.runtime.store import CapsuleStore
from flashrt_ros.runtime.toy import ToyEngine, live_bytes, toy_arena

REPO = Path(__file__).resolve().parents[1]
MB = 1 << 20
FP = "fp-durable"
#: The filesystem steps of one save, in order (see ``disk.write_capsule``).
STEPS = ("write temp", "fsync temp", "rename", "fsync directory")


def make_store(directory, steps: int = 5, **arena_kw):
    arena = toy_arena(**arena_kw)
    engine = ToyEngine(arena)
    engine.prefill(steps)
    store = CapsuleStore(arena, FP, device_budget_bytes=MB, host_budget_bytes=MB, disk_budget_bytes=8 * MB,
                         directory=directory)
    return arena, engine, store


def digest(arena) -> str:
    return hashlib.blake2b(b"".join(v for _, v in sorted(live_bytes(arena).items())), digest_size=16).hexdigest()


def loaded_digest(directory, name: str = "cap") -> str:
    """Load ``name`` in a fresh store over ``directory`` and return the restored state's digest."""
    arena, _, store = make_store(directory, steps=1)
    store.load(name)
    store.restore(name)
    return digest(arena)


def instrument(monkeypatch, at: int, action) -> list[str]:
    """Call ``action(step)`` just before filesystem step number ``at`` of every save."""
    seen: list[str] = []
    originals = {"write temp": disk.save_file, "fsync": disk._fsync_path, "rename": os.replace}

    def hook(step: str) -> None:
        seen.append(step)
        if len(seen) - 1 == at:
            action(step)

    def save_file(*a, **k):
        hook("write temp")
        return originals["write temp"](*a, **k)

    def fsync(path):
        hook("fsync directory" if Path(path).is_dir() else "fsync temp")
        return originals["fsync"](path)

    def replace(*a, **k):
        hook("rename")
        return originals["rename"](*a, **k)

    monkeypatch.setattr(disk, "save_file", save_file)
    monkeypatch.setattr(disk, "_fsync_path", fsync)
    monkeypatch.setattr(disk.os, "replace", replace)
    return seen


@pytest.mark.parametrize("at", range(len(STEPS)), ids=STEPS)
def test_a_failed_step_of_an_overwriting_save_keeps_the_old_capsule(tmp_path, monkeypatch, at):
    arena, engine, store = make_store(tmp_path)
    store.snapshot("cap", tier="disk")
    old = digest(arena)
    engine.step()

    def fail(step):
        raise OSError(5, f"injected failure before {step}")

    seen = instrument(monkeypatch, at, fail)
    rename = STEPS.index("rename")
    if at <= rename:
        with pytest.raises(CapsuleIOError, match="injected"):
            store.snapshot("cap", tier="disk", overwrite=True)
    else:
        # after the rename the new capsule is complete and current; a failed directory fsync
        # only means a power cut could bring back the old (complete) file
        store.snapshot("cap", tier="disk", overwrite=True)
    assert seen[-1] == STEPS[at]
    monkeypatch.undo()
    assert not disk.temp_files(tmp_path)
    assert store.verify("cap").ok
    assert loaded_digest(tmp_path) == (old if at <= rename else digest(arena))


CRASHER = r"""
import os, sys
from pathlib import Path
from flashrt_ros.runtime import disk
from flashrt_ros.runtime.store import CapsuleStore
from flashrt_ros.runtime.toy import ToyEngine, toy_arena
directory, at = sys.argv[1], int(sys.argv[2])
arena = toy_arena(); engine = ToyEngine(arena); engine.prefill(5)
store = CapsuleStore(arena, "fp-durable", device_budget_bytes=1 << 20, host_budget_bytes=1 << 20,
                     disk_budget_bytes=8 << 20, directory=directory)
engine.prefill(int(sys.argv[3]))
calls = []
def crash_at(fn):
    def wrapped(*a, **k):
        calls.append(1)
        if len(calls) - 1 == at:
            os._exit(17)          # like kill -9: no cleanup, no finally
        return fn(*a, **k)
    return wrapped
disk.save_file = crash_at(disk.save_file)
disk._fsync_path = crash_at(disk._fsync_path)
disk.os.replace = crash_at(os.replace)
store.load("cap")
store.snapshot("cap", tier="disk", overwrite=True)
os._exit(0)
"""


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))


@pytest.mark.parametrize("at", range(len(STEPS) + 1), ids=[*(f"before {s}" for s in STEPS), "after all"])
def test_a_kill_between_any_two_save_steps_leaves_the_old_or_the_new_capsule(tmp_path, at):
    arena, engine, store = make_store(tmp_path)
    store.snapshot("cap", tier="disk")
    old = digest(arena)
    engine.prefill(2)
    new = digest(arena)
    out = subprocess.run([sys.executable, "-c", CRASHER, str(tmp_path), str(at), "2"], cwd=REPO, env=_env(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == (17 if at < len(STEPS) else 0), out.stderr
    temps_left = len(disk.temp_files(tmp_path))
    assert temps_left == (1 if at in (1, 2) else 0)      # killed after the temp file existed, before the rename
    fresh_arena, _, fresh = make_store(tmp_path, steps=1)
    assert fresh.stats()["disk"]["orphans_removed"] == temps_left
    assert not disk.temp_files(tmp_path)
    fresh.load("cap")
    fresh.restore("cap")
    assert digest(fresh_arena) == (old if at <= STEPS.index("rename") else new)


LOOPER = r"""
import hashlib, sys
from flashrt_ros.runtime.store import CapsuleStore
from flashrt_ros.runtime.toy import ToyEngine, live_bytes, toy_arena
directory = sys.argv[1]
arena = toy_arena(max_len=64); engine = ToyEngine(arena)
store = CapsuleStore(arena, "fp-durable", device_budget_bytes=1 << 20, host_budget_bytes=1 << 20,
                     disk_budget_bytes=64 << 20, directory=directory)
for i in range(10 ** 6):
    if int(arena["meta.position"].item()) >= 60:
        arena.zero_()
    engine.step()
    d = hashlib.blake2b(b"".join(v for _, v in sorted(live_bytes(arena).items())), digest_size=16).hexdigest()
    print("writing", d, flush=True)
    store.snapshot("cap", tier="disk", overwrite=True)
    print("saved", d, flush=True)
"""


def test_kill_9_of_a_process_saving_in_a_loop_never_loses_the_capsule(tmp_path):
    kills, announced = 3, []
    for k in range(kills):
        proc = subprocess.Popen([sys.executable, "-u", "-c", LOOPER, str(tmp_path)], cwd=REPO, env=_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
        reader.start()
        deadline = time.monotonic() + 120
        # kill at a different moment each time: after 3, 8, 13 completed saves, mid-way into the next
        while sum(line.startswith("saved") for line in list(lines)) < 3 + 5 * k:
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "saver made no progress"
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        reader.join(30)
        proc.stderr.close()
        written = [line.split()[1] for line in lines if line.startswith("writing")]
        announced.append(set(written[-2:]))       # the last save completed, or the one in flight
        fresh_arena, _, fresh = make_store(tmp_path, steps=1, max_len=64)
        fresh.load("cap")
        fresh.restore("cap")
        assert digest(fresh_arena) in announced[-1]
        assert not disk.temp_files(tmp_path)      # the fresh store removed any orphan
    assert len(announced) == kills


def test_orphaned_temp_files_are_removed_at_start_and_counted(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    (tmp_path / f".cap.{dead}.0123abcd.tmp").write_bytes(b"x" * 1000)
    (tmp_path / f".old.{dead}.89abcdef.safetensors.tmp").write_bytes(b"y" * 24)     # format 1's temp names
    mine = tmp_path / f".busy.{os.getpid()}.00000000.tmp"                            # a live writer's
    mine.write_bytes(b"z" * 10)
    _, _, store = make_store(tmp_path)
    stats = store.stats()["disk"]
    assert (stats["orphans_removed"], stats["orphan_bytes_removed"]) == (2, 1024)
    assert (stats["temp_files"], stats["temp_bytes"]) == (1, 10)      # in flight: reported, not removed
    assert sorted(os.listdir(tmp_path)) == [mine.name]


def test_a_name_saved_by_an_earlier_run_is_not_overwritten_without_overwrite(tmp_path):
    arena, engine, store = make_store(tmp_path)
    store.snapshot("home")
    store.save("home")
    saved = digest(arena)
    del store
    arena, engine, store = make_store(tmp_path, steps=3)
    assert [c.name for c in store.list()] == ["home"] and store.get("home").tier == "disk"
    with pytest.raises(AlreadyExists):
        store.snapshot("home")
    with pytest.raises(AlreadyExists):
        store.snapshot("home", tier="disk")
    with pytest.raises(AlreadyExists):
        store.fork("home", "home")
    store.restore("home")                   # the indexed file restores (bytes verified on read)
    assert digest(arena) == saved
    assert loaded_digest(tmp_path, "home") == saved


def test_overwriting_a_saved_capsule_in_memory_replaces_its_file_instead_of_deleting_it(tmp_path):
    arena, engine, store = make_store(tmp_path)
    store.snapshot("k")
    store.save("k")
    engine.prefill(2)
    store.snapshot("k", overwrite=True)       # a device-tier overwrite
    assert store.get("k").tier == "device" and store.get("k").on_disk
    assert os.listdir(tmp_path) == ["k.safetensors"]
    assert loaded_digest(tmp_path, "k") == digest(arena)
    assert store.stats()["disk"]["bytes"] == store.get("k").nbytes


def test_a_file_of_another_model_keeps_its_name_until_overwrite(tmp_path):
    arena, engine, store = make_store(tmp_path)
    store.snapshot("x", tier="disk")
    other = CapsuleStore(toy_arena(), "fp-other", device_budget_bytes=MB, host_budget_bytes=MB,
                         disk_budget_bytes=MB, directory=tmp_path)
    assert "x" not in other and other.stats()["disk"]["unowned_files"] == 1
    with pytest.raises(AlreadyExists, match="FINGERPRINT_MISMATCH"):
        other.snapshot("x")
    other.snapshot("x", overwrite=True)
    assert read_manifest(tmp_path / "x.safetensors")["fingerprint"] == "fp-other"


def test_drop_keeping_files_keeps_the_name_taken(tmp_path):
    arena, engine, store = make_store(tmp_path)
    store.snapshot("b", tier="disk")
    store.drop("b", delete_files=False)
    with pytest.raises(AlreadyExists):
        store.snapshot("b")
    store.load("b")                      # the kept file is a capsule again
    assert store.get("b").on_disk
