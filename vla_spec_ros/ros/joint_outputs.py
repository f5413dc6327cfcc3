"""Output adapters of the joint action spaces (output_adapter.py, docs/action_spaces.md).

joint_velocity -> <prefix>joint_jog: control_msgs/JointJog for MoveIt Servo's
    `~/delta_joint_cmds` (servo_command_type joint_jog): joint_names from the parameter,
    velocities = the clamped joint velocities, no displacements, duration 0; stamped like the
    twist (the observation's stamp; a chunk's step i: + i periods). A hold is the same message
    with zero velocities, stamped now (Servo halts on it). A chunk goes out step by step on
    the control clock (Servo takes no trajectories).

joint_position -> <prefix>joint_trajectory: trajectory_msgs/JointTrajectory for ros2_control's
    JointTrajectoryController (JTC), timed by JTC's rules (joint_trajectory_message): the
    header stamp is the publish time on the node clock (non-zero, so JTC checks it, and the
    trajectory never ends in the past), point k at (k + 1) control periods (the first one
    period ahead, strictly increasing), positions only, one per joint in joint_names order.
    A single-step model: one point per action. A chunked model: on arrival, the chunk's steps
    still due (from the step whose slot holds now) as one trajectory; JTC interpolates between
    them, so the steps are not re-sent one by one.
    A speed bound (`joint_max_velocity`, optional here, needs `state_input`): each target is
    clamped to within limit × control_period of the one before it, the first of where the
    joints are (the measured positions when fresh, else the point the running trajectory
    approaches now). JTC's topic interface does not bound velocities, so without it a target
    far from the arm (the first action, a wrong unnorm_key) is reached in one period: the first
    targets sent without it are logged as a warning (again after a bound was set and removed),
    and /diagnostics says which (`joint_speed_bound`). With the bound set and neither position
    known, the robot holds (`prepare`'s reason).
    A step of a chunk held on its own (its age, Servo not ready: the chunk is kept) sends the
    hold's "stay", which replaces the chunk's trajectory at JTC: the next step that goes out
    sends the chunk's remaining steps again from there, so the arm follows the chunk as the
    gripper and the per-step topics do.
    A hold means "stay where you are": ROS 2's JTC refuses an empty trajectory, so the hold is
    a one-point trajectory one period ahead to the joint positions measured by the state input
    (`current_positions()`, when fresh). Without a fresh measured state, while the last
    trajectory sent is still running, to its point being approached now (the robot is
    between the point before it and that one, so it gets there no faster than planned; a
    chunk's last target would be several steps away, to be covered in one period); once that
    trajectory has ended, nothing: JTC holds at its end by itself, and a target re-sent then
    would pull back a robot someone else has moved since.

control_msgs is imported when the adapter is built: without it the node refuses to start and
says so (JointJog is not on PyPI; a ROS distribution's ros-<distro>-control-msgs has it).
"""
from __future__ import annotations

import threading

import numpy as np

from vla_spec_ros.ros.message_time import SentTrajectory, set_duration
from vla_spec_ros.ros.output_adapter import OutputAdapter
from vla_spec_ros.ros.qos import COMMAND_QOS

# The hold while a speed bound has no position to bound from (JointTrajectoryOutput.prepare).
REASON_JOINTS_UNKNOWN = 'joint positions unknown'
# Said once when targets go out with no speed bound (again after a bound was set and removed),
# and kept in /diagnostics: JTC's topic interface bounds nothing, so it is worth knowing.
UNBOUNDED_WARNING = ('joint_position targets go out without joint_max_velocity: the '
                     'controller reaches each one within one control_period however far it is '
                     '(set joint_max_velocity, with a state_input, to bound the speed)')


def joint_jog_type():
    """control_msgs/msg/JointJog, or ValueError saying how to get it."""
    try:
        from control_msgs.msg import JointJog
    except ImportError:
        raise ValueError('action_space: joint_velocity publishes control_msgs/JointJog and '
                         'control_msgs is not importable (install ros-<distro>-control-msgs, '
                         'or source a workspace that has it)') from None
    return JointJog


def joint_jog_message(joint_type, joint_names, velocities, stamp, frame_id: str):
    msg = joint_type()
    msg.header.stamp = stamp
    msg.header.frame_id = frame_id
    msg.joint_names = list(joint_names)
    msg.velocities = [float(v) for v in velocities]
    msg.duration = 0.0
    return msg


def joint_trajectory_message(joint_names, targets, stamp, period_s: float):
    """trajectory_msgs/JointTrajectory: point k = targets[k] (one position per joint) at
    (k + 1) * period_s after `stamp` (module docstring)."""
    from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

    msg = JointTrajectory()
    msg.header.stamp = stamp
    msg.joint_names = list(joint_names)
    for k, target in enumerate(targets):
        point = JointTrajectoryPoint(positions=[float(v) for v in target])
        set_duration(point.time_from_start, (k + 1) * period_s)
        msg.points.append(point)
    return msg


def bounded_targets(targets, start, settings) -> list:
    """`targets` with each one within joint_max_velocity × control_period of the one before
    it, the first of `start` (where the joints are); as they are without a bound or start."""
    if not settings.joint_max_velocity or start is None:
        return [tuple(t) for t in targets]
    step = np.asarray(settings.joint_max_velocity, dtype=np.float64) * settings.control_period
    previous, out = np.asarray(start, dtype=np.float64), []
    for target in targets:
        previous = np.clip(np.asarray(target, dtype=np.float64), previous - step,
                           previous + step)
        out.append(tuple(float(v) for v in previous))
    return out


class JointJogOutput(OutputAdapter):
    def __init__(self, node, prefix: str):
        self.node = node
        self._type = joint_jog_type()
        self.pub = node.create_publisher(self._type, prefix + 'joint_jog', COMMAND_QOS)

    def command_publishers(self) -> list:
        return [self.pub]

    def publish_command(self, command, stamp, settings, prepared=None) -> None:
        self.pub.publish(joint_jog_message(self._type, settings.joint_names, command.joints,
                                           stamp, settings.frame_id))

    def hold(self, stamp, settings) -> None:
        zeros = [0.0] * len(settings.joint_names)
        self.pub.publish(joint_jog_message(self._type, settings.joint_names, zeros, stamp,
                                           settings.frame_id))

    def destroy(self) -> None:
        self.node.destroy_publisher(self.pub)


class JointTrajectoryOutput(OutputAdapter):
    """`current_positions(settings)`: the measured joint positions in joint_names order, or
    None when unknown or stale (state_input.py)."""

    def __init__(self, node, prefix: str, current_positions):
        from trajectory_msgs.msg import JointTrajectory

        self.node = node
        self._current_positions = current_positions
        self.pub = node.create_publisher(JointTrajectory, prefix + 'joint_trajectory',
                                         COMMAND_QOS)
        self._lock = threading.Lock()
        self._sent: SentTrajectory | None = None     # the last trajectory sent
        # The chunk last sent whole and its K targets, to send its rest again after a hold.
        self._chunk = None
        self._chunk_targets: list = []
        self._is_bounded: bool | None = None         # of the last targets sent (not holds)

    def command_publishers(self) -> list:
        return [self.pub]

    def add_to_status(self, status) -> None:
        from diagnostic_msgs.msg import KeyValue
        with self._lock:
            is_bounded = self._is_bounded
        if is_bounded is not None:
            status.values.append(KeyValue(
                key='joint_speed_bound',
                value='joint_max_velocity' if is_bounded else 'none (joint_max_velocity unset)'))

    def _note_speed_bound(self, settings) -> None:
        """(Targets, not a hold, about to go out.) Warn on the first unbounded targets."""
        is_bounded = bool(settings.joint_max_velocity)
        with self._lock:
            was_bounded, self._is_bounded = self._is_bounded, is_bounded
        if not is_bounded and was_bounded is not False:
            self.node.get_logger().warning(UNBOUNDED_WARNING)

    def _where_joints_are(self, settings) -> tuple | None:
        """The measured positions when fresh, else the point the running trajectory
        approaches now, else None."""
        measured = self._current_positions(settings)
        return measured if measured is not None else self._target_now()

    def prepare(self, observation_s: float, settings):
        """With a speed bound: where the joints are (the first target's bound), or the hold's
        reason when nothing says."""
        if not settings.joint_max_velocity:
            return None, None
        start = self._where_joints_are(settings)
        if start is None:
            return None, (f'{REASON_JOINTS_UNKNOWN}: joint_max_velocity bounds each target\'s '
                          'step from where the joints are, and there is neither a fresh '
                          'measured joint state nor a running trajectory')
        return start, None

    def _send(self, targets, settings, *, is_hold: bool = False) -> None:
        """Publish `targets` from now; it becomes the running trajectory, except that a
        hold while a hold's trajectory runs keeps that one's window (repeated holds do not
        stretch it: once it ends, the robot is left alone)."""
        if not is_hold:
            self._note_speed_bound(settings)
        now = self.node.get_clock().now()
        now_s = now.nanoseconds * 1e-9
        with self._lock:
            sent = self._sent
            if not (is_hold and sent is not None and sent.is_hold
                    and sent.target_at(now_s) is not None):
                self._sent = SentTrajectory(now_s, settings.control_period,
                                            tuple(tuple(t) for t in targets), is_hold)
        self.pub.publish(joint_trajectory_message(settings.joint_names, targets, now.to_msg(),
                                                  settings.control_period))

    def forget(self) -> None:
        with self._lock:
            self._sent, self._chunk, self._chunk_targets = None, None, []

    def _target_now(self) -> tuple | None:
        """The point the last trajectory sent is approaching now, or None once it has ended
        (or before any, or when it was sent on a time line the clock has since left)."""
        with self._lock:
            sent = self._sent
        return None if sent is None else sent.target_at(
            self.node.get_clock().now().nanoseconds * 1e-9)

    def publish_command(self, command, stamp, settings, prepared=None) -> None:
        self._send(bounded_targets([command.joints], prepared, settings), settings)

    def publish_chunk(self, chunk, commands, settings, prepared=None) -> None:
        first = max(0, chunk.step_at(self.node.get_clock().now().nanoseconds * 1e-9))
        with self._lock:
            self._chunk, self._chunk_targets = chunk, [c.joints for c in commands]
        targets = [c.joints for c in commands[first:]]
        if targets:
            self._send(bounded_targets(targets, prepared, settings), settings)

    def publish_step(self, chunk, index: int, command, stamp, settings) -> None:
        """Nothing while the chunk's trajectory runs (JTC executes it); after a hold that
        replaced it, the chunk's rest from this step (its due command first)."""
        with self._lock:
            sent, targets = self._sent, self._chunk_targets
            interrupted = chunk is self._chunk and sent is not None and sent.is_hold
        if not interrupted:
            return
        start = self._where_joints_are(settings)
        if settings.joint_max_velocity and start is None:
            return                  # nothing says where the joints are: stay held
        rest = [command.joints] + list(targets[index + 1:])
        self._send(bounded_targets(rest, start, settings), settings)

    def hold(self, stamp, settings) -> None:
        """Stay where you are (module docstring): to the measured positions, else to the
        point the running trajectory approaches now, else nothing."""
        target = self._current_positions(settings)
        if target is None:
            target = self._target_now()
        if target is not None:
            self._send([target], settings, is_hold=True)

    def destroy(self) -> None:
        self.node.destroy_publisher(self.pub)


__all__ = ['REASON_JOINTS_UNKNOWN', 'UNBOUNDED_WARNING', 'JointJogOutput', 'JointTrajectoryOutput',
           'bounded_targets', 'joint_jog_message',
           'joint_trajectory_message', 'joint_jog_type']
