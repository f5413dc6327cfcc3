"""QoS profiles of every topic this package publishes or subscribes, in one place.

The VLA node and the simulator bridge must agree on these (a reliable subscriber never matches
a best-effort publisher; a transient-local subscriber never matches a volatile publisher).
"""
from __future__ import annotations

from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

RELIABLE, BEST_EFFORT = ReliabilityPolicy.RELIABLE, ReliabilityPolicy.BEST_EFFORT
VOLATILE, TRANSIENT_LOCAL = DurabilityPolicy.VOLATILE, DurabilityPolicy.TRANSIENT_LOCAL


def _keep_last(depth: int, reliability, durability) -> QoSProfile:
    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=depth, reliability=reliability,
                      durability=durability)


# Camera drivers publish best effort (sensor data) or reliable; a best-effort subscription
# matches both. Depth 1: only the newest frame matters.
IMAGE_QOS = _keep_last(1, BEST_EFFORT, VOLATILE)
# A camera publisher (the simulator bridge): reliable, depth 1, so that it matches both
# best-effort (the VLA node) and reliable subscribers.
IMAGE_PUBLISHER_QOS = _keep_last(1, RELIABLE, VOLATILE)
# Latched instruction: a late-joining node still gets the current one.
INSTRUCTION_QOS = _keep_last(1, RELIABLE, TRANSIENT_LOCAL)
# A volatile publisher (plain `ros2 topic pub`) does not match a transient-local subscription,
# so a second, volatile subscription on the same topic takes those.
INSTRUCTION_VOLATILE_QOS = _keep_last(1, RELIABLE, VOLATILE)
# Reliable + volatile: matches MoveIt Servo's and forward_command_controller's SystemDefaults.
COMMAND_QOS = _keep_last(10, RELIABLE, VOLATILE)

__all__ = ['IMAGE_QOS', 'IMAGE_PUBLISHER_QOS', 'INSTRUCTION_QOS', 'INSTRUCTION_VOLATILE_QOS',
           'COMMAND_QOS']
