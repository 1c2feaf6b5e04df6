"""No value and no callback exception can take the node's executor down; replies always serialize.

rclpy checks message field ranges only when it serializes (inside the executor, after
the callback returned), so before these checks a capsule position of 2**70 stopped the
node in ``send_response``.
"""
from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import rclpy
from rclpy.executors import MultiThreadedExecutor
from rclpy.serialization import serialize_message

from flashrt_ros.ros import conversions as conv
from flashrt_ros.ros.node import spin_until_shutdown
from flashrt_ros.runtime.errors import ErrorCode, FlashRTError
from flashrt_ros.srv import ListCapsules, Snapshot


def capsule(**overrides):
    fields = dict(name="c", session="default", position=5, boundary_id=9, nbytes=100, tier="host",
                  pinned=False, fingerprint="f", content_hash="h", created_at=1.7e9)
    fields.update(overrides)
    return SimpleNamespace(**fields)


@pytest.mark.parametrize("field,value", [("position", 2 ** 70), ("boundary_id", -(2 ** 64)),
                                         ("nbytes", -1), ("created_at", -1e30), ("created_at", float("nan")),
                                         ("created_at", 1e30)])
def test_out_of_range_capsule_values_are_a_clear_error_not_a_crash(field, value):
    with pytest.raises(FlashRTError, match="does not fit"):
        conv.capsule_info(capsule(**{field: value}))


def test_an_unserializable_response_becomes_an_internal_error_response():
    response = Snapshot.Response()
    response.success = True
    response.capsule.position = 2 ** 70             # rclpy accepts this until it serializes
    with pytest.raises(Exception):
        serialize_message(response)
    fixed = conv.sendable(response)
    assert not fixed.success and fixed.error_code == int(ErrorCode.INTERNAL)
    assert "could not be serialized" in fixed.message
    serialize_message(fixed)
    ok = ListCapsules.Response()
    assert conv.sendable(ok) is ok


def test_the_executor_loop_survives_a_raising_callback_and_keeps_serving():
    rclpy.init()
    node = rclpy.create_node("safety_probe")
    executor = MultiThreadedExecutor(num_threads=2)
    executor.add_node(node)
    raised = threading.Event()

    def bad_timer():
        raised.set()
        raise RuntimeError("a callback that fails")

    timer = node.create_timer(0.01, bad_timer)
    answers = []
    service = node.create_service(ListCapsules, "/safety_probe/list",
                                  lambda req, resp: (answers.append(1), conv.fill_ok(resp))[1])
    spinner = threading.Thread(target=spin_until_shutdown, args=(executor, node.get_logger()), daemon=True)
    spinner.start()
    try:
        assert raised.wait(60)
        client_node = rclpy.create_node("safety_client")
        client = client_node.create_client(ListCapsules, "/safety_probe/list")
        executor.add_node(client_node)
        assert client.wait_for_service(timeout_sec=60)
        for _ in range(3):                       # the timer keeps raising meanwhile
            done = threading.Event()
            future = client.call_async(ListCapsules.Request())
            future.add_done_callback(lambda _f: done.set())
            assert done.wait(60) and future.result().success
        assert spinner.is_alive() and len(answers) == 3
    finally:
        node.destroy_timer(timer)
        node.destroy_service(service)
        rclpy.try_shutdown()
        spinner.join(10)
        executor.shutdown()
