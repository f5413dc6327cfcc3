"""ROS 2 side of vla_spec_ros: the `vla_spec` node (plain and managed) and its pure helpers.

Without rclpy: `params` (parameter table and its one mapping onto EngineConfig + NodeSettings),
`command_rules` (action -> twist / gripper and the safety rules), `chunk_rules` (which step of
a chunked model's chunks is due when, docs/chunks.md), `safety_gate` (one robot's hold state
machine), `frame_slot` (the depth-1 frame slot), `diagnostics` (counters), `pose_math` (an
action's end-effector delta applied to the tool pose, docs/robot.md), `message_time` (stamp
and duration arithmetic). Image messages <-> numpy live one level up in `image_messages` (the
bag reader uses them too). With rclpy and the message packages: `qos`, `robot_channel` (one
robot's interfaces, wiring `observation_input`, `safety_gate`, `chunk_execution` and its
input and output adapters), the input adapters (`input_adapter` is their interface:
`state_input`), the output adapters (`output_adapter` is their interface: `twist_output`
with its builders `twist_messages`, `joint_outputs`, `gripper_output` over `gripper_action`
(the control_msgs gripper actions), `raw_action_output`, `pose_output` over `tool_pose`
(absolute targets from the tool pose), `reasoning_output`), `servo_contract` (MoveIt Servo's
command type, pause, timeout), `worker` (the inference thread), `chunk_clock` (the thread
publishing chunk steps on time), `serving` (a loaded node's parts), `node` and
`lifecycle_node`. See docs/architecture.md.
"""
