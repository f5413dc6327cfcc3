"""Absolute tool targets for one robot: MoveIt Servo's pose mode and Cartesian trajectory
controllers (the output adapter of `pose_targets: true`).

Where the tool is: a geometry_msgs/PoseStamped topic of the robot driver (`tool_pose_topic`,
the tool in the robot base frame), or, with no topic, TF's `frame_id` -> `tool_frame`
transform (only where tf2_ros is installed: a ROS distribution; without it the node refuses
to start with the reason). The pose read closest in time to the image (within
`max_action_age`) is the pose the action's delta starts from.

What goes out (header.frame_id: the frame the tool pose is expressed in):
  pose_target      geometry_msgs/PoseStamped, one per published action (or chunk step):
                   the start pose moved as the published twist moves it over one
                   period (pose_math.apply_step, `pose_delta_frame`): the action's
                   rotation R_delta exactly, as Servo integrates the twist. Stamped
                   like the twist (the image's stamp; a chunk's step i: + i control
                   periods), so Servo's command timeout sees the same age.
                   Remap it to `<servo>/pose_target_cmds` with `servo_command_type: pose`.
  pose_trajectory  trajectory_msgs/MultiDOFJointTrajectory, a chunked model's chunk on
                   arrival: one joint named `tool_frame`, point i the absolute pose after
                   steps 0..i (transforms[0]), time_from_start (i + 1) control periods
                   (strictly increasing, the first after 0), header.stamp the image's time;
                   when the robot holds after one, the stop: a one-point trajectory to the
                   tool pose measured last, one control period after the hold's time (a
                   trajectory controller rejects an empty trajectory, and would go on with
                   the previous one).

The delta is the published command's (after scaling and speed limits) times control_period,
so the limits bound pose targets as they bound the twist. A robot whose tool pose is unknown or
too old holds (zero twist, reason `no tool pose`): its commanded output cannot be computed.
"""
from __future__ import annotations

import threading

from geometry_msgs.msg import PoseStamped

from vla_spec_ros.ros.pose_math import (Pose, PoseHistory, apply_step, integrate_steps,
                                        point_times)
from vla_spec_ros.ros.qos import COMMAND_QOS, IMAGE_QOS

REASON_NO_TOOL_POSE = 'no tool pose'
LOG_THROTTLE_S = 2.0


def pose_from_message(msg) -> Pose:
    p, q = msg.position, msg.orientation
    return Pose((p.x, p.y, p.z), (q.x, q.y, q.z, q.w))


def pose_message(pose: Pose, stamp, frame_id: str) -> PoseStamped:
    msg = PoseStamped()
    msg.header.stamp = stamp
    msg.header.frame_id = frame_id
    fill_pose(msg.pose, pose)
    return msg


def fill_pose(target, pose: Pose) -> None:
    """Writes `pose` into a geometry_msgs Pose (or the translation/rotation of a Transform)."""
    is_pose = hasattr(target, 'position')
    position = target.position if is_pose else target.translation
    orientation = target.orientation if is_pose else target.rotation
    position.x, position.y, position.z = pose.position
    orientation.x, orientation.y, orientation.z, orientation.w = pose.orientation


def step_delta(command, control_period: float) -> list:
    """The (6,) motion of one published command over one period: its velocities times the
    period (translation, then a rotation vector: pose_math.apply_step)."""
    return [v * control_period for v in tuple(command.linear) + tuple(command.angular)]


def trajectory_message(targets, stamp, frame_id: str, joint_name: str, period_s: float):
    """Absolute targets as trajectory_msgs/MultiDOFJointTrajectory (module docstring)."""
    from geometry_msgs.msg import Transform
    from trajectory_msgs.msg import MultiDOFJointTrajectory, MultiDOFJointTrajectoryPoint

    msg = MultiDOFJointTrajectory()
    msg.header.stamp = stamp
    msg.header.frame_id = frame_id
    msg.joint_names = [joint_name]
    for pose, time_s in zip(targets, point_times(len(targets), period_s)):
        transform = Transform()
        fill_pose(transform, pose)
        point = MultiDOFJointTrajectoryPoint(transforms=[transform])
        nanoseconds = round(time_s * 1e9)
        point.time_from_start.sec = nanoseconds // 1_000_000_000
        point.time_from_start.nanosec = nanoseconds % 1_000_000_000
        msg.points.append(point)
    return msg


class ToolPoseSource:
    """The tool poses of one robot, from a PoseStamped topic or from TF."""

    def __init__(self, node, settings, label: str):
        self.node, self.label = node, label
        self.history = PoseHistory()
        self.frame_id = settings.frame_id       # the frame poses are expressed in
        self._lock = threading.Lock()
        self._subscription = self._tf_buffer = self._tf_listener = None
        if settings.tool_pose_topic:
            self._subscription = node.create_subscription(
                PoseStamped, settings.tool_pose_topic, self._on_pose, IMAGE_QOS)
            return
        try:
            import tf2_ros
        except ImportError:
            raise ValueError('tool_pose_topic: empty and tf2_ros is not installed; pose '
                             'targets need the tool pose from a topic (the robot driver\'s '
                             'PoseStamped) or from TF (a ROS distribution)') from None
        self._tf_buffer = tf2_ros.Buffer()
        self._tf_listener = tf2_ros.TransformListener(self._tf_buffer, node)
        self._tool_frame = settings.tool_frame

    def _on_pose(self, msg) -> None:
        try:
            pose = pose_from_message(msg.pose)
        except ValueError as exc:
            self.node.get_logger().warning(f'{self.label}: tool pose ignored: {exc}',
                                           throttle_duration_sec=LOG_THROTTLE_S)
            return
        stamp_s = msg.header.stamp.sec + 1e-9 * msg.header.stamp.nanosec
        if stamp_s <= 0.0:
            stamp_s = self.node.get_clock().now().nanoseconds * 1e-9
        with self._lock:
            if msg.header.frame_id:
                self.frame_id = msg.header.frame_id
            self.history.add(stamp_s, pose)

    def at(self, stamp_s: float, max_gap_s: float) -> tuple[Pose | None, str | None]:
        """(the tool pose at the image time, None) or (None, the reason to hold)."""
        if self._tf_buffer is not None:
            return self._lookup_tf(stamp_s, max_gap_s)
        with self._lock:
            pose, why = self.history.at(stamp_s, max_gap_s)
        return pose, None if pose is not None else f'{REASON_NO_TOOL_POSE}: {why}'

    def newest(self) -> Pose | None:
        """The tool pose measured last, however old (a stop's target), or None."""
        if self._tf_buffer is not None:
            return self._lookup_tf(None, 0.0)[0]          # TF's latest transform
        with self._lock:
            newest = self.history.newest
        return newest[1] if newest is not None else None

    def _lookup_tf(self, stamp_s: float | None, max_gap_s: float):
        from rclpy.time import Time

        when = Time() if stamp_s is None else Time(nanoseconds=round(stamp_s * 1e9))
        try:
            transform = self._tf_buffer.lookup_transform(
                self.frame_id, self._tool_frame, when)
        except Exception as exc:       # tf2's LookupException, ExtrapolationException, ...
            return None, f'{REASON_NO_TOOL_POSE}: TF {self.frame_id} -> {self._tool_frame}: {exc}'
        t, r = transform.transform.translation, transform.transform.rotation
        return Pose((t.x, t.y, t.z), (r.x, r.y, r.z, r.w)), None

    def destroy(self) -> None:
        if self._subscription is not None:
            self.node.destroy_subscription(self._subscription)


class PoseTargetOutput:
    """One robot's absolute-target publishers (module docstring). `prefix`: '~/' or
    '<robot>/'."""

    def __init__(self, node, prefix: str, settings, label: str, *, is_chunked: bool):
        self.node, self.label = node, label
        self.source = ToolPoseSource(node, settings, label)
        self.pose_pub = node.create_publisher(PoseStamped, prefix + 'pose_target', COMMAND_QOS)
        self.trajectory_pub = None
        self._trajectory_live = False
        self._chunk_targets: dict[int, tuple] = {}      # id(chunk) -> (chunk, targets)
        if is_chunked:
            try:
                from trajectory_msgs.msg import MultiDOFJointTrajectory
            except ImportError:
                node.get_logger().warning(f'{label}: trajectory_msgs is not importable: no '
                                          'pose_trajectory')
            else:
                self.trajectory_pub = node.create_publisher(
                    MultiDOFJointTrajectory, prefix + 'pose_trajectory', COMMAND_QOS)

    def start_pose(self, stamp_s: float, settings) -> tuple[Pose | None, str | None]:
        """The tool pose the image's action starts from, or (None, why the robot holds)."""
        return self.source.at(stamp_s, settings.max_action_age)

    def publish_action(self, start: Pose, command, stamp, settings) -> Pose:
        """A single-step model's action: its target, published; returned."""
        target = apply_step(start, step_delta(command, settings.control_period),
                            settings.pose_delta_frame)
        self.pose_pub.publish(pose_message(target, stamp, self.source.frame_id))
        return target

    def add_chunk(self, chunk, start: Pose, commands, stamp, settings) -> list:
        """A chunk's absolute targets: kept for its steps and published as pose_trajectory."""
        targets = integrate_steps(
            start, [step_delta(c, settings.control_period) for c in commands],
            settings.pose_delta_frame)
        self._chunk_targets[id(chunk)] = (chunk, targets)
        while len(self._chunk_targets) > 4:                # the chunks still being executed
            del self._chunk_targets[next(iter(self._chunk_targets))]
        if self.trajectory_pub is not None:
            self.trajectory_pub.publish(trajectory_message(
                targets, stamp, self.source.frame_id, settings.tool_frame,
                settings.control_period))
            self._trajectory_live = True
        return targets

    def publish_step(self, chunk, index: int, stamp) -> None:
        """Step `index` of a chunk kept by `add_chunk`: its absolute target (that chunk's,
        whatever chunk_blend blended into the twist)."""
        kept = self._chunk_targets.get(id(chunk))
        if kept is not None and kept[0] is chunk:
            self.pose_pub.publish(pose_message(kept[1][index], stamp, self.source.frame_id))

    def stop(self, stamp, settings) -> None:
        """A hold: stop a trajectory controller with a one-point trajectory to the tool pose
        measured last, one period after `stamp` (the hold's time); with no pose ever measured
        (no trajectory can have been sent then), nothing. The chunks' targets are kept: a
        hold that keeps its chunk (one step refused) publishes the next steps' targets; the
        others drop the chunk from the schedule, so none of its steps comes again."""
        if self._trajectory_live and self.trajectory_pub is not None:
            pose = self.source.newest()
            if pose is None:
                return
            self._trajectory_live = False
            self.trajectory_pub.publish(trajectory_message([pose], stamp, self.source.frame_id,
                                                           settings.tool_frame,
                                                           settings.control_period))

    def destroy(self) -> None:
        self.source.destroy()
        self.node.destroy_publisher(self.pose_pub)
        if self.trajectory_pub is not None:
            self.node.destroy_publisher(self.trajectory_pub)


__all__ = ['PoseTargetOutput', 'ToolPoseSource', 'REASON_NO_TOOL_POSE', 'trajectory_message',
           'pose_message', 'step_delta']
