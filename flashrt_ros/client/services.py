"""Service calls: one request, its answer checked, a lost reply re-sent.

Lost replies. A DDS service reply can be lost for good: Fast DDS drops it when
the server has not yet matched the client's reply reader ("failed to send
response (timeout)", ros2/ros2#1253), typically on a new client's first calls
on a loaded machine. So every wait is bounded and ends in ``TIMEOUT`` (error
code 13), and a request whose reply has not come is sent again (2 s, 6 s, 14 s,
... after the first). Every verb that changes something carries a fresh
``request_id`` (``with_request_id``): the node answers a copy under that id with
the first request's answer and never runs it again (``ros/request_ledger.py``), so
a rollback re-sent goes back once, a fork re-sent is not refused as ALREADY_EXISTS.
Read-only verbs (list, verify) are re-sent as they are. A request sent without an
id (by another client: ``ros2 service call``) is re-sent here only where a repeat
cannot do anything one late request would not (``retry_safe`` of each verb's
declaration in ``interface/services.py``).
"""
from __future__ import annotations

import time
import uuid
from typing import Any

from rcl_interfaces.srv import SetParameters
from rclpy.task import Future

from flashrt_ros.client.core import TIMEOUT_CODE, ClientCore, ServiceCallError
from flashrt_ros.interface.qos import SERVICE_QOS
from flashrt_ros.interface.services import BY_NAME, VERBS

#: verb -> (service type, service name relative to the node's namespace): every capsule verb of
#: ``interface/services.py``, and the node's own parameter service (rclpy's), for behaviour trees
#: (SetParameter); its answers have results[] instead of success (bt/requests.py reads both)
SERVICES: dict[str, tuple[type, str]] = {
    **{verb.name: (verb.srv, verb.name) for verb in VERBS},
    "set_parameters": (SetParameters, "set_parameters"),
}


#: Verbs a lost reply may be re-sent for (see the module docstring); ``snapshot`` only with overwrite.
RETRY_SAFE_VERBS = frozenset({verb.name for verb in VERBS if verb.retry_safe} | {"set_parameters"})
#: How long one attempt waits for its reply before a retry-safe request is sent again (doubling).
FIRST_ATTEMPT_S = 2.0


def with_request_id(verb: str, fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` plus a fresh ``request_id`` for a verb whose request takes one (and was given none): every copy of
    the request then carries it, and the node answers copies with the first answer."""
    if verb in BY_NAME and BY_NAME[verb].takes_request_id and not fields.get("request_id"):
        return {**fields, "request_id": uuid.uuid4().hex}
    return dict(fields)


def retry_safe(verb: str, fields: dict[str, Any]) -> bool:
    """Whether re-sending ``verb`` after a lost reply is safe (see the module docstring)."""
    return verb in RETRY_SAFE_VERBS or (verb in BY_NAME and BY_NAME[verb].is_retry_safe(fields))


def resend_times(timeout_s: float, first_s: float = FIRST_ATTEMPT_S) -> list[float]:
    """Offsets (s after the first send) at which a retry-safe request is sent again: 2, 6, 14, ..."""
    times, at, step = [], first_s, first_s
    while at < timeout_s:
        times.append(at)
        step *= 2
        at += step
    return times


class ServiceCalls(ClientCore):
    """``call`` (blocking) and ``call_async`` (a future, for behaviour trees) of the node's services."""

    def _setup_services(self) -> None:
        qos = SERVICE_QOS.profile()
        self._clients = {verb: self.node.create_client(srv, f"{self.namespace}/{name}", qos_profile=qos)
                         for verb, (srv, name) in SERVICES.items()}

    def request(self, verb: str, **fields: Any) -> Any:
        srv_type, _ = SERVICES[verb]
        req = srv_type.Request()
        for key, value in fields.items():
            if not hasattr(req, key):
                raise ValueError(f"{verb}: unknown field {key!r}")
            setattr(req, key, value)
        return req

    def wait_for(self, verb: str, timeout_s: float) -> bool:
        return self._clients[verb].wait_for_service(timeout_sec=timeout_s)

    def forget(self, verb: str, future: Future) -> None:
        """Abandon a request sent with call_async (its answer, if any, is dropped)."""
        self._clients[verb].remove_pending_request(future)

    def call_async(self, verb: str, **fields: Any) -> Future:
        """Send without waiting; the caller polls ``future.done()``."""
        return self._clients[verb].call_async(self.request(verb, **fields))

    def call(self, verb: str, *, timeout_s: float = 10.0, wait_s: float = 10.0,
             check: bool = True, **fields: Any) -> Any:
        """Call and wait; raises ServiceCallError unless the response succeeded.

        ``wait_s`` bounds finding the service, ``timeout_s`` the reply. A
        retry-safe request whose reply has not come is sent again (2 s, 6 s,
        14 s, ... after the first); the first reply to any copy is the answer.
        """
        client = self._clients[verb]
        deadline = time.monotonic() + wait_s
        while not client.wait_for_service(timeout_sec=min(0.2, wait_s)):
            self.raise_if_interrupted()
            if time.monotonic() > deadline:
                raise ServiceCallError(
                    f"service {client.srv_name} not available after {wait_s:.1f} s "
                    "(is the node running and active, and on the same ROS_DOMAIN_ID?)", TIMEOUT_CODE)
        fields = with_request_id(verb, fields)
        request = self.request(verb, **fields)
        instance = self.node_watch.heard().instance_id       # a restart while waiting ends the wait (NODE_GONE)
        resends = resend_times(timeout_s) if retry_safe(verb, fields) else []
        futures = [client.call_async(request)]
        start = time.monotonic()
        try:
            while True:
                answered = next((f for f in futures if f.done()), None)
                if answered is not None:
                    response = answered.result()
                    break
                left = start + timeout_s - time.monotonic()
                if left <= 0:
                    response = None
                    break
                if resends and time.monotonic() - start >= resends[0]:
                    resends.pop(0)
                    futures.append(client.call_async(request))
                    continue
                next_event = min(left, (start + resends[0] - time.monotonic()) if resends else left)
                self._wait_any(futures, max(0.0, next_event), instance)
        finally:
            for f in futures:
                if not f.done():
                    client.remove_pending_request(f)
        if response is None:
            sent = f" (sent {len(futures)} times)" if len(futures) > 1 else \
                ("" if retry_safe(verb, fields) else "; not re-sent: it may have been applied")
            raise ServiceCallError(f"{client.srv_name}: no response within {timeout_s:.1f} s "
                                   f"(TIMEOUT{sent})", TIMEOUT_CODE)
        if check and not response.success:
            raise ServiceCallError(f"{verb} failed: {response.message}",
                                   getattr(response, "error_code", 0), response)
        return response
