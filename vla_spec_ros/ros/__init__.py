"""ROS 2 side of vla_spec_ros: the `vla_spec` node and its pure helpers.

`conversions` (Image / CompressedImage <-> numpy), `params` (parameter table and its one
mapping onto EngineConfig + NodeSettings), `command` (action -> twist / gripper and the safety
rules), `diagnostics` (counters) import without rclpy; `node` needs rclpy and the message
packages (DESIGN.md §3, §8).
"""
