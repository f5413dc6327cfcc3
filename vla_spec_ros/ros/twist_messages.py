"""Message builders of the twist output (twist_output.py): TwistStamped and the velocity
trajectory of a chunk.

Plain functions from already-decided commands (command_rules.Command) to ROS messages; no
state, no safety decision (that is safety_gate.py's and command_rules.py's). The joint-space
builders live beside their adapters (joint_outputs.py), the absolute-pose ones in
pose_output.py.
"""
from __future__ import annotations

from geometry_msgs.msg import Twist, TwistStamped

from vla_spec_ros.ros.message_time import set_duration

try:  # ros-kilted-trajectory-msgs on PyPI; a chunked model's ~/velocity_trajectory needs it
    from trajectory_msgs.msg import MultiDOFJointTrajectory, MultiDOFJointTrajectoryPoint
except ImportError:
    MultiDOFJointTrajectory = MultiDOFJointTrajectoryPoint = None


def twist_message(linear, angular, stamp, frame_id: str) -> TwistStamped:
    msg = TwistStamped()
    msg.header.stamp = stamp
    msg.header.frame_id = frame_id
    msg.twist.linear.x, msg.twist.linear.y, msg.twist.linear.z = linear
    msg.twist.angular.x, msg.twist.angular.y, msg.twist.angular.z = angular
    return msg


def trajectory_message(commands, stamp, frame_id: str, period_s: float):
    """A chunk as trajectory_msgs/MultiDOFJointTrajectory: one joint named `frame_id`, one
    point per step with the step's (scaled, limited) twist as its velocity and
    time_from_start = i * period_s; no transforms (the node does not know the pose)."""
    msg = MultiDOFJointTrajectory()
    msg.header.stamp = stamp
    msg.header.frame_id = frame_id
    msg.joint_names = [frame_id]
    for i, command in enumerate(commands):
        twist = Twist()
        twist.linear.x, twist.linear.y, twist.linear.z = command.linear
        twist.angular.x, twist.angular.y, twist.angular.z = command.angular
        point = MultiDOFJointTrajectoryPoint(velocities=[twist])
        set_duration(point.time_from_start, i * period_s)
        msg.points.append(point)
    return msg


def stop_trajectory_message(stamp, frame_id: str, period_s: float):
    """The velocity trajectory's stop: one point, zero velocity, one period after `stamp`
    (the hold's time). Not the empty trajectory: ROS 2's JointTrajectoryController, whose
    checks the trajectory controllers share, rejects a trajectory without points ("Empty
    trajectory received.") and would go on executing the previous one."""
    msg = MultiDOFJointTrajectory()
    msg.header.stamp = stamp
    msg.header.frame_id = frame_id
    msg.joint_names = [frame_id]
    point = MultiDOFJointTrajectoryPoint(velocities=[Twist()])
    set_duration(point.time_from_start, period_s)
    msg.points.append(point)
    return msg


__all__ = ['twist_message', 'trajectory_message', 'stop_trajectory_message',
           'MultiDOFJointTrajectory']
