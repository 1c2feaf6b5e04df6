"""The disk tier: round trips across processes and refusal of damaged or foreign files."""
from __future__ import annotations

import hashlib
import math
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from capsule_files import data_region, read_header, read_manifest, rewrite_manifest

from flashrt_ros.runtime.errors import (CapsuleIOError, CapsuleNotFound, CorruptCapsule, FingerprintMismatch,
                                        InvalidArgument, LayoutMismatch)
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


def test_a_capsule_is_one_safetensors_file_carrying_its_manifest(tmp_path):
    directory = tmp_path / "caps"
    saved(directory)
    assert sorted(os.listdir(tmp_path)) == ["caps"]
    assert sorted(os.listdir(directory)) == ["cap.safetensors"]
    manifest = read_manifest(directory / "cap.safetensors")
    assert read_header(directory / "cap.safetensors")["__metadata__"]["format_version"] == "2"
    assert manifest["format_version"] == 2 and manifest["fingerprint"] == FP
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
    assert "cap" not in fresh            # not indexed either: the size check runs at start


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


def test_a_file_deleted_under_the_store_is_reported(tmp_path):
    arena, engine, store = make_store(tmp_path)
    store.snapshot("a", tier="disk")
    (tmp_path / "a.safetensors").unlink()
    with pytest.raises(CapsuleNotFound):
        store.restore("a")
    assert not store.verify("a").ok
    with pytest.raises(CapsuleNotFound):
        store.load("never-written")


def test_unsupported_format_version_is_refused(tmp_path):
    saved(tmp_path)
    rewrite_manifest(tmp_path / "cap.safetensors", lambda m: m.update(format_version=99))
    _, _, fresh = make_store(tmp_path)
    with pytest.raises(CorruptCapsule, match="format version"):
        fresh.load("cap")


def test_a_directory_named_like_a_capsule_is_an_io_error(tmp_path):
    (tmp_path / "cap.safetensors").mkdir()
    _, _, fresh = make_store(tmp_path)
    with pytest.raises(CapsuleIOError, match="not a regular file"):
        fresh.load("cap")


@pytest.mark.parametrize("field,value", [
    ("position", 999999), ("boundary_id", 7), ("session", "other"), ("created_at", 12345.0),
    ("nbytes", 1), ("name", "other"), ("layout_key", "x"), ("extents", {}), ("content_hash", "0" * 32)])
def test_every_manifest_field_is_covered_by_the_manifest_hash(tmp_path, field, value):
    saved(tmp_path)
    rewrite_manifest(tmp_path / "cap.safetensors", lambda m: m.update({field: value}), rehash=False)
    _, _, fresh = make_store(tmp_path)
    with pytest.raises(CorruptCapsule):
        fresh.load("cap")


@pytest.mark.parametrize("field,value", [("position", 6), ("boundary_id", 999), ("position", 4)])
def test_a_resigned_manifest_must_still_match_the_stored_state(tmp_path, field, value):
    saved(tmp_path)
    rewrite_manifest(tmp_path / "cap.safetensors", lambda m: m.update({field: value}))
    _, _, fresh = make_store(tmp_path)
    with pytest.raises(CorruptCapsule):
        fresh.load("cap")


@pytest.mark.parametrize("field,value", [
    ("position", 2 ** 70), ("position", -1), ("boundary_id", 2 ** 64), ("created_at", -1e30),
    ("created_at", 1e30), ("nbytes", -5), ("session", "../../x"), ("session", "s" * 10_000),
    ("position", [[[1]]]), ("extents", [[[[]]]])])
def test_out_of_range_manifest_values_are_refused_even_when_resigned(tmp_path, field, value):
    saved(tmp_path)
    rewrite_manifest(tmp_path / "cap.safetensors", lambda m: m.update({field: value}))
    _, _, fresh = make_store(tmp_path)
    assert "cap" not in fresh
    with pytest.raises(CorruptCapsule):
        fresh.load("cap")


def test_deeply_nested_manifest_is_refused_as_corrupt(tmp_path):
    saved(tmp_path)
    rewrite_manifest(tmp_path / "cap.safetensors", None, raw_manifest="[" * 100_000 + "]" * 100_000)
    _, _, fresh = make_store(tmp_path)
    with pytest.raises(CorruptCapsule):
        fresh.load("cap")


def test_nan_created_at_is_refused(tmp_path):
    saved(tmp_path)
    manifest = read_manifest(tmp_path / "cap.safetensors")
    manifest["created_at"] = math.nan
    import json
    rewrite_manifest(tmp_path / "cap.safetensors", None, raw_manifest=json.dumps(manifest))
    _, _, fresh = make_store(tmp_path)
    with pytest.raises(CorruptCapsule):
        fresh.load("cap")


def test_a_fifo_named_like_a_capsule_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "cap.safetensors")
    outcome: dict = {}

    def start_and_load() -> None:
        _, _, fresh = make_store(tmp_path)        # indexing the directory must not block either
        try:
            fresh.load("cap")
        except CapsuleIOError as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=start_and_load, daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "opening a FIFO blocked"
    assert "not a regular file" in str(outcome["error"])


def test_damage_before_the_first_verify_is_caught(tmp_path):
    arena, engine, store = make_store(tmp_path)
    c = store.snapshot("cap")                     # device tier (CPU here): hashed at snapshot time
    c.payload[c.nbytes // 2] ^= 0x40
    report = store.verify("cap")
    assert not report.ok and report.verified and report.mismatched
    with pytest.raises(CorruptCapsule):
        store.restore("cap", verify=True)


def test_without_hashes_at_snapshot_verify_says_unverified_not_intact(tmp_path):
    arena = toy_arena()
    ToyEngine(arena).prefill(3)
    store = CapsuleStore(arena, FP, device_budget_bytes=MB, host_budget_bytes=MB, disk_budget_bytes=0,
                         hash_at_snapshot=False)
    store.snapshot("cap")
    with pytest.raises(InvalidArgument, match="no recorded hashes"):
        store.restore("cap", verify=True)
    first = store.verify("cap")
    assert not first.ok and not first.verified and "unverified" in first.detail
    assert store.verify("cap").ok


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
    assert sorted(os.listdir(tmp_path)) == ["b.safetensors"]
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
