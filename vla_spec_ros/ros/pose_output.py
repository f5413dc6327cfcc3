"""Output adapter of `pose_targets: true` (output_adapter.py): absolute tool targets for MoveIt
Servo's pose mode and Cartesian trajectory controllers.

`prepare` reads the tool pose at the observation's time (tool_pose.py; none: the robot holds
with `no tool pose`, its commanded output cannot be computed); `publish_command` and
`publish_chunk` apply the decided deltas to it; a chunk step publishes the target kept for
that chunk's step; a hold stops ~/pose_trajectory.

What goes out (header.frame_id: the frame the tool pose is expressed in):
  pose_target      geometry_msgs/PoseStamped, one per published action (or chunk step):
                   the start pose moved as the published twist moves it over one
                   period (pose_math.apply_step, `pose_delta_frame`): the action's
                   rotation R_delta exactly, as Servo integrates the twist. Stamped
                   like the twist (command_rules.command_stamp; a chunk's step i: + i
                   control periods), so Servo's command timeout sees the same age.
                   Remap it to `<servo>/pose_target_cmds` with `servo_command_type: pose`.
  pose_trajectory  trajectory_msgs/MultiDOFJointTrajectory, a chunked model's chunk on
                   arrival: one joint named `tool_frame`, point i the absolute pose after
                   steps 0..i (transforms[0]), time_from_start (i + 1) control periods
                   (strictly increasing, the first after 0), header.stamp the chunk's
                   (command_rules.command_stamp);
                   when the robot holds after one, the stop: a one-point trajectory one
                   control period after the hold's time (a trajectory controller rejects an
                   empty trajectory, and would go on with the previous one) to the tool
                   pose measured last when it is fresh (within max_action_age), else to the
                   running trajectory's point being approached now (a stalled pose topic
                   must not send the tool back to where it was before the stall); once
                   that trajectory has ended and no fresh pose is known, nothing (the
                   controller holds at its end).

The delta is the published command's (after scaling and speed limits) times control_period,
so the limits bound pose targets as they bound the twist.
"""
from __future__ import annotations

from geometry_msgs.msg import PoseStamped

from vla_spec_ros.ros.message_time import SentTrajectory, set_duration, stamp_ns
from vla_spec_ros.ros.output_adapter import OutputAdapter
from vla_spec_ros.ros.pose_math import Pose, apply_step, integrate_steps, point_times
from vla_spec_ros.ros.qos import COMMAND_QOS
from vla_spec_ros.ros.tool_pose import ToolPoseSource

MAX_KEPT_CHUNKS = 4      # the chunks whose targets are kept: those still being executed


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
        set_duration(point.time_from_start, time_s)
        msg.points.append(point)
    return msg


class PoseTargetOutput(OutputAdapter):
    """One robot's absolute-target publishers (module docstring). `prefix`: '~/' or
    '<robot>/'; `source` is where the tool pose comes from (tool_pose.py)."""

    def __init__(self, node, prefix: str, settings, label: str, *, is_chunked: bool):
        self.node, self.label = node, label
        self.source = ToolPoseSource(node, settings, label)
        self.pose_pub = node.create_publisher(PoseStamped, prefix + 'pose_target', COMMAND_QOS)
        self.trajectory_pub = None
        self._trajectory_live = False
        self._sent: SentTrajectory | None = None        # the last pose trajectory sent
        self._chunk_targets: dict[int, tuple] = {}      # id(chunk) -> (chunk, targets)
        self._trajectory_chunk = None       # the chunk the last pose trajectory was of
        if is_chunked:
            try:
                from trajectory_msgs.msg import MultiDOFJointTrajectory
            except ImportError:
                node.get_logger().warning(f'{label}: trajectory_msgs is not importable: no '
                                          'pose_trajectory')
            else:
                self.trajectory_pub = node.create_publisher(
                    MultiDOFJointTrajectory, prefix + 'pose_trajectory', COMMAND_QOS)

    def command_publishers(self) -> list:
        return [self.pose_pub, self.trajectory_pub]

    def prepare(self, observation_s: float, settings):
        """The tool pose the image's action starts from, or (None, why the robot holds)."""
        return self.source.at(observation_s, settings.max_action_age)

    def publish_command(self, command, stamp, settings, prepared=None) -> None:
        """A single-step model's action: its target from the start pose `prepared`."""
        if prepared is None:
            return
        target = apply_step(prepared, step_delta(command, settings.control_period),
                            settings.pose_delta_frame)
        self.pose_pub.publish(pose_message(target, stamp, self.source.frame_id))

    def publish_chunk(self, chunk, commands, settings, prepared=None) -> None:
        """A chunk's absolute targets from the start pose `prepared`: kept for its steps and
        published as pose_trajectory."""
        if prepared is None:
            return
        targets = integrate_steps(
            prepared, [step_delta(c, settings.control_period) for c in commands],
            settings.pose_delta_frame)
        self._chunk_targets[id(chunk)] = (chunk, targets)
        while len(self._chunk_targets) > MAX_KEPT_CHUNKS:
            del self._chunk_targets[next(iter(self._chunk_targets))]
        if self.trajectory_pub is not None:
            self.trajectory_pub.publish(trajectory_message(
                targets, chunk.stamp, self.source.frame_id, settings.tool_frame,
                settings.control_period))
            self._trajectory_live, self._trajectory_chunk = True, chunk
            self._sent = SentTrajectory(stamp_ns(chunk.stamp) * 1e-9, settings.control_period,
                                        tuple(targets))

    def publish_step(self, chunk, index: int, command, stamp, settings) -> None:
        """Step `index` of a chunk kept by `publish_chunk`: its absolute target (that
        chunk's, whatever chunk_blend blended into the twist); and when a hold stopped the
        chunk's pose trajectory (one step refused, the chunk kept), its rest again from this
        step, on the chunk's own times (a trajectory controller would otherwise stand while
        the per-step targets and the gripper go on)."""
        kept = self._chunk_targets.get(id(chunk))
        if kept is None or kept[0] is not chunk:
            return
        self.pose_pub.publish(pose_message(kept[1][index], stamp, self.source.frame_id))
        if (self.trajectory_pub is not None and not self._trajectory_live
                and self._trajectory_chunk is chunk):
            rest = kept[1][index:]
            self.trajectory_pub.publish(trajectory_message(
                rest, stamp, self.source.frame_id, settings.tool_frame,
                settings.control_period))
            self._trajectory_live = True
            self._sent = SentTrajectory(stamp_ns(stamp) * 1e-9, settings.control_period,
                                        tuple(rest))

    def hold(self, stamp, settings) -> None:
        """Stop a trajectory controller with a one-point trajectory one period after `stamp`
        (the hold's time), to the tool pose measured last when fresh, else to the point the
        running trajectory approaches now, else nothing (module docstring). The chunks'
        targets are kept: a hold that keeps its chunk (one step refused) publishes the next
        steps' targets; the others drop the chunk from the schedule, so none of its steps
        comes again."""
        if not (self._trajectory_live and self.trajectory_pub is not None):
            return
        now_s = self.node.get_clock().now().nanoseconds * 1e-9
        pose = self.source.newest(now_s, settings.max_action_age)
        if pose is None and self._sent is not None:
            pose = self._sent.target_at(now_s)
        self._trajectory_live = False
        if pose is not None:
            self.trajectory_pub.publish(trajectory_message([pose], stamp, self.source.frame_id,
                                                           settings.tool_frame,
                                                           settings.control_period))

    def forget(self) -> None:
        """The node clock went back: the trajectory sent and the poses measured are of the
        old time line."""
        self._sent, self._trajectory_live, self._trajectory_chunk = None, False, None
        self.source.forget()

    def destroy(self) -> None:
        self.source.destroy()
        self.node.destroy_publisher(self.pose_pub)
        if self.trajectory_pub is not None:
            self.node.destroy_publisher(self.trajectory_pub)


__all__ = ['PoseTargetOutput', 'trajectory_message', 'pose_message', 'step_delta']
