"""The node's contract, declared once: what a client, a tree or another process may rely on.

Every capsule service verb (``services``), both actions' fields (``actions``), the error codes
(``errors``), the QoS and topic names both sides must agree on (``qos``), how a goal is named
(``goals``), every parameter of the
node, its robot I/O and the simulator node (``parameters`` and its tables ``node_params``,
``robot_io_params``, ``sim_params``), and the behaviour-tree node manifest (``tree_nodes``).
The node's handlers live in ``flashrt_ros.ros``; the client, the CLI and the trees are made from
these declarations; ``python -m flashrt_ros.interface.generate`` rewrites every artefact made
from them (docs tables, the Groot2 model, the error-code block of every interface file).

A leaf: these modules import the generated interfaces (``flashrt_ros.msg/srv/action``,
``std_srvs``) and the standard library, nothing else of ``flashrt_ros``, so a behaviour tree on a
laptop loads no server code to learn a verb's name (``test/test_interface_package.py``). This
file imports nothing: ``runtime.errors`` takes its codes from ``errors`` without loading ROS.
"""
