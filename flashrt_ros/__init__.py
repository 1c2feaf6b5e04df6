"""flashrt_ros: execution-state capsules for graph-captured policies and LLMs in ROS 2.

The generated ROS interfaces (``flashrt_ros.msg``, ``.srv``, ``.action``) may be
installed in a different directory than this library (a bare-machine venv keeps
the library editable in the checkout); ``extend_path`` joins both halves.
"""
from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)  # noqa: F821 - package attribute

__version__ = "0.1.0"
