"""Where one robot's tool is: the tool pose read at an observation's time, for the absolute
targets of `pose_targets: true` (pose_output.py).

Two sources: a geometry_msgs/PoseStamped topic of the robot driver (`tool_pose_topic`, the tool
in the robot base frame), or, with no topic, TF's `frame_id` -> `tool_frame` transform (only
where tf2_ros is installed: a ROS distribution; without it the node refuses to start with the
reason). The pose read closest in time to the image (within `max_action_age`) is the pose the
action's delta starts from; none there is the hold reason `no tool pose`. A topic's pose must
be in `frame_id`, the frame the action's deltas are applied in: a pose stamped in another frame
(a driver publishing in `world` while the deltas are in `base_link`) is ignored, logged, and
named in the hold reason, since deltas applied along another frame's axes move the tool in
directions the policy never chose (before, the node adopted the message's frame silently).
"""
from __future__ import annotations

import threading

from geometry_msgs.msg import PoseStamped

from vla_spec_ros.ros.message_time import checked_header_seconds
from vla_spec_ros.ros.pose_math import Pose, PoseHistory
from vla_spec_ros.ros.qos import IMAGE_QOS

REASON_NO_TOOL_POSE = 'no tool pose'
LOG_THROTTLE_S = 2.0


def pose_from_message(msg) -> Pose:
    p, q = msg.position, msg.orientation
    return Pose((p.x, p.y, p.z), (q.x, q.y, q.z, q.w))


class ToolPoseSource:
    """The tool poses of one robot, from a PoseStamped topic or from TF."""

    def __init__(self, node, settings, label: str):
        self.node, self.label = node, label
        self.history = PoseHistory()
        self.frame_id = settings.frame_id       # the frame poses are expressed in
        self._other_frame: str | None = None     # the frame of poses ignored (docstring)
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
            stamp_s = checked_header_seconds(msg)
            pose = pose_from_message(msg.pose)
        except ValueError as exc:
            self.node.get_logger().warning(f'{self.label}: tool pose ignored: {exc}',
                                           throttle_duration_sec=LOG_THROTTLE_S)
            return
        if msg.header.frame_id and msg.header.frame_id != self.frame_id:
            with self._lock:
                self._other_frame = msg.header.frame_id
            self.node.get_logger().warning(
                f'{self.label}: tool pose ignored: in frame {msg.header.frame_id!r}, but the '
                f'action\'s deltas are in frame_id {self.frame_id!r} (publish the tool pose '
                'in that frame, or set frame_id to the pose\'s frame)',
                throttle_duration_sec=LOG_THROTTLE_S)
            return
        if stamp_s == 0.0:         # unstamped: its arrival
            stamp_s = self.node.get_clock().now().nanoseconds * 1e-9
        with self._lock:
            self._other_frame = None
            self.history.add(stamp_s, pose)

    def at(self, stamp_s: float, max_gap_s: float) -> tuple[Pose | None, str | None]:
        """(the tool pose at the image time, None) or (None, the reason to hold)."""
        if self._tf_buffer is not None:
            pose, _, why = self._lookup_tf(stamp_s)
            return pose, why
        with self._lock:
            pose, why = self.history.at(stamp_s, max_gap_s)
            other = self._other_frame
        if pose is None and other is not None:
            why = f'the tool poses arriving are in frame {other!r}, not frame_id {self.frame_id!r}'
        return pose, None if pose is not None else f'{REASON_NO_TOOL_POSE}: {why}'

    def newest(self, now_s: float, max_age_s: float) -> Pose | None:
        """The tool pose measured last, when it is within `max_age_s` of `now_s` (node clock
        seconds; a stop's target: an older one is not where the tool is), else None.
        TF's latest transform counts as fresh when it is static (stamp zero)."""
        if self._tf_buffer is not None:
            pose, stamp_s, _ = self._lookup_tf(None)         # TF's latest transform
            if pose is None or (stamp_s > 0.0 and abs(now_s - stamp_s) > max_age_s):
                return None
            return pose
        with self._lock:
            newest = self.history.newest
        if newest is None or abs(now_s - newest[0]) > max_age_s:
            return None             # old, or stamped on another (or a former) time line
        return newest[1]

    def forget(self) -> None:
        """The node clock went back: the poses kept are of the old time line (TF keeps its
        own buffer, which tf2 clears on a jump back itself)."""
        with self._lock:
            self.history.clear()

    def _lookup_tf(self, stamp_s: float | None):
        """(the tool pose, its transform's stamp in seconds, None) at `stamp_s` (None: TF's
        latest), or (None, nan, the reason to hold)."""
        from rclpy.time import Time

        when = Time() if stamp_s is None else Time(nanoseconds=round(stamp_s * 1e9))
        try:
            transform = self._tf_buffer.lookup_transform(
                self.frame_id, self._tool_frame, when)
        except Exception as exc:       # tf2's LookupException, ExtrapolationException, ...
            return None, float('nan'), (f'{REASON_NO_TOOL_POSE}: TF {self.frame_id} -> '
                                        f'{self._tool_frame}: {exc}')
        t, r = transform.transform.translation, transform.transform.rotation
        stamp = transform.header.stamp
        return (Pose((t.x, t.y, t.z), (r.x, r.y, r.z, r.w)),
                stamp.sec + 1e-9 * stamp.nanosec, None)

    def destroy(self) -> None:
        if self._subscription is not None:
            self.node.destroy_subscription(self._subscription)


__all__ = ['ToolPoseSource', 'REASON_NO_TOOL_POSE', 'pose_from_message']
