"""Lease renewal that nothing can starve (issue #50): the client renews from a thread of its own,
the node reads heartbeats on a thread of its own and judges a lease against what it has heard.

In-process, no flashrt node: a client-side ``LeaseRenewer`` and a node-side
``HeartbeatListener`` on two ROS nodes that no executor spins (as a tick thread busy with a
long tick, or a node whose executor is saturated, would leave them).
"""
from __future__ import annotations

import time
import uuid

import pytest
import rclpy
from rclpy.context import Context

from waiting import load_factor, wait_until
from flashrt_ros.client.lease import LeaseRenewer
from flashrt_ros.interface.goals import goal_id_hex
from flashrt_ros.ros.goals import MAX_UNREAD_S, GoalBook
from flashrt_ros.ros.heartbeats import POLL_S, HeartbeatListener

LEASE_S = 0.8


def test_a_lease_is_judged_against_what_the_node_has_heard():
    book = GoalBook()
    goal = book.begin("run_policy", "ab" * 16, "test", LEASE_S)
    start = goal.started
    assert goal.lease_expired(start + 10 * LEASE_S), "no listener: the wall clock"
    assert not goal.lease_expired(start + 0.9 * LEASE_S)
    book.heard(start + 0.5 * LEASE_S)
    # heartbeats after start + 0.5 lease are not read yet (a busy node): the goal lives on ...
    assert not goal.lease_expired(start + 0.5 * LEASE_S + MAX_UNREAD_S)
    # ... but not for ever: a listener that stopped reading cannot keep a lease alive (fail closed)
    assert goal.lease_expired(start + 10 * LEASE_S)
    book.heard(start + 1.5 * LEASE_S)           # read up to past the lease, and none came
    assert goal.lease_expired(start + 10 * LEASE_S)
    book.renew([goal.goal_id], now=start + 1.4 * LEASE_S)     # ... unless one had come in time
    assert not goal.lease_expired(start + 1.5 * LEASE_S)
    book.heard(None)                            # the listener stopped: the wall clock again
    assert goal.lease_expired(start + 10 * LEASE_S) and not goal.lease_expired(start + 1.5 * LEASE_S)


@pytest.fixture
def context():
    ctx = Context()
    rclpy.init(context=ctx)
    try:
        yield ctx
    finally:
        rclpy.try_shutdown(context=ctx)


def test_renewals_need_no_executor_on_either_side_and_stop_with_the_goal(context):
    node = rclpy.create_node("flashrt", namespace="/renewal", context=context)      # the flashrt node
    client_node = rclpy.create_node("lease_client", context=context)
    book = GoalBook()
    listener = HeartbeatListener(node, book)
    renewer = LeaseRenewer(client_node, "/renewal/flashrt", LEASE_S)
    goal_id = uuid.uuid4().bytes
    try:
        renewer.hold(goal_id)
        goal = book.begin("run_policy", goal_id_hex(goal_id), "test", LEASE_S)
        # neither node is spun by anyone; the goal is renewed all the same, for three leases
        wait_until(lambda: goal.lease_expired() or goal.renewed > goal.started + 3 * LEASE_S, 60,
                   "renewals for three leases")
        assert not goal.lease_expired(), "the goal's lease ran out while its client renewed it"
        renewer.release(goal_id)                 # the client stops renewing (as a killed one does)
        released = time.monotonic()
        wait_until(goal.lease_expired, 60, "the lease to run out")
        after = time.monotonic() - released
        bound = LEASE_S + POLL_S + 0.5 * load_factor()
        print(f"the lease ran out {after:.2f} s after the last renewal could have been sent (bound {bound:.2f} s)")
        assert after <= bound
    finally:
        renewer.close()
        listener.destroy()
        client_node.destroy_node()
        node.destroy_node()


def test_a_stalled_listener_cannot_keep_a_lease_alive(context, monkeypatch):
    """The listener's thread blocked inside a take (a stuck or starved thread): ``heard_until`` freezes, and
    before the bound a dead client's goal lived for ever. Now it ends within its lease plus ``MAX_UNREAD_S``."""
    import threading
    node = rclpy.create_node("flashrt", namespace="/stalled", context=context)
    book = GoalBook()
    stuck = threading.Event()
    listener = HeartbeatListener(node, book)
    try:
        wait_until(lambda: book.heard_until(0.0) > 0.0, 30, "the listener to report once")   # else: the wall clock
        monkeypatch.setattr(listener, "_take", lambda: stuck.wait() and None)     # blocks until the test ends
        goal = book.begin("run_policy", "cd" * 16, "a client that died", LEASE_S)
        started = goal.started
        wait_until(lambda: goal.lease_expired(), 30, "the lease of a goal nobody renews to end")
        assert time.monotonic() - started >= LEASE_S
        frozen = book.heard_until(time.monotonic())
        assert time.monotonic() - frozen > MAX_UNREAD_S - 0.5, "the listener was not stalled"
    finally:
        stuck.set()
        listener.destroy()
        node.destroy_node()
