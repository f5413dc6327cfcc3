"""Output adapter of the raw action, every action space's (output_adapter.py).

  <prefix>action    std_msgs/Float64MultiArray: the raw un-normalised action of every
                    published command (or chunk step, blended with chunk_blend ensemble),
                    before the action space's scaling and limits. Nothing on a hold.
"""
from __future__ import annotations

from std_msgs.msg import Float64MultiArray

from vla_spec_ros.ros.output_adapter import OutputAdapter
from vla_spec_ros.ros.qos import COMMAND_QOS


class RawActionOutput(OutputAdapter):
    def __init__(self, node, prefix: str):
        self.node = node
        self.action_pub = node.create_publisher(Float64MultiArray, prefix + 'action',
                                                COMMAND_QOS)

    def publish_command(self, command, stamp, settings, prepared=None) -> None:
        self.action_pub.publish(Float64MultiArray(data=list(command.action)))

    def destroy(self) -> None:
        self.node.destroy_publisher(self.action_pub)


__all__ = ['RawActionOutput']
