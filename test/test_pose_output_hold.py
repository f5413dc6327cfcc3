"""The Cartesian trajectory stop of pose_output.py (PoseTargetOutput.hold) on a fake node clock:
to the tool pose measured last only while it is fresh; with the pose topic stalled, to the
point the running pose trajectory approaches now (not back to where the tool was before the
stall); once that trajectory has ended, nothing. DDS tests of the whole path:
test_pose_targets_node.py."""
import dataclasses
import importlib.util
from types import SimpleNamespace

import pytest

from fake_node import RecordingNode

HAS_MSGS = all(importlib.util.find_spec(m) is not None
               for m in ('geometry_msgs', 'trajectory_msgs', 'rclpy'))
pytestmark = pytest.mark.skipif(not HAS_MSGS,
                                reason='needs rclpy, geometry_msgs and trajectory_msgs')

P, K = 0.2, 4


def _trajectories(node):
    return [m for topic, m in node.published if topic.endswith('pose_trajectory')]


def _settings(**changes):
    from vla_spec_ros.ros import params
    return dataclasses.replace(params.default_node_settings(), tool_pose_topic='/tool_pose',
                               pose_targets=True, control_period=P, max_action_age=0.5,
                               max_linear_speed=10.0, **changes)


def _give_pose(node, x, at_s):
    from geometry_msgs.msg import PoseStamped
    from vla_spec_ros.ros.message_time import stamp_at
    from builtin_interfaces.msg import Time

    msg = PoseStamped()
    msg.header.stamp = stamp_at(Time(), at_s)
    msg.header.frame_id = 'base_link'
    msg.pose.position.x, msg.pose.orientation.w = x, 1.0
    node.on('/tool_pose')(msg)


def _output_with_a_running_chunk():
    """A PoseTargetOutput that sent a 4-step chunk (+0.1 m in x per step) from x = 0 at
    t = 100 s, with that pose measured at 100 s."""
    from builtin_interfaces.msg import Time
    from vla_spec_ros.ros.message_time import stamp_at
    from vla_spec_ros.ros.pose_output import PoseTargetOutput

    settings = _settings()
    node = RecordingNode(100.0)
    output = PoseTargetOutput(node, '~/', settings, 'robot', is_chunked=True)
    _give_pose(node, 0.0, 100.0)
    prepared, why = output.prepare(100.0, settings)
    assert why is None
    commands = [SimpleNamespace(linear=(0.1 / P, 0.0, 0.0), angular=(0.0, 0.0, 0.0))] * K
    chunk = SimpleNamespace(stamp=stamp_at(Time(), 100.0))
    output.publish_chunk(chunk, commands, settings, prepared)
    assert len(_trajectories(node)) == 1
    return node, output, settings


def _stop_x(node):
    (point,) = _trajectories(node)[-1].points
    return point.transforms[0].translation.x


def test_the_stop_goes_to_the_tool_pose_measured_last_while_it_is_fresh():
    node, output, settings = _output_with_a_running_chunk()
    _give_pose(node, 0.15, 100.3)
    node.clock.now_s = 100.35
    output.hold(node.clock.now().to_msg(), settings)
    assert len(_trajectories(node)) == 2 and _stop_x(node) == pytest.approx(0.15)


def test_with_the_pose_topic_stalled_the_stop_is_the_point_due_not_the_old_pose():
    """The pose stopped at 100 s (x = 0); at 100.7 s (older than max_action_age 0.5) the
    trajectory is in its step 3 (point 3: x = 0.4): the stop goes there, not back to x = 0
    in one period."""
    node, output, settings = _output_with_a_running_chunk()
    node.clock.now_s = 100.0 + 3.5 * P
    output.hold(node.clock.now().to_msg(), settings)
    assert len(_trajectories(node)) == 2 and _stop_x(node) == pytest.approx(0.4)


def test_after_the_trajectory_ended_a_stale_pose_sends_nothing():
    node, output, settings = _output_with_a_running_chunk()
    node.clock.now_s = 100.0 + K * P + 0.5          # ended, and the pose is 1.3 s old
    output.hold(node.clock.now().to_msg(), settings)
    assert len(_trajectories(node)) == 1


def test_after_a_clock_jump_back_no_target_of_the_old_time_line_is_a_stop():
    """The trajectory sent at 100 s and the pose measured then are in the future of a clock
    that went back to 5 s (a simulator reset): neither is where the tool is; `forget` (the
    channel's, on the jump) drops both."""
    node, output, settings = _output_with_a_running_chunk()
    node.clock.now_s = 5.0
    output.hold(node.clock.now().to_msg(), settings)
    assert len(_trajectories(node)) == 1
    node, output, settings = _output_with_a_running_chunk()
    output.forget()
    node.clock.now_s = 100.1
    output.hold(node.clock.now().to_msg(), settings)
    assert len(_trajectories(node)) == 1


def test_a_tool_pose_stamped_below_zero_is_ignored_not_taken_as_now():
    """A negative stamp (0 alone means unstamped) is bad input: the pose is ignored with a
    warning, as an image stamped below zero is refused (before: it was given its receipt time
    and counted as fresh)."""
    from builtin_interfaces.msg import Time
    from geometry_msgs.msg import PoseStamped
    from vla_spec_ros.ros.tool_pose import ToolPoseSource

    node = RecordingNode(100.0)
    source = ToolPoseSource(node, _settings(), 'robot')
    msg = PoseStamped()
    msg.header.stamp = Time(sec=-3, nanosec=0)
    msg.pose.orientation.w = 1.0
    node.on('/tool_pose')(msg)
    pose, why = source.at(100.0, 0.5)
    assert pose is None and why
    _give_pose(node, 0.2, 0.0)                      # unstamped: taken at its arrival
    pose, why = source.at(100.0, 0.5)
    assert why is None and pose is not None


def test_a_tool_pose_in_another_frame_than_frame_id_is_ignored_and_named():
    """The deltas are applied in frame_id: a tool pose in another frame is ignored (before:
    its frame was adopted silently, and base-frame deltas moved the tool along another
    frame's axes), and the hold reason names the frame."""
    from geometry_msgs.msg import PoseStamped
    from vla_spec_ros.ros.message_time import stamp_at
    from builtin_interfaces.msg import Time
    from vla_spec_ros.ros.tool_pose import ToolPoseSource

    node = RecordingNode(100.0)
    settings = _settings()
    source = ToolPoseSource(node, settings, 'robot')
    msg = PoseStamped()
    msg.header.stamp = stamp_at(Time(), 100.0)
    msg.header.frame_id = 'world'
    msg.pose.orientation.w = 1.0
    node.on('/tool_pose')(msg)
    pose, why = source.at(100.0, 0.5)
    assert pose is None and "'world'" in why and repr(settings.frame_id) in why
    _give_pose(node, 0.3, 100.0)                        # in base_link, frame_id's
    pose, why = source.at(100.0, 0.5)
    assert why is None and pose.position[0] == 0.3 and source.frame_id == settings.frame_id


def test_after_a_held_step_the_next_step_sends_the_rest_of_the_pose_trajectory():
    """A step refused on its own (the chunk kept) stops the pose trajectory; the next step
    that goes out sends its target and the chunk's rest again from there, on the chunk's
    own times (before: the Cartesian controller stood while the per-step targets went on).
    While the trajectory runs, a step sends only its target."""
    from builtin_interfaces.msg import Time
    from vla_spec_ros.ros.message_time import stamp_at
    from vla_spec_ros.ros.pose_output import PoseTargetOutput

    settings = _settings()
    node = RecordingNode(100.0)
    output = PoseTargetOutput(node, '~/', settings, 'robot', is_chunked=True)
    _give_pose(node, 0.0, 100.0)
    prepared, _ = output.prepare(100.0, settings)
    commands = [SimpleNamespace(linear=(0.1 / P, 0.0, 0.0), angular=(0.0, 0.0, 0.0))] * K
    chunk = SimpleNamespace(stamp=stamp_at(Time(), 100.0))
    output.publish_chunk(chunk, commands, settings, prepared)
    output.publish_step(chunk, 0, commands[0], stamp_at(Time(), 100.0), settings)
    assert len(_trajectories(node)) == 1                     # running: no second one
    node.clock.now_s = 100.1
    output.hold(stamp_at(Time(), 100.1), settings)           # step 0 refused: a stop
    assert len(_trajectories(node)) == 2
    node.clock.now_s = 100.2
    output.publish_step(chunk, 1, commands[1], stamp_at(Time(), 100.0 + P), settings)
    rest = _trajectories(node)[-1]
    assert len(_trajectories(node)) == 3 and len(rest.points) == K - 1
    xs = [p.transforms[0].translation.x for p in rest.points]
    assert xs == pytest.approx([0.2, 0.3, 0.4])             # targets of steps 1..3
    assert rest.header.stamp == stamp_at(Time(), 100.0 + P)
