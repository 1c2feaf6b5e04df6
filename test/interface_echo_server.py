"""A process serving every flashrt_ros service type (and the action) with echo handlers.

Used by test_ros_interface_roundtrip.py to prove the generated typesupport
works across processes over DDS on loopback, independent of any engine.
"""
from __future__ import annotations

import sys

import threading

import rclpy
from rclpy.action import ActionServer

from flashrt_ros.action import Generate
from flashrt_ros.msg import CapsuleInfo
from flashrt_ros.ros.spinning import serve_until_interrupted
from flashrt_ros.srv import (Drop, Fork, ListCapsules, Load, Restore, Rollback, Save, Snapshot,
                             Verify)

SERVICES = {"snapshot": Snapshot, "restore": Restore, "fork": Fork, "rollback": Rollback,
            "drop": Drop, "list": ListCapsules, "save": Save, "load": Load, "verify": Verify}


def echo(request, response):
    """Echo the request's first string field back as the message and a capsule name."""
    text = next((getattr(request, f) for f in request.get_fields_and_field_types()
                 if isinstance(getattr(request, f), str) and f != "request_id"), "")
    response.success = True
    response.message = f"echo:{text}"
    if hasattr(response, "capsule"):
        response.capsule = CapsuleInfo(name=text, bytes=123, tier="host")
    if hasattr(response, "capsules"):
        response.capsules = [CapsuleInfo(name="a"), CapsuleInfo(name="b")]
    if hasattr(response, "position"):
        response.position = int(getattr(request, "steps", 0)) * 10
    return response


LATE_FEEDBACK: list = []     # a raw publisher on the action's feedback topic (set in main)


def generate(goal_handle):
    """Echo the prompt as feedback, one piece per character; a prompt starting with "late:"
    gets its last piece published only after the result, as DDS may deliver it anyway."""
    prompt = goal_handle.request.prompt
    late = prompt.startswith("late:")
    pieces = list(enumerate(prompt))
    for i, ch in pieces[:-1] if late else pieces:
        goal_handle.publish_feedback(Generate.Feedback(token_id=ord(ch), text_piece=ch, index=i))
    if late:
        i, ch = pieces[-1]
        message = Generate.Impl.FeedbackMessage(goal_id=goal_handle.goal_id,
                                                feedback=Generate.Feedback(token_id=ord(ch), text_piece=ch, index=i))
        threading.Timer(0.5, LATE_FEEDBACK[0].publish, args=(message,)).start()
    goal_handle.succeed()
    return Generate.Result(success=True, text=prompt[::-1], token_ids=[ord(c) for c in prompt])


def main() -> None:
    rclpy.init()
    node = rclpy.create_node("flashrt_echo")
    for name, srv in SERVICES.items():
        node.create_service(srv, f"/echo/{name}", echo)
    ActionServer(node, Generate, "/echo/generate", execute_callback=generate)
    LATE_FEEDBACK.append(node.create_publisher(Generate.Impl.FeedbackMessage, "/echo/generate/_action/feedback", 10))
    print("echo server ready", flush=True)
    serve_until_interrupted(node, num_threads=2)


if __name__ == "__main__":
    sys.exit(main())
