"""A client learns within seconds that its node is gone, restarted or not yet active (issue #55, item 3).

The node beats on ``~/node_heartbeat`` from a thread of its own (``ros.node_beacon``); the client hears it
on a thread of its own (``client.node_watch``). Here: a stand-in beat in this process (silence, a restart,
a node still configuring), then a real policy node SIGKILLed under a running ``flashrt run-policy``, which
used to print nothing for over ten minutes.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from bt_harness import POLICY_PARAMS, ObservationFeed
from node_fixtures import ros_node  # noqa: F401 - fixture
from rosproc import NodeUnderTest, ros_env
from waiting import scaled, wait_until
from flashrt_ros.interface.errors import ErrorCode

PERIOD_S = 0.1          # the stand-in's beat (the node's is 0.5 s): silence is judged after 5 periods


class StandInBeat:
    """Publishes ``NodeHeartbeat`` for ``namespace`` every PERIOD_S from a thread; fields settable."""

    def __init__(self, ros_node, namespace: str, instance: str = "a" * 32, state: str = "active") -> None:
        from flashrt_ros.interface.qos import NODE_HEARTBEAT_QOS, NODE_HEARTBEAT_TOPIC
        from flashrt_ros.msg import NodeHeartbeat
        self.instance, self.state, self.beating = instance, state, True
        self.last_beat = 0.0
        self._msg_type = NodeHeartbeat
        self._pub = ros_node.create_publisher(NodeHeartbeat, f"{namespace}/{NODE_HEARTBEAT_TOPIC}",
                                              NODE_HEARTBEAT_QOS.profile())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(PERIOD_S):
            if self.beating:
                self._pub.publish(self._msg_type(instance_id=self.instance, lifecycle_state=self.state,
                                                 period_s=PERIOD_S, goal_ids=[]))
                self.last_beat = time.monotonic()

    def close(self, ros_node) -> None:
        self._stop.set()
        self._thread.join(5)
        ros_node.destroy_publisher(self._pub)


def test_the_watch_names_a_silent_and_a_restarted_node(ros_node):  # noqa: F811
    from flashrt_ros.client import FlashRTClient
    beat = StandInBeat(ros_node, "/gone_a/flashrt")
    client = FlashRTClient(ros_node, "/gone_a/flashrt")
    try:
        watch = client.node_watch
        wait_until(lambda: watch.heard().at is not None, 60, "the first heartbeat")
        assert client.node_active() is True and watch.gone("a" * 32) is None and watch.gone("") is None
        beat.instance = "b" * 32                                 # a new process under the same name
        why = wait_until(lambda: watch.gone("a" * 32), 30, "the restart to be seen")
        assert "restarted" in why and "aaaaaaaa -> bbbbbbbb" in why, why
        assert watch.gone("b" * 32) is None                      # a call that began with the new one waits on
        beat.beating = False                                     # killed: no more beats
        why = wait_until(lambda: watch.gone(""), 30, "the silence to be seen")
        silent_for = time.monotonic() - beat.last_beat
        assert "stopped answering: no heartbeat for" in why, why
        # judged after 5 periods (0.5 s here): not before, and soon after (the watch polls every 50 ms)
        assert 5 * PERIOD_S <= silent_for <= scaled(5 * PERIOD_S + 1.0), silent_for
        with pytest.raises(Exception) as raised:
            client.call("list", wait_s=0.5, timeout_s=5.0)
        assert raised.value.error_code in (int(ErrorCode.NODE_GONE), int(ErrorCode.TIMEOUT))
    finally:
        beat.close(ros_node)
        client.close()


def test_a_goal_waits_for_activation_and_names_the_state_it_stayed_in(ros_node):  # noqa: F811
    """A node still configuring refuses goals; the client waits for its activation within the wait bound, and
    says which state the node stayed in when it does not come (never a bare "rejected")."""
    from flashrt_ros.client import FlashRTClient, ServiceCallError
    beat = StandInBeat(ros_node, "/gone_b/flashrt", state="inactive")
    client = FlashRTClient(ros_node, "/gone_b/flashrt")
    try:
        wait_until(lambda: client.node_watch.heard().at is not None, 60, "the first heartbeat")
        assert client.node_active() is False
        timer = threading.Timer(1.0, lambda: setattr(beat, "state", "active"))
        timer.start()
        client.wait_node_active(scaled(30), "run_policy")        # returns once the beat says active
        assert client.node_active() is True
        beat.state = "unconfigured"
        wait_until(lambda: client.node_active() is False, 30, "the beat to say unconfigured")
        with pytest.raises(ServiceCallError) as raised:
            client.wait_node_active(1.0, "run_policy")
        assert raised.value.error_code == int(ErrorCode.NOT_ACTIVE)
        assert "is unconfigured, not active" in str(raised.value)
    finally:
        beat.close(ros_node)
        client.close()


def test_run_policy_exits_1_within_seconds_when_its_node_is_killed(tmp_path, ros_node):  # noqa: F811
    """The node SIGKILLed mid-goal: ``flashrt run-policy`` exits 1 naming the cause, a few seconds after the
    node's last beat (it used to wait for ever: its result would never come)."""
    node = NodeUnderTest(tmp_path, "gone_c", POLICY_PARAMS)
    feed = None
    cli = None
    try:
        node.wait_active()
        feed = ObservationFeed(ros_node, node)
        cli = subprocess.Popen([sys.executable, "-m", "flashrt_ros.cli", "--node", f"{node.namespace}/flashrt",
                                "run-policy", "--max-duration", "600"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=ros_env())
        stepping = threading.Event()

        def read() -> None:
            for line in cli.stdout:
                if line.startswith("step 3:"):
                    stepping.set()
        threading.Thread(target=read, daemon=True).start()
        assert stepping.wait(scaled(120)), "no third step was printed"
        killed_at = time.monotonic()
        os.killpg(node.proc.pid, signal.SIGKILL)
        node.proc.wait(30)
        rc = cli.wait(scaled(60))
        took = time.monotonic() - killed_at
        err = cli.stderr.read()
        assert rc == 1, err
        assert "stopped answering: no heartbeat for" in err and "NODE_GONE" in err, err
        assert "Traceback" not in err, err
        # 5 beats of 0.5 s, the watch's 50 ms poll, the CLI's exit: "within 3 s" on an idle machine
        assert took <= scaled(3.0) + 1.0, f"{took:.1f} s from the kill to the exit"
    finally:
        if cli is not None and cli.poll() is None:
            cli.kill()
        if feed is not None:
            feed.close(ros_node)
        if node.proc.poll() is None:
            node.stop()
