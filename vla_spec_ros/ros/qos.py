"""QoS profiles of every topic this package publishes or subscribes, in one place.

The VLA node and the simulator bridge must agree on these (a reliable subscriber never matches
a best-effort publisher; a transient-local subscriber never matches a volatile publisher).
"""
from __future__ import annotations

from rclpy.event_handler import SubscriptionEventCallbacks
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

RELIABLE, BEST_EFFORT = ReliabilityPolicy.RELIABLE, ReliabilityPolicy.BEST_EFFORT
VOLATILE, TRANSIENT_LOCAL = DurabilityPolicy.VOLATILE, DurabilityPolicy.TRANSIENT_LOCAL


def _keep_last(depth: int, reliability, durability) -> QoSProfile:
    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=depth, reliability=reliability,
                      durability=durability)


# Camera drivers publish best effort (sensor data) or reliable; a best-effort subscription
# matches both. Depth 1: only the newest frame matters.
IMAGE_QOS = _keep_last(1, BEST_EFFORT, VOLATILE)
# The robot state (JointState, Float64MultiArray): best effort (matches both), and deep. Unlike
# an image, every message counts: /joint_states is often shared by several publishers (an arm's
# broadcaster at 500 Hz, a gripper driver at 10 Hz), each carrying some of the joints, and with
# depth 1 a gripper message was overwritten by the next arm message whenever the executor was
# more than one arm period late, leaving the gripper's state stale although it was sent on time.
STATE_QOS = _keep_last(100, BEST_EFFORT, VOLATILE)
# A camera publisher (the simulator bridge): reliable, depth 1, so that it matches both
# best-effort (the VLA node) and reliable subscribers.
IMAGE_PUBLISHER_QOS = _keep_last(1, RELIABLE, VOLATILE)
# The instruction topic: reliable, depth 1, subscribed twice. The transient-local subscription
# takes a latched publisher (a task manager, the simulator bridge), whose instruction reaches
# a node that starts after it was published; a volatile publisher (`ros2 topic pub`) never
# matches it, so a volatile subscription on the same topic takes those.
INSTRUCTION_QOS = _keep_last(1, RELIABLE, TRANSIENT_LOCAL)
INSTRUCTION_VOLATILE_QOS = _keep_last(1, RELIABLE, VOLATILE)


def _ignore_incompatible(event) -> None:
    pass


def instruction_subscriptions() -> list:
    """[(QoS, SubscriptionEventCallbacks)] of the instruction topic's two subscriptions.

    rclpy's default handler warns "offering incompatible QoS ... DURABILITY" whenever a
    volatile publisher meets the transient-local subscription, though the volatile one
    receives it. That subscription therefore reports no incompatibility: a publisher it cannot
    match is either volatile (received by the other) or also incompatible with the volatile
    subscription (best effort), whose default handler warns about it."""
    return [(INSTRUCTION_QOS, SubscriptionEventCallbacks(incompatible_qos=_ignore_incompatible)),
            (INSTRUCTION_VOLATILE_QOS, SubscriptionEventCallbacks())]


# Reliable + volatile: matches MoveIt Servo's and forward_command_controller's SystemDefaults.
COMMAND_QOS = _keep_last(10, RELIABLE, VOLATILE)

__all__ = ['IMAGE_QOS', 'IMAGE_PUBLISHER_QOS', 'STATE_QOS', 'INSTRUCTION_QOS',
           'INSTRUCTION_VOLATILE_QOS', 'COMMAND_QOS', 'instruction_subscriptions']
