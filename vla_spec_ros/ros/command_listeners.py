"""Whether anything receives a robot's motion commands, for /diagnostics.

A command published to nobody is silent: a controller that is not running, a remap to the
wrong topic, or a subscriber whose QoS does not match (a reliable + transient-local one never
matches the node's volatile publishers) leaves the robot still while the node reports
"publishing actions". rclpy counts only *matched* subscriptions, so all three read as zero.

`add_listener_status` reports `command_subscribers` (`none` or `yes`, whatever the robot's
state: a disabled or inactive robot is exactly when an integrator checks the wiring) and
raises the robot's status to WARN, naming the topics, when an enabled robot has no subscriber
on any of its motion command topics (its outputs'
`command_publishers()`: the twist, JointJog, joint or pose trajectory, pose target). One topic
with a subscriber is enough: the others may be unused on purpose (a pose-target set-up does
not read the twist). The gripper topic is not a motion command and is not counted.
"""
from __future__ import annotations

from vla_spec_ros.ros.diagnostics import WARN


def unheard_topics(publishers) -> list[str] | None:
    """The topics of `publishers` when none has a matched subscriber, else None (also None
    without publishers)."""
    publishers = [p for p in publishers if p is not None]
    if not publishers or any(p.get_subscription_count() > 0 for p in publishers):
        return None
    return [p.topic_name for p in publishers]


def add_listener_status(status, publishers, *, is_enabled: bool) -> None:
    """`command_subscribers` on `status` (diagnostic_msgs/DiagnosticStatus), and WARN when an
    enabled robot's commands reach no one (module docstring); a worse level of the robot's
    own stands, its message first."""
    from diagnostic_msgs.msg import KeyValue

    topics = unheard_topics(publishers)
    status.values.append(KeyValue(key='command_subscribers',
                                  value='none' if topics else 'yes'))
    if not topics or not is_enabled:    # a robot that does not act: the value says it, no WARN
        return
    text = (f'no subscriber on {", ".join(topics)}: nothing receives the commands '
            '(controller not running, a remap, or a QoS mismatch)')
    if status.level[0] < WARN:
        status.level, status.message = bytes([WARN]), text
    else:                       # the robot's own reason first, this one after it
        status.message = f'{status.message}; {text}'


__all__ = ['add_listener_status', 'unheard_topics']
