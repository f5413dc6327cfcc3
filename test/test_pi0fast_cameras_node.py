"""A π0-FAST test checkpoint with two cameras and a robot state, made by ``vla-spec
make-checkpoint --image-slots 2 --state-dim 6 --decodable-chunks``, behind the real node over
DDS (rclpy + Fast DDS, nothing mocked): two image topics paired by stamp and a whole robot's
/joint_states (its six state joints among others, in another order) make frames whose chunks
decode, and the node sends them as joint-position trajectories. The expected positions are
the chunk ``predict`` gives for the same checkpoint (the decodable checkpoint writes one frame
for every observation: docs/pi0fast.md)."""
import importlib.util
import json
import os
import time

import numpy as np
import pytest

HAS_ROS = all(importlib.util.find_spec(m) is not None
              for m in ('rclpy', 'sensor_msgs', 'trajectory_msgs', 'diagnostic_msgs'))
HAS_TORCH = importlib.util.find_spec('torch') is not None
pytestmark = pytest.mark.skipif(not (HAS_ROS and HAS_TORCH),
                                reason='needs rclpy, sensor_msgs, trajectory_msgs and torch')

DOMAIN_ID = 121 + (os.getpid() % 40)
INSTRUCTION = 'pick up the red cup'
STATE_JOINTS = ['j1', 'j2', 'j3', 'j4', 'j5', 'j6']    # the checkpoint's state (6 values)
ACTION_JOINTS = ['j1', 'j2', 'j3']                     # the checkpoint's action (3 values)
STATE = [0.11, -0.12, 0.13, -0.14, 0.15, -0.16]
IMAGE_SIZE = 42


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory):
    from vla_spec_ros import cli
    out = tmp_path_factory.mktemp('fast_cameras') / 'ck'
    assert cli.main(['make-checkpoint', '--preset', 'pi0fast-tiny', '--out', str(out),
                     '--seed', '7', '--image-slots', '2', '--image-size', str(IMAGE_SIZE),
                     '--state-dim', str(len(STATE_JOINTS)), '--decodable-chunks']) == 0
    return out


@pytest.fixture(scope='module')
def ros():
    from ros_probe import ros_graph
    with ros_graph(DOMAIN_ID, 'fast_cameras_probe') as graph:
        yield graph


def _whole_robot_joint_states(stamp):
    from sensor_msgs.msg import JointState
    by_joint = dict(zip(STATE_JOINTS, STATE))
    names = ['finger_left', 'j4', 'base_x', 'j2', 'j6', 'j1', 'finger_right', 'j5', 'j3']
    msg = JointState(name=names, position=[by_joint.get(n, 0.03) for n in names])
    msg.header.stamp = stamp
    return msg


def test_two_cameras_and_a_state_give_decodable_chunks_through_the_node(checkpoint, ros):
    from rclpy.parameter import Parameter
    from sensor_msgs.msg import Image, JointState
    from trajectory_msgs.msg import JointTrajectory

    from ros_probe import Recorder, wait_until
    from vla_spec_ros import VLAPolicy
    from vla_spec_ros.image_messages import array_to_image
    from vla_spec_ros.ros.node import VLASpecNode
    from vla_spec_ros.ros.qos import COMMAND_QOS, IMAGE_QOS

    rng = np.random.default_rng(4)
    base, wrist = (rng.integers(0, 256, (IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
                   for _ in range(2))
    reference = VLAPolicy.from_pretrained(str(checkpoint), mode='ar')
    expected = reference.predict((base, wrist), INSTRUCTION, state=STATE)
    assert expected.is_valid and expected.action.shape == (4, len(ACTION_JOINTS))
    recorded = json.loads((checkpoint / 'vla_spec_pi0fast.json').read_text())['decodable']
    assert list(expected.tokens) == recorded['frame']

    context, executor, probe = ros
    overrides = {'model_path': str(checkpoint), 'enabled': True, 'instruction': INSTRUCTION,
                 'image_slots': ['base', 'wrist'], 'state_input': 'joint_state',
                 'state_joint_names': STATE_JOINTS, 'joint_names': ACTION_JOINTS,
                 'action_space': 'joint_position', 'joint_position_min': [-100.0] * 3,
                 'joint_position_max': [100.0] * 3, 'max_state_age': 1.0,
                 'max_action_age': 30.0, 'control_period': 0.5}
    node = VLASpecNode(context=context, node_name='vla_fast_cams', parameter_overrides=[
        Parameter(k, value=v) for k, v in overrides.items()])
    executor.add_node(node)
    try:
        pubs = {slot: probe.create_publisher(Image, f'/vla_fast_cams/{slot}/image', IMAGE_QOS)
                for slot in ('base', 'wrist')}
        pubs['state'] = probe.create_publisher(JointState, '/vla_fast_cams/joint_states',
                                               IMAGE_QOS)
        trajectories = Recorder(probe.get_clock())
        probe.create_subscription(JointTrajectory, '/vla_fast_cams/joint_trajectory',
                                  trajectories, COMMAND_QOS)
        wait_until(lambda: all(p.get_subscription_count() > 0 for p in pubs.values()),
                   what='the node\'s subscriptions')

        def carries_the_chunk(msg):
            return len(msg.points) >= 1 and all(
                any(np.allclose(point.positions, row, rtol=0, atol=1e-9)
                    for row in expected.action) for point in msg.points)

        deadline = time.monotonic() + 60.0
        while trajectories.find(carries_the_chunk) is None and time.monotonic() < deadline:
            stamp = probe.get_clock().now().to_msg()
            pubs['state'].publish(_whole_robot_joint_states(stamp))
            time.sleep(0.01)          # the state reaches the node before the image set
            pubs['base'].publish(array_to_image(base, 'rgb8', stamp=stamp))
            pubs['wrist'].publish(array_to_image(wrist, 'rgb8', stamp=stamp))
            time.sleep(0.2)
        stats = node.stats_snapshot()
        assert trajectories.find(carries_the_chunk) is not None, \
            f'no trajectory of the chunk; hold: {stats["hold_reason"]!r}'
        assert stats['actions_published'] >= 1
        _, msg = trajectories.find(carries_the_chunk)
        assert list(msg.joint_names) == ACTION_JOINTS
    finally:
        executor.remove_node(node)
        node.destroy_node()
