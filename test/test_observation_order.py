"""The order one robot's images are kept in (ros/observation_input.py), on a node clock the
test sets (fake_node.RecordingNode): no DDS, no torch.

A simulator publishing /clock at 10 Hz (Gazebo classic's default) and a 30 Hz camera: the node
clock moves once every three frames, so frames ordered by their receipt time (`stamp_source:
receipt`, or an unstamped camera) share it. Each is a newer frame and becomes an observation;
before, two of every three were dropped as out of order (and logged as the camera's fault).
Header-stamped frames with a repeated stamp are still dropped as duplicates.
"""
import dataclasses

import pytest

pytest.importorskip('sensor_msgs', reason='needs the ROS message packages')

from builtin_interfaces.msg import Time  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402

from fake_node import RecordingNode  # noqa: E402
from vla_spec_ros.ros import params  # noqa: E402
from vla_spec_ros.ros.observation_input import ObservationInput  # noqa: E402

CLOCK_S = 50.0           # the node clock, still between two /clock messages
FRAME_PERIOD_S = 1 / 30  # the camera's


class Robot:
    """One camera's ObservationInput on a RecordingNode, and what it reported."""

    def __init__(self, **changes):
        self.settings = dataclasses.replace(params.default_node_settings(), **changes)
        self.node = RecordingNode(CLOCK_S)
        self.observations, self.out_of_order, self.refused = [], [], []
        self.input = ObservationInput(
            self.node, '~/', self.settings, self.observations.append, lambda count: None,
            lambda: self.settings, on_refused=lambda info, reason: self.refused.append(reason),
            on_clock_jump=lambda jump: None,
            on_out_of_order=lambda info, label: self.out_of_order.append(info.stamp_s))

    def send(self, stamp_s: float) -> None:
        """One image with header stamp `stamp_s` (0: unstamped), received now."""
        msg = Image(height=1, width=1, encoding='rgb8', step=3, data=bytes(3))
        ns = round(stamp_s * 1e9)
        msg.header.stamp = Time(sec=ns // 10**9, nanosec=ns % 10**9)
        self.node.on('image')(msg)


@pytest.mark.parametrize('stamp_source, stamped', [('receipt', True), ('header', False)])
def test_frames_of_one_receipt_time_are_all_kept(stamp_source, stamped):
    """Ordered by receipt: `stamp_source: receipt` with good (newer) stamps, or an unstamped
    camera with the default `stamp_source: header`."""
    robot = Robot(stamp_source=stamp_source)
    for i in range(3):                            # three frames, one /clock period
        robot.send(CLOCK_S + i * FRAME_PERIOD_S if stamped else 0.0)
    assert robot.out_of_order == [] and robot.refused == []
    assert len(robot.observations) == 3
    assert [o.info.receipt_s for o in robot.observations] == [CLOCK_S] * 3


def test_a_header_stamp_sent_twice_is_still_dropped_as_out_of_order():
    robot = Robot(stamp_source='header')
    robot.send(CLOCK_S)
    robot.send(CLOCK_S)                           # the same stamp again: a duplicate
    assert robot.out_of_order == [CLOCK_S] and len(robot.observations) == 1


class TimeAsked:
    """An input adapter that records the time it is read at (a robot state's lookup)."""

    key = 'state'

    def __init__(self):
        self.times = []

    def read_at(self, time_s, settings):
        self.times.append(time_s)
        return 0.0, None


def test_a_camera_clock_ahead_reads_the_inputs_at_the_arrival_not_the_stamp():
    """A camera 0.3 s ahead of the node's clock (accepted: within max_action_age) is aged from
    its arrival; its robot state is read at that same time. Before: at the header stamp, one
    offset away from every state sample, so each frame was held for a stale state while
    camera and joint states were fresh."""
    settings = dataclasses.replace(params.default_node_settings(), max_action_age=0.5)
    node, asked, observations = RecordingNode(CLOCK_S), TimeAsked(), []
    ObservationInput(node, '~/', settings, observations.append, lambda count: None,
                     lambda: settings, on_refused=lambda info, reason: None,
                     on_clock_jump=lambda jump: None, inputs=[asked])
    msg = Image(height=1, width=1, encoding='rgb8', step=3, data=bytes(3))
    ns = round((CLOCK_S + 0.3) * 1e9)
    msg.header.stamp = Time(sec=ns // 10**9, nanosec=ns % 10**9)
    node.on('image')(msg)
    assert len(observations) == 1 and asked.times == [CLOCK_S]
