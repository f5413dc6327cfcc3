"""Output adapter of the gripper, every action space's (output_adapter.py).

  <prefix>gripper   std_msgs/Float64MultiArray [position] per command
                    (command_rules.gripper_position mapping), for a forward command
                    controller; plus, with gripper_action_name, a control_msgs gripper goal
                    when the position changes (gripper_action.py). Nothing on a hold: the
                    controller keeps its last command (the next goal is sent whatever the
                    last one was). A command without a gripper value (an
                    action space whose checkpoint has no gripper dimension) sends nothing
                    either.
"""
from __future__ import annotations

from std_msgs.msg import Float64MultiArray

from vla_spec_ros.ros.gripper_action import GripperActionOutput
from vla_spec_ros.ros.output_adapter import OutputAdapter
from vla_spec_ros.ros.qos import COMMAND_QOS


class GripperOutput(OutputAdapter):
    def __init__(self, node, prefix: str, settings, label: str):
        self.node = node
        self.gripper_pub = node.create_publisher(Float64MultiArray, prefix + 'gripper',
                                                 COMMAND_QOS)
        self.action_client = (GripperActionOutput(node, settings.gripper_action_name,
                                                  settings.gripper_action_type, label)
                              if settings.gripper_action_name else None)

    def publish_command(self, command, stamp, settings, prepared=None) -> None:
        if command.gripper is None:
            return
        self.gripper_pub.publish(Float64MultiArray(data=[command.gripper]))
        if self.action_client is not None:
            self.action_client.send(command.gripper, settings)

    def hold(self, stamp, settings) -> None:
        """Nothing is sent (the controller keeps its last command), but the next goal goes
        out whatever the last one was: something else may move the gripper meanwhile."""
        if self.action_client is not None:
            self.action_client.forget()

    def forget(self) -> None:
        if self.action_client is not None:
            self.action_client.forget()

    def add_to_status(self, status) -> None:
        if self.action_client is not None:
            self.action_client.add_to_status(status)

    def destroy(self) -> None:
        self.node.destroy_publisher(self.gripper_pub)
        if self.action_client is not None:
            self.action_client.destroy()


__all__ = ['GripperOutput']
