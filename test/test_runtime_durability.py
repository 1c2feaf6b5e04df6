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
from flashrt_ros.runtime.disk import writer
from flashrt_ros.runtime.errors import AlreadyExists, CapsuleIOError, CapsuleNotFound
from flashrt_ros.runtime.store import CapsuleStore
from flashrt_ros.runtime.toy import ToyEngine, live_bytes, toy_arena

REPO = Path(__file__).resolve().parents[1]
MB = 1 << 20
FP = "fp-durable"
#: The filesystem steps of one save, in order (see ``disk.writer.write_capsule``).
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
    originals = {"write temp": writer.write_safetensors, "fsync": writer._fsync_path, "rename": os.replace}

    def hook(step: str) -> None:
        seen.append(step)
        if len(seen) - 1 == at:
            action(step)

    def write_safetensors(*a, **k):
        hook("write temp")
        return originals["write temp"](*a, **k)

    def fsync(path):
        hook("fsync directory" if Path(path).is_dir() else "fsync temp")
        return originals["fsync"](path)

    def replace(*a, **k):
        hook("rename")
        return originals["rename"](*a, **k)

    monkeypatch.setattr(writer, "write_safetensors", write_safetensors)
    monkeypatch.setattr(writer, "_fsync_path", fsync)
    monkeypatch.setattr(writer.os, "replace", replace)
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
from flashrt_ros.runtime.disk import writer
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
writer.write_safetensors = crash_at(writer.write_safetensors)
writer._fsync_path = crash_at(writer._fsync_path)
writer.os.replace = crash_at(os.replace)
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
    assert temps_left == (1 if at <= STEPS.index("rename") else 0)   # the temp file is created before its bytes
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
    sys.stdout.write(f"writing {d}\n")     # one write per line: print() writes its pieces apart
    store.snapshot("cap", tier="disk", overwrite=True)
    sys.stdout.write(f"saved {d}\n")
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
        # a line the kill cut short has no newline; its save had not started
        written = [line.split()[1] for line in lines if line.startswith("writing") and line.endswith("\n")]
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
    (tmp_path / ".tmpAb3xY9").write_bytes(b"w" * 100)       # safetensors.save_file's own, left by old versions
    mine = tmp_path / f".busy.{os.getpid()}.00000000.tmp"                            # a live writer's
    mine.write_bytes(b"z" * 10)
    _, _, store = make_store(tmp_path)
    stats = store.stats()["disk"]
    assert (stats["orphans_removed"], stats["orphan_bytes_removed"]) == (3, 1124)
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


BIG_SAVER = r"""
import sys, torch
from flashrt_ros.runtime.arena import BufferSpec, StateArena, core_meta_specs
from flashrt_ros.runtime.store import CapsuleStore
arena = StateArena(core_meta_specs() + [BufferSpec("big", (12 << 20,), torch.float32, group="recurrent")])
arena["big"].uniform_()
store = CapsuleStore(arena, "fp-big", device_budget_bytes=1 << 30, host_budget_bytes=1 << 30,
                     disk_budget_bytes=1 << 30, directory=sys.argv[1])
while True:                                 # overwrite the capsule on disk until killed
    arena["big"].add_(1.0)
    store.snapshot("cap", tier="disk", overwrite=True)
"""


def _big_store(directory):
    import torch
    from flashrt_ros.runtime.arena import BufferSpec, StateArena, core_meta_specs
    arena = StateArena(core_meta_specs() + [BufferSpec("big", (12 << 20,), torch.float32, group="recurrent")])
    return CapsuleStore(arena, "fp-big", device_budget_bytes=1 << 30, host_budget_bytes=1 << 30,
                        disk_budget_bytes=1 << 30, directory=directory)


def _hidden_files(directory) -> dict[str, int]:
    out = {}
    for entry in os.scandir(directory):
        if entry.name.startswith("."):
            try:
                out[entry.name] = entry.stat().st_size
            except FileNotFoundError:      # renamed or removed since the scan
                pass
    return out


def test_kill_9_during_a_large_save_leaves_no_temp_byte_after_the_next_start(tmp_path):
    """Killed while a 48 MB capsule's bytes are being written: the next store removes every temp
    byte, counts it, and the capsule loads (safetensors' own .tmpXXXXXX files used to survive)."""
    killed_mid_write = 0
    for _attempt in range(5):      # the kill can land just after a rename: try again then
        proc = subprocess.Popen([sys.executable, "-c", BIG_SAVER, str(tmp_path)], cwd=REPO, env=_env(),
                                stderr=subprocess.PIPE)
        deadline = time.monotonic() + 300
        # a condition, not a delay: kill once some temp file holds written bytes
        while not any(size > 0 for size in _hidden_files(tmp_path).values()):
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "the saver never started writing"
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        proc.stderr.close()
        left = _hidden_files(tmp_path)
        if any(left.values()):
            killed_mid_write += 1
            break
    assert killed_mid_write, "no kill landed inside a write in 5 tries"
    fresh = _big_store(tmp_path)
    stats = fresh.stats()["disk"]
    assert _hidden_files(tmp_path) == {}, "temp files survived the next start"
    assert stats["orphans_removed"] == len(left) and stats["orphan_bytes_removed"] == sum(left.values())
    assert (stats["temp_files"], stats["temp_bytes"]) == (0, 0)
    if "cap" in fresh:                     # the kill may come before the first save completed
        fresh.load("cap")
        assert fresh.verify("cap").ok


@pytest.fixture
def blocked_write(monkeypatch):
    """``arm()``: from then on a capsule write stops after a few bytes until ``release`` is set."""
    started, release = threading.Event(), threading.Event()
    original = writer.write_safetensors

    def write(fd, tensors, metadata):
        os.write(fd, b"partial")            # some temp bytes exist while the write is held
        started.set()
        assert release.wait(120), "test never released the write"
        os.lseek(fd, 0, os.SEEK_SET)
        return original(fd, tensors, metadata)

    def arm():
        monkeypatch.setattr(writer, "write_safetensors", write)
    yield arm, started, release
    release.set()


def _in_thread(fn):
    out: dict = {}
    done = threading.Event()

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised by the test
            out["error"] = exc
        done.set()
    threading.Thread(target=run, daemon=True).start()
    return done, out


def test_other_verbs_answer_while_a_save_writes_and_the_temp_file_is_counted(tmp_path, blocked_write):
    arm, started, release = blocked_write
    arena, engine, store = make_store(tmp_path)
    store.snapshot("big")
    store.snapshot("other", tier="disk")
    arm()
    saving, saved = _in_thread(lambda: store.save("big"))
    assert started.wait(120)
    # the store lock is free: list, stats and a stored verify of a disk capsule answer now
    listed, out = _in_thread(lambda: (store.list(), store.stats(), store.verify("other")))
    assert listed.wait(120), "list blocked behind the save's disk write"
    assert not saving.is_set(), "the save finished early: the test proves nothing"
    names, stats, report = out["value"]
    assert sorted(c.name for c in names) == ["big", "other"] and report.ok
    assert stats["disk"]["temp_files"] == 1 and stats["disk"]["temp_bytes"] > 0   # in flight, counted
    expected = digest(arena)
    release.set()
    assert saving.wait(120) and "error" not in saved, saved.get("error")
    assert store.get("big").on_disk and not disk.temp_files(tmp_path)
    assert loaded_digest(tmp_path, "big") == expected


def test_a_capsule_replaced_during_its_save_is_not_written(tmp_path, blocked_write):
    arm, started, release = blocked_write
    arena, engine, store = make_store(tmp_path)
    store.snapshot("k")
    arm()
    saving, saved = _in_thread(lambda: store.save("k"))
    assert started.wait(120)
    engine.step()
    store.snapshot("k", overwrite=True)       # the same layout in the same tier: must not reuse the bytes
    release.set()
    assert saving.wait(120)
    assert isinstance(saved.get("error"), CapsuleNotFound), saved
    assert os.listdir(tmp_path) == [] and not store.get("k").on_disk
    assert store.verify("k").ok               # the new capsule's bytes match its own hashes
    store.save("k")
    assert loaded_digest(tmp_path, "k") == digest(arena)
