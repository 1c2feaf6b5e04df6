"""The disk tier: round trips across processes and refusal of damaged or foreign files."""
from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from flashrt_ros.runtime.errors import (CapsuleIOError, CapsuleNotFound, CorruptCapsule, FingerprintMismatch,
                                        LayoutMismatch)
from flashrt_ros.runtime.store import CapsuleStore
from flashrt_ros.runtime.toy import ToyEngine, live_bytes, toy_arena

REPO = Path(__file__).resolve().parents[1]
MB = 1 << 20
FP = "fp-disk"

CHILD = r"""
import hashlib, sys
from flashrt_ros.runtime.store import CapsuleStore
from flashrt_ros.runtime.toy import ToyEngine, live_bytes, toy_arena
mode, directory, name, steps = sys.argv[1:]
arena = toy_arena()
engine = ToyEngine(arena)
engine.prefill(int(steps))
store = CapsuleStore(arena, "fp-disk", device_budget_bytes=1 << 20, host_budget_bytes=1 << 20,
                     disk_budget_bytes=1 << 20, directory=directory)
if mode == "write":
    store.snapshot(name)
    store.save(name)
else:
    store.load(name)
    engine.prefill(3)
    store.restore(name)
digest = hashlib.blake2b(b"".join(v for _, v in sorted(live_bytes(arena).items())), digest_size=16)
print(digest.hexdigest())
"""


def digest(arena) -> str:
    return hashlib.blake2b(b"".join(v for _, v in sorted(live_bytes(arena).items())), digest_size=16).hexdigest()


def run_child(*args: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", CHILD, *args], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def make_store(directory, *, fingerprint: str = FP, steps: int = 5, **arena_kw):
    arena = toy_arena(**arena_kw)
    engine = ToyEngine(arena)
    engine.prefill(steps)
    store = CapsuleStore(arena, fingerprint, device_budget_bytes=MB, host_budget_bytes=MB,
                         disk_budget_bytes=MB, directory=directory)
    return arena, engine, store


def saved(tmp_path, name: str = "cap"):
    arena, engine, store = make_store(tmp_path)
    store.snapshot(name)
    store.save(name)
    return arena, engine, store


def data_region(path: Path) -> tuple[int, int]:
    raw = path.read_bytes()
    header = struct.unpack("<Q", raw[:8])[0]
    return 8 + header, len(raw)


def test_capsule_written_by_another_process_loads_byte_exact(tmp_path):
    child_digest = run_child("write", str(tmp_path), "cap", "6")
    arena, engine, store = make_store(tmp_path, steps=2)
    store.load("cap")
    store.restore("cap")
    reference = toy_arena()
    ToyEngine(reference).prefill(6)
    assert live_bytes(arena) == live_bytes(reference)
    assert digest(arena) == child_digest


def test_capsule_written_here_restores_in_a_fresh_process(tmp_path):
    arena, engine, store = saved(tmp_path)
    assert run_child("read", str(tmp_path), "cap", "1") == digest(arena)


def test_disk_files_are_a_manifest_and_safetensors_only_in_the_directory(tmp_path):
    directory = tmp_path / "caps"
    saved(directory)
    assert sorted(os.listdir(tmp_path)) == ["caps"]
    assert sorted(os.listdir(directory)) == ["cap.json", "cap.safetensors"]
    manifest = json.loads((directory / "cap.json").read_text())
    assert manifest["format_version"] == 1 and manifest["fingerprint"] == FP
    assert manifest["position"] == 5 and manifest["extents"]["kv.0"] == 5
    assert (directory / "cap.safetensors").read_bytes()[8:9] == b"{"     # a safetensors header, no pickle


def test_bit_flip_in_tensor_data_is_refused(tmp_path):
    saved(tmp_path)
    path = tmp_path / "cap.safetensors"
    start, end = data_region(path)
    raw = bytearray(path.read_bytes())
    raw[(start + end) // 2] ^= 0x10
    path.write_bytes(bytes(raw))
    _, _, fresh = make_store(tmp_path)
    with pytest.raises(CorruptCapsule, match="do not match"):
        fresh.load("cap")
    assert "cap" not in fresh


def test_truncated_file_is_refused(tmp_path):
    saved(tmp_path)
    path = tmp_path / "cap.safetensors"
    path.write_bytes(path.read_bytes()[:-16])
    _, _, fresh = make_store(tmp_path)
    with pytest.raises(CorruptCapsule, match="truncated"):
        fresh.load("cap")


def test_damaged_tensor_header_is_refused(tmp_path):
    saved(tmp_path)
    path = tmp_path / "cap.safetensors"
    raw = bytearray(path.read_bytes())
    raw[9] = ord("#")
    path.write_bytes(bytes(raw))
    _, _, fresh = make_store(tmp_path)
    with pytest.raises(CorruptCapsule):
        fresh.load("cap")


def test_wrong_fingerprint_is_refused(tmp_path):
    saved(tmp_path)
    _, _, other = make_store(tmp_path, fingerprint="fp-other-model")
    with pytest.raises(FingerprintMismatch):
        other.load("cap")


def test_wrong_layout_is_refused(tmp_path):
    saved(tmp_path)
    _, _, other = make_store(tmp_path, max_len=32)
    with pytest.raises(LayoutMismatch):
        other.load("cap")


def test_missing_files_are_reported(tmp_path):
    saved(tmp_path, "a")
    saved(tmp_path, "b")
    (tmp_path / "a.safetensors").unlink()
    (tmp_path / "b.json").unlink()
    _, _, fresh = make_store(tmp_path)
    with pytest.raises(CorruptCapsule, match="missing"):
        fresh.load("a")
    with pytest.raises(CorruptCapsule, match="manifest"):
        fresh.load("b")
    with pytest.raises(CapsuleNotFound):
        fresh.load("never-written")


def test_unsupported_format_version_is_refused(tmp_path):
    saved(tmp_path)
    path = tmp_path / "cap.json"
    manifest = json.loads(path.read_text())
    manifest["format_version"] = 99
    path.write_text(json.dumps(manifest))
    _, _, fresh = make_store(tmp_path)
    with pytest.raises(CorruptCapsule, match="format version"):
        fresh.load("cap")


def test_unreadable_manifest_is_an_io_error(tmp_path):
    (tmp_path / "cap.json").mkdir()
    _, _, fresh = make_store(tmp_path)
    with pytest.raises(CapsuleIOError):
        fresh.load("cap")


def test_corruption_of_a_demoted_capsule_is_caught_on_restore(tmp_path):
    arena, engine, store = make_store(tmp_path)
    store.snapshot("cap", tier="disk")
    path = tmp_path / "cap.safetensors"
    start, end = data_region(path)
    raw = bytearray(path.read_bytes())
    raw[start] ^= 0x01
    path.write_bytes(bytes(raw))
    before = live_bytes(arena)
    with pytest.raises(CorruptCapsule):
        store.restore("cap")
    assert live_bytes(arena) == before
    assert store.get("cap").tier == "disk" and store.stats()["host"]["bytes"] == 0
    assert not store.verify("cap").ok


def test_drop_deletes_files_unless_asked_to_keep_them(tmp_path):
    arena, engine, store = saved(tmp_path, "a")
    store.snapshot("b")
    store.save("b")
    store.drop("a")
    store.drop("b", delete_files=False)
    assert sorted(os.listdir(tmp_path)) == ["b.json", "b.safetensors"]
    assert store.stats()["disk"]["bytes"] == 0


def test_failed_write_is_an_io_error_and_leaves_no_partial_files(tmp_path, monkeypatch):
    arena, engine, store = make_store(tmp_path)
    store.snapshot("cap")

    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", no_space)
    with pytest.raises(CapsuleIOError, match="No space"):
        store.save("cap")
    assert os.listdir(tmp_path) == []
    assert not store.get("cap").on_disk and store.stats()["disk"]["bytes"] == 0
