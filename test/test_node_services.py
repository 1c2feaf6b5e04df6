"""The node's capsule services, action and CLI, against a real node in a subprocess.

These nodes run in a namespace, so test/params_tiny_llm.yaml (keyed ``flashrt:``, which
matches only the un-namespaced node) does not reach them: they host the default model,
SmolLM2-135M on the CPU. Re-keying it to ``/**`` (tiny random Llama) makes generations too
short for the mid-generation tests as written; that is left to do.
"""
from __future__ import annotations

import math
import shutil
import subprocess
import sys
import threading
import time

import pytest

from action_msgs.msg import GoalStatus

from flashrt_ros.runtime.errors import ErrorCode
from node_fixtures import active_node, client_of, ros_node  # noqa: F401 - fixture
from capsule_files import rewrite_manifest
from rosproc import NodeUnderTest, ros_env


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with active_node(tmp_path_factory.mktemp("svc"), "svc") as n:
        yield n


@pytest.fixture(scope="module")
def client(node, ros_node):  # noqa: F811
    return client_of(node, ros_node)


def generate(client, prompt, n, **kw):
    pieces = []
    outcome = client.generate(prompt, feedback=pieces.append, max_new_tokens=n,
                              use_chat_template=False, timeout_s=120, **kw)
    assert outcome.accepted and outcome.result.success, outcome.result.message
    return outcome.result, pieces


def test_every_capsule_service_succeeds_on_a_live_session(client, node):
    generate(client, "hello robot", 8, reset=True)
    snap = client.call("snapshot", name="s1", tier="host", overwrite=True)
    assert snap.success and snap.capsule.name == "s1" and snap.capsule.tier == "host"
    assert snap.capsule.position > 0 and snap.capsule.bytes > 0 and snap.engine_latency_ms > 0
    assert client.call("fork", source="s1", name="s1b").capsule.name == "s1b"
    listed = client.call("list")
    assert {"s1", "s1b"} <= {c.name for c in listed.capsules}
    assert listed.host_bytes >= snap.capsule.bytes
    verified = client.call("verify", name="s1", against_live=True)
    assert verified.intact and verified.matches_live and not verified.differing_buffers
    saved = client.call("save", name="s1b")
    assert saved.path.endswith("s1b.safetensors") and (node.capsule_dir / "s1b.safetensors").exists()
    generate(client, " and more", 4)
    assert not client.call("verify", name="s1", against_live=True).matches_live
    restored = client.call("restore", name="s1", verify=True)
    assert restored.capsule.position == snap.capsule.position
    assert client.call("verify", name="s1", against_live=True).matches_live
    after, _ = generate(client, "", 3)
    rolled = client.call("rollback", steps=2)
    assert rolled.position == after.position - 1 - 2   # transcript length minus the pending token
    client.call("drop", name="s1b")
    assert "s1b" not in {c.name for c in client.call("list").capsules}


@pytest.mark.parametrize("verb,fields,code", [
    ("restore", {"name": "no_such_capsule"}, ErrorCode.NOT_FOUND),
    ("snapshot", {"name": "../x"}, ErrorCode.INVALID_NAME),
    ("snapshot", {"name": "/abs"}, ErrorCode.INVALID_NAME),
    ("snapshot", {"name": "x" * 10_000}, ErrorCode.INVALID_NAME),
    ("snapshot", {"name": "ok", "tier": "moon"}, ErrorCode.INVALID_ARGUMENT),
    ("rollback", {"steps": 0}, ErrorCode.INVALID_ARGUMENT),
    ("rollback", {"steps": 100000}, ErrorCode.INVALID_ARGUMENT),
    ("drop", {"name": "no_such_capsule"}, ErrorCode.NOT_FOUND),
    ("load", {"name": "never_saved"}, ErrorCode.NOT_FOUND),
    ("fork", {"source": "no_such_capsule", "name": "y"}, ErrorCode.NOT_FOUND),
])
def test_bad_requests_answer_with_their_error_code(client, verb, fields, code):
    response = client.call(verb, check=False, **fields)
    assert not response.success and response.error_code == int(code), response.message
    assert response.message and "Traceback" not in response.message


def test_snapshot_refuses_to_overwrite_unless_asked(client):
    client.call("snapshot", name="dup", overwrite=True)
    again = client.call("snapshot", name="dup", check=False)
    assert not again.success and again.error_code == int(ErrorCode.ALREADY_EXISTS)
    assert client.call("snapshot", name="dup", overwrite=True).success


def _copy_capsule(directory, source, target, edit):
    path = directory / f"{target}.safetensors"
    shutil.copy(directory / f"{source}.safetensors", path)
    rewrite_manifest(path, lambda m: (m.update(name=target), edit(m, path)))


def test_load_refuses_foreign_fingerprint_and_flipped_bits(client, node):
    client.call("snapshot", name="disk_src", overwrite=True)
    client.call("save", name="disk_src")

    def foreign(manifest, _path):
        manifest["fingerprint"] = "0" * len(manifest["fingerprint"])

    _copy_capsule(node.capsule_dir, "disk_src", "foreign", foreign)
    _copy_capsule(node.capsule_dir, "disk_src", "flipped", lambda m, p: None)
    path = node.capsule_dir / "flipped.safetensors"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x40
    path.write_bytes(bytes(data))
    r = client.call("load", name="foreign", check=False)
    assert not r.success and r.error_code == int(ErrorCode.FINGERPRINT_MISMATCH), r.message
    r = client.call("load", name="flipped", check=False)
    assert not r.success and r.error_code == int(ErrorCode.CORRUPT), r.message
    assert "foreign" not in {c.name for c in client.call("list").capsules}


def test_snapshot_mid_generation_lands_on_a_boundary_and_restore_reproduces(client):
    generate(client, "the quick brown fox", 1, reset=True)
    got: list = []
    seen = threading.Event()

    def feedback(fb):
        got.append(fb)
        if len(got) >= 10:
            seen.set()

    handle_future = client.generate_async("", feedback=feedback, max_new_tokens=60)
    assert seen.wait(60), "no feedback"
    snap = client.call("snapshot", name="mid", overwrite=True)
    handle = client._wait(handle_future, 10)
    result = client._wait(handle.get_result_async(), 120).result
    assert result.success and len(result.token_ids) == 60
    # Tokens covered by the capsule: those reported before it (position = transcript length).
    k = sum(1 for fb in got if fb.position <= snap.capsule.position + 1)
    assert 10 <= k < 60, "snapshot did not land inside the generation"
    client.call("restore", name="mid")
    again, _ = generate(client, "", 60 - k)
    assert list(again.token_ids) == list(result.token_ids[k:])


def test_cancel_stops_at_a_boundary_and_state_stays_restorable(client):
    generate(client, "count with me", 1, reset=True)
    client.call("snapshot", name="before_cancel", overwrite=True)
    first, _ = generate(client, "", 12)
    client.call("restore", name="before_cancel")
    got: list = []
    started = threading.Event()
    handle = client._wait(client.generate_async(
        "", feedback=lambda fb: (got.append(fb), started.set()), max_new_tokens=500), 10)
    assert started.wait(60)
    client._wait(handle.cancel_goal_async(), 10)
    result = client._wait(handle.get_result_async(), 60).result
    assert result.stop_reason == "cancelled" and 0 < len(result.token_ids) < 500
    assert list(result.token_ids) == list(first.token_ids[:len(result.token_ids)]) \
        or len(result.token_ids) > len(first.token_ids)
    client.call("restore", name="before_cancel")
    again, _ = generate(client, "", 12)
    assert list(again.token_ids) == list(first.token_ids)


def test_a_second_goal_is_refused_with_busy_naming_the_running_one(client):
    from flashrt_ros.interface.goals import goal_id_hex
    started = threading.Event()
    handle = client._wait(client.generate_async("go", feedback=lambda fb: started.set(),
                                                max_new_tokens=200, reset=True), 10)
    assert handle.accepted and started.wait(60)
    second = client._wait(client.generate_async("", max_new_tokens=2), 10)
    refused = client.wait_result(second, 60)
    assert refused.status == GoalStatus.STATUS_ABORTED and not refused.result.success
    assert refused.result.error_code == ErrorCode.BUSY
    message = refused.result.message
    assert goal_id_hex(handle.goal_id) in message and client.owner in message, message
    assert f"flashrt cancel {goal_id_hex(handle.goal_id)}" in message, message
    client._wait(handle.cancel_goal_async(), 10)
    client._wait(handle.get_result_async(), 60)


def test_concurrent_clients_get_consistent_answers(client):
    generate(client, "shared state", 4, reset=True)
    errors: list = []

    def worker(i):
        try:
            for j in range(5):
                name = f"c{i}_{j}"
                client.call("snapshot", name=name, overwrite=True)
                assert client.call("verify", name=name).intact
                client.call("restore", name=name)
                client.call("list")
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    positions = {c.position for c in client.call("list").capsules if c.name.startswith("c")}
    assert len(positions) == 1   # nothing ran between them: every capsule is the same state


def test_cli_talks_to_the_running_node(node):
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "flashrt_ros.cli", "--node",
                               f"{node.namespace}/flashrt", *args], capture_output=True, text=True,
                              env=ros_env(), timeout=60)
    r = cli("snapshot", "from_cli", "--overwrite")
    assert r.returncode == 0 and "snapshot from_cli" in r.stdout, r.stderr
    r = cli("list")
    assert r.returncode == 0 and "from_cli" in r.stdout and "position" in r.stdout
    r = cli("restore", "missing_one")
    assert r.returncode == 1 and "no capsule" in r.stderr.lower()
    r = cli("generate", "hi", "--max-new-tokens", "3", "--raw")
    assert r.returncode == 0 and "3 tokens" in r.stderr


def test_budget_exhausted_is_an_error_not_a_crash(tmp_path, ros_node):  # noqa: F811
    from flashrt_ros.client import FlashRTClient
    n = NodeUnderTest(tmp_path, "tight", {"capsule_device_budget_mb": "0",
                                          "capsule_host_budget_mb": "0",
                                          "capsule_disk_budget_mb": "0"})
    try:
        n.wait_active()
        c = FlashRTClient(ros_node, f"{n.namespace}/flashrt")
        r = c.call("snapshot", name="big", check=False, wait_s=30)
        assert not r.success and r.error_code == int(ErrorCode.BUDGET_EXHAUSTED), r.message
        assert c.call("list").capsules == []
        assert c.call("rollback", steps=1, check=False).error_code in (0, int(ErrorCode.INVALID_ARGUMENT))
    finally:
        assert n.stop() == 0, n.log.read_text()


@pytest.mark.parametrize("fields", [
    {"temperature": -1.0}, {"temperature": math.nan}, {"temperature": math.inf}, {"top_p": 1.5},
    {"top_p": math.nan}, {"top_k": -1}, {"temperature": -1.0, "reset": True},
    {"prompt": "", "reset": True}, {"top_p": -0.5, "session": "elsewhere"},
    {"prompt": "word " * 40_000, "reset": True, "code": ErrorCode.CONTEXT_OVERFLOW},
], ids=["temperature<0", "temperature-nan", "temperature-inf", "top_p>1", "top_p-nan", "top_k<0",
        "bad-field-with-reset", "reset-empty-prompt", "bad-field-with-session", "reset-too-long-prompt"])
def test_invalid_generate_fields_are_refused_and_change_no_live_byte(client, fields):
    generate(client, "state that must survive", 3, reset=True)
    client.call("snapshot", name="pre_refusal", overwrite=True)
    fields = dict(fields)
    prompt = fields.pop("prompt", "more")
    code = fields.pop("code", ErrorCode.INVALID_ARGUMENT)
    outcome = client.generate(prompt, max_new_tokens=3, use_chat_template=False, timeout_s=60, **fields)
    assert outcome.accepted and not outcome.result.success
    assert outcome.result.error_code == int(code), outcome.result.message
    assert "Traceback" not in outcome.result.message
    assert client.call("verify", name="pre_refusal", against_live=True).matches_live


def test_largest_uint64_seed_is_a_valid_seed(client):
    result, _ = generate(client, "seeded", 3, reset=True, temperature=0.9, seed=2 ** 64 - 1)
    assert len(result.token_ids) == 3


@pytest.mark.parametrize("session", ["../../x", "s" * 10_000, "a b", ".hidden"])
def test_session_names_are_validated_like_capsule_names(client, session):
    r = client.call("snapshot", name="with_session", session=session, overwrite=True, check=False)
    assert not r.success and r.error_code == int(ErrorCode.INVALID_NAME), r.message
    assert len(r.message) < 500
