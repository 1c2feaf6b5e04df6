"""What a user without ros2cli asks a node besides its services and actions: its ``~/status``
(transient-local: the latest message arrives on subscribing), its ``/diagnostics`` entries and its
parameters (the node's own rcl_interfaces services)."""
from __future__ import annotations

import time
from typing import Any, Callable

from flashrt_ros.client.core import TIMEOUT_CODE, ClientCore, ServiceCallError
from flashrt_ros.interface.qos import SERVICE_QOS, STATUS_QOS, STATUS_TOPIC


class NodeQueries(ClientCore):
    """``status`` / ``watch_status``, ``watch_diagnostics``, ``get_parameters`` / ``set_parameter``."""

    def watch_status(self, callback: Callable[[Any], None]) -> Any:
        """Call ``callback(EngineStatus)`` for every ``~/status`` message (the latched last one first)."""
        from flashrt_ros.msg import EngineStatus
        return self.node.create_subscription(EngineStatus, f"{self.namespace}/{STATUS_TOPIC}", callback,
                                             STATUS_QOS.profile())

    def watch_diagnostics(self, callback: Callable[[Any], None]) -> Any:
        """Call ``callback(DiagnosticArray)`` for every ``/diagnostics`` message (every node's; the
        caller picks its node's entries by name, see ``cli.diagnostics_command``)."""
        from diagnostic_msgs.msg import DiagnosticArray
        return self.node.create_subscription(DiagnosticArray, "/diagnostics", callback, 10)

    def status(self, timeout_s: float = 10.0) -> Any:
        """The node's latest ``~/status`` (EngineStatus); ServiceCallError if none arrives in time."""
        got: list[Any] = []
        sub = self.watch_status(got.append)
        try:
            if not self._wait_until(lambda: bool(got), timeout_s):
                raise ServiceCallError(f"no {self.namespace}/status message within {timeout_s:.1f} s "
                                       "(is the node running, and on the same ROS_DOMAIN_ID?)", TIMEOUT_CODE)
            return got[-1]
        finally:
            self.node.destroy_subscription(sub)

    def get_parameters(self, names: list[str], timeout_s: float = 10.0) -> dict[str, Any]:
        """``{name: Python value}`` of the node's parameters (ServiceCallError for an unknown one)."""
        from rcl_interfaces.msg import ParameterType
        from rcl_interfaces.srv import GetParameters
        from rclpy.parameter import parameter_value_to_python
        values: dict[str, Any] = {}
        unknown: list[str] = []
        for name in names:       # one name per request: rclpy answers an undeclared one with no value
            answer = self._call_node_service(GetParameters, "get_parameters",
                                             GetParameters.Request(names=[name]), timeout_s).values
            if not answer or answer[0].type == ParameterType.PARAMETER_NOT_SET:
                unknown.append(name)
            else:
                values[name] = parameter_value_to_python(answer[0])
        if unknown:
            raise ServiceCallError(f"{self.namespace} has no parameter {', '.join(unknown)} "
                                   "(or it is unset)", 1, response=unknown)
        return values

    def set_parameter(self, name: str, value: Any, timeout_s: float = 10.0) -> None:
        """Set one parameter; ServiceCallError with the node's reason if it refuses."""
        from rcl_interfaces.srv import SetParameters
        from rclpy.parameter import Parameter
        request = SetParameters.Request(parameters=[Parameter(name, value=value).to_parameter_msg()])
        response = self._call_node_service(SetParameters, "set_parameters", request, timeout_s)
        result = response.results[0]
        if not result.successful:
            raise ServiceCallError(f"set {name} refused: {result.reason}", 1, response)

    def _call_node_service(self, srv_type: type, name: str, request: Any, timeout_s: float) -> Any:
        """Call one of the node's own rcl_interfaces services (idempotent requests only).

        A fresh client's first request can be answered before the server has matched the
        client's response reader, and that answer is lost; so an unanswered request is sent
        again after 2, 4, 8 ... s, within ``timeout_s``."""
        client = self.node.create_client(srv_type, f"{self.namespace}/{name}", qos_profile=SERVICE_QOS.profile())
        try:
            if not self._wait_until(client.service_is_ready, timeout_s):
                raise ServiceCallError(f"service {self.namespace}/{name} not available after "
                                       f"{timeout_s:.1f} s (is the node running, and on the same "
                                       "ROS_DOMAIN_ID?)", TIMEOUT_CODE)
            deadline, window, response, sent = time.monotonic() + timeout_s, 2.0, None, 0
            while response is None and (left := deadline - time.monotonic()) > 0:
                future = client.call_async(request)
                sent += 1
                response = self._wait(future, min(window, left))
                if response is None:
                    client.remove_pending_request(future)
                window *= 2
            if response is None:
                seen = "still advertised" if client.service_is_ready() else "no longer advertised"
                raise ServiceCallError(f"{self.namespace}/{name}: no response within {timeout_s:.1f} s "
                                       f"(TIMEOUT; sent {sent} times, the service is {seen})", TIMEOUT_CODE)
            return response
        finally:
            self.node.destroy_client(client)
