"""One service call from a tree: sent by the first ``poll()``, never waited on; a lost reply is
re-sent only where that is safe, and every request ends by its deadline (see ``requests.py``)."""
from __future__ import annotations

import time
from typing import Any

from flashrt_ros.bt.goal_request import halted_goals_settled
from flashrt_ros.bt.progress import BAD_FIELD, DEFAULT_TIMEOUT_S, Progress, describe_failure, tagged
from flashrt_ros.client import resend_times, retry_safe
from flashrt_ros.client.services import with_request_id
from flashrt_ros.interface.errors import ErrorCode


class ServiceRequest:
    """One service call in flight: sent by the first ``poll()``, never waited on."""

    def __init__(self, client: Any, verb: str, fields: dict[str, Any] | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        # one request id for the request and its copies: the node answers a copy with the first answer
        self.client, self.verb, self.timeout_s = client, verb, timeout_s
        self.fields = with_request_id(verb, dict(fields or {}))
        self.futures: list[Any] = []       # the request and its re-sent copies (retry-safe verbs only)
        self.sent_at: float | None = None
        self.deadline: float | None = None
        self.response: Any = None
        self.message = ""
        self.error_code = 0
        self._resends = resend_times(timeout_s) if retry_safe(verb, self.fields) else []

    @property
    def future(self) -> Any:
        """The first request's future (None before it is sent)."""
        return self.futures[0] if self.futures else None

    def poll(self) -> Progress:
        """RUNNING while pending; SUCCESS/FAILURE once answered, refused or timed out."""
        now = time.monotonic()
        if self.deadline is None:
            self.deadline = now + self.timeout_s
        if not self.futures:
            settled = halted_goals_settled(self.client)
            if not settled or not self.client.wait_for(self.verb, 0.0):   # 0: a readiness check, no sleep
                if now < self.deadline:
                    return Progress.RUNNING
                why = ("a halted goal did not report its result" if not settled
                       else "service not available")
                return self._fail(ErrorCode.TIMEOUT, f"{self.verb}: {why} within {self.timeout_s:g} s")
            try:
                self.futures.append(self.client.call_async(self.verb, **self.fields))
            except Exception as exc:  # noqa: BLE001 - e.g. a field rclpy refuses: a FAILURE, never a raise
                return self._fail(ErrorCode.INVALID_ARGUMENT if isinstance(exc, BAD_FIELD)
                                  else ErrorCode.INTERNAL, f"{self.verb}: {type(exc).__name__}: {exc}")
            self.sent_at = now
        answered = next((f for f in self.futures if f.done() and not f.cancelled()), None)
        if answered is not None:
            self._forget_others(answered)
            return self._outcome(answered)
        if all(f.cancelled() for f in self.futures):   # an rclpy future that was cancelled never becomes done
            return self._fail(ErrorCode.CANCELLED, f"{self.verb}: request cancelled")
        if now >= self.deadline:
            self.halt()
            sent = f", sent {len(self.futures)} times" if len(self.futures) > 1 else (
                "" if retry_safe(self.verb, self.fields) else "; not re-sent: it may have been applied")
            return self._fail(ErrorCode.TIMEOUT,
                              f"{self.verb}: no response within {self.timeout_s:g} s (error TIMEOUT{sent})")
        if self._resends and now - self.sent_at >= self._resends[0]:
            self._resends.pop(0)                       # a lost reply: send the same request again
            self.futures.append(self.client.call_async(self.verb, **self.fields))
        return Progress.RUNNING

    def halt(self) -> None:
        """Stop waiting for the response (the server may still apply the request)."""
        self._forget_others(None)

    def _forget_others(self, keep: Any) -> None:
        for f in self.futures:
            if f is not keep and not f.done():
                f.cancel()
                _forget_pending(self.client, self.verb, f)

    @property
    def pending(self) -> bool:
        return any(not f.done() and not f.cancelled() for f in self.futures)

    def _outcome(self, future: Any) -> Progress:
        exc = future.exception()
        if exc is not None:
            return self._fail(ErrorCode.INTERNAL, f"{self.verb}: {type(exc).__name__}: {exc}")
        self.response = future.result()
        if self.response is None:
            return self._fail(ErrorCode.INTERNAL, f"{self.verb}: empty response")
        success, code, message = response_status(self.response)
        if not success:
            return self._fail(code, describe_failure(self.verb, code, message))
        self.error_code, self.message = 0, message
        return Progress.SUCCESS

    def _fail(self, code: int, message: str) -> Progress:
        self.error_code, self.message = int(code), tagged(code, message)
        return Progress.FAILURE


def response_status(response: Any) -> tuple[bool, int, str]:
    """(success, error code, message) of a flashrt response, or of rclpy's SetParameters answer
    (``results[]``: a refused parameter is INVALID_ARGUMENT with the node's reason)."""
    results = getattr(response, "results", None)
    if results is not None and not hasattr(response, "success"):
        refused = [r.reason for r in results if not r.successful]
        if refused:
            return False, int(ErrorCode.INVALID_ARGUMENT), "; ".join(refused)
        return True, 0, "set"
    return bool(response.success), int(getattr(response, "error_code", 0) or 0), response.message


def _forget_pending(client: Any, verb: str, future: Any) -> None:
    """Drop an abandoned request from the rclpy client's pending table (else it leaks)."""
    forget = getattr(client, "forget", None)      # test doubles may not have it
    if forget is not None:
        forget(verb, future)
