"""ROS 2 layer: lifecycle node, conversions, parameters. No tensor math here."""
