"""Integration over DDS: two image slots, a robot state and joint-position actions, on the real
node (rclpy + Fast DDS, no mocks of rclpy) serving two robots from one engine.

The model: the tiny OpenVLA preset behind a thin test-only engine wrapper. OpenVLA reads one
image and no state, so the wrapper declares two image slots and a state (what a multi-camera
family declares), checks every frame the node submits (two images, the ones sent for one
time, and the state in the parameter's joint order) and forwards the first image to the real
engine. The node does not know about the wrapper: it reads the declared slots and state the
same way as for any model. Expected targets: the reference policy's action for the base
image, clamped to the documented per-joint range (written out here).
"""
import dataclasses
import importlib.util
import os
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

HAS_ROS = all(importlib.util.find_spec(m) is not None
              for m in ('rclpy', 'sensor_msgs', 'trajectory_msgs', 'diagnostic_msgs'))
HAS_TORCH = importlib.util.find_spec('torch') is not None
pytestmark = pytest.mark.skipif(not (HAS_ROS and HAS_TORCH),
                                reason='needs rclpy, sensor_msgs, trajectory_msgs and torch')

if HAS_ROS and HAS_TORCH:
    from builtin_interfaces.msg import Time
    from rclpy.duration import Duration
    from rclpy.parameter import Parameter
    from sensor_msgs.msg import Image, JointState
    from trajectory_msgs.msg import JointTrajectory

    from ros_probe import Recorder, ros_graph, stamp_s, wait_until
    from test_joint_actions import jtc_rejection
    from vla_spec_ros.image_messages import array_to_image
    from vla_spec_ros.ros.node import VLASpecNode
    from vla_spec_ros.ros.qos import COMMAND_QOS, IMAGE_QOS

DOMAIN_ID = 51 + (os.getpid() % 40)
INSTRUCTION = 'put the red block in the drawer'
UNNORM_KEY = 'bridge_orig'
JOINTS = ['j1', 'j2', 'j3', 'j4', 'j5', 'j6']        # + the gripper: OpenVLA's 7 values
LOW, HIGH = [-0.01] * 6, [0.01] * 6
STATE = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
CONTROL_PERIOD = 0.2


class SlotCheckingEngine:
    """The real engine, declared with two image slots and a state (module docstring)."""

    def __init__(self, engine):
        self._engine = engine
        self.runner = SimpleNamespace(model=SimpleNamespace(num_image_slots=2, uses_state=True),
                                      codec=engine.runner.codec)
        self.lock = threading.Lock()
        self.frames = []            # (stream, images, state) of every frame the node submitted

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def _forward(self, frame):
        assert len(frame.images) == 2 and frame.state is not None, frame
        with self.lock:
            self.frames.append((frame.stream_id, frame.images, np.array(frame.state)))
        return dataclasses.replace(frame, image=frame.images[0], state=None)

    def submit(self, frame):
        return self._engine.submit(self._forward(frame))

    def replace_waiting(self, frame):
        return self._engine.replace_waiting(self._forward(frame))

    def capture_graphs(self, frame):
        return self._engine.capture_graphs(self._forward(frame))


class TwoSlotPolicy:
    def __init__(self, policy):
        self.engine = SlotCheckingEngine(policy.engine)
        self.unnorm_keys = policy.unnorm_keys
        self.model_config = policy.model_config


@pytest.fixture(scope='module')
def ros():
    with ros_graph(DOMAIN_ID, 'probe_joints') as graph:
        yield graph


@pytest.fixture(scope='module')
def setup(ros):
    from vla_spec_ros import VLAPolicy

    context, executor, probe = ros
    rng = np.random.default_rng(3)
    base, wrist = (rng.integers(0, 256, (40, 48, 3), dtype=np.uint8) for _ in range(2))
    reference = VLAPolicy.from_pretrained('tiny', restrict_to_action_tokens=True)
    action = reference.predict(base, INSTRUCTION, UNNORM_KEY).action
    policy = TwoSlotPolicy(VLAPolicy.from_pretrained('tiny', restrict_to_action_tokens=True))
    overrides = {'robots': ['a', 'b'], 'image_slots': ['base', 'wrist'],
                 'state_input': 'joint_state', 'action_space': 'joint_position',
                 'joint_names': JOINTS, 'joint_position_min': LOW, 'joint_position_max': HIGH,
                 'instruction': INSTRUCTION, 'unnorm_key': UNNORM_KEY, 'enabled': True,
                 'control_period': CONTROL_PERIOD, 'max_action_age': 5.0,
                 'max_state_age': 0.5, 'image_sync_tolerance': 0.02}
    node = VLASpecNode(policy, node_name='vla_joints', context=context, parameter_overrides=[
        Parameter(k, value=v) for k, v in overrides.items()])
    executor.add_node(node)
    pubs, trajectories = {}, {}
    for robot in ('a', 'b'):
        for slot in ('base', 'wrist'):
            pubs[robot, slot] = probe.create_publisher(Image, f'/{robot}/{slot}/image',
                                                       IMAGE_QOS)
        pubs[robot, 'state'] = probe.create_publisher(JointState, f'/{robot}/joint_states',
                                                      IMAGE_QOS)
        trajectories[robot] = Recorder(probe.get_clock())
        probe.create_subscription(JointTrajectory, f'/{robot}/joint_trajectory',
                                  trajectories[robot], COMMAND_QOS)
    wait_until(lambda: all(p.get_subscription_count() > 0 for p in pubs.values()),
               what='node subscriptions')
    yield SimpleNamespace(node=node, policy=policy, probe=probe, pubs=pubs, base=base,
                          wrist=wrist, action=action, trajectories=trajectories)
    executor.remove_node(node)
    node.destroy_node()


def _now(s):
    return s.probe.get_clock().now()


def _send(s, robot, *, base_dt=0.0, wrist_dt=0.0, state_dt=0.0, wrist=None, state=None,
          names=None, skip=()):
    """One observation of `robot`: state, base and wrist images, stamped now + offsets."""
    now_ns = _now(s).nanoseconds

    def stamp(dt):
        total = now_ns + round(dt * 1e9)
        return Time(sec=total // 10**9, nanosec=total % 10**9)

    if 'state' not in skip:
        msg = JointState(name=names or JOINTS, position=state or STATE)
        msg.header.stamp = stamp(state_dt)
        s.pubs[robot, 'state'].publish(msg)
    time.sleep(0.01)          # the state reaches the node before the set completes
    if 'base' not in skip:
        s.pubs[robot, 'base'].publish(array_to_image(s.base, 'rgb8', stamp=stamp(base_dt)))
    if 'wrist' not in skip:
        s.pubs[robot, 'wrist'].publish(wrist or array_to_image(s.wrist, 'rgb8',
                                                               stamp=stamp(wrist_dt)))


def _whole_robot(arm):
    """A /joint_states as a robot publishes it: the arm's joints (values `arm`, in JOINTS'
    order) among the gripper fingers, a mobile base and a second arm, in another order; a
    joint outside JOINTS is NaN (a wheel without an encoder), which must not matter."""
    names = ['base_x', 'j4', 'finger_left', 'j2', 'right_j1', 'j6', 'j1', 'finger_right',
             'base_theta', 'j5', 'j3', 'right_j2']
    by_joint = dict(zip(JOINTS, arm))
    values = [by_joint.get(name, 0.04 if 'finger' in name else 2.5) for name in names]
    values[names.index('base_theta')] = float('nan')
    return names, values


def _hold_reason(s, robot):
    return s.node.stats_snapshot(robot)['hold_reason'] or ''


def _carried(s, robot, state) -> bool:
    """Whether a frame of `robot` reached the engine carrying exactly `state`."""
    with s.policy.engine.lock:
        return any(stream == robot and np.allclose(carried, state, rtol=0, atol=0)
                   for stream, _, carried in s.policy.engine.frames)


def _answered(s, robot):
    return s.node.stats_snapshot(robot)['actions_published']


def test_paired_frames_are_answered_with_a_trajectory_jtc_accepts(setup):
    s = setup
    start = len(s.trajectories['a'].snapshot())
    before = _answered(s, 'a')
    _send(s, 'a', wrist_dt=0.005)                      # 5 ms apart: one set
    wait_until(lambda: _answered(s, 'a') > before, what='an answer for robot a')
    with s.policy.engine.lock:
        stream, images, state = s.policy.engine.frames[-1]
    assert stream == 'a'
    assert np.array_equal(images[0], s.base) and np.array_equal(images[1], s.wrist)
    assert state.tolist() == STATE                     # in joint_names order
    expected = np.clip(s.action[:6], LOW, HIGH)        # the documented per-joint clamp
    _, msg = s.trajectories['a'].wait_for(lambda m: len(m.points) == 1 and not np.allclose(
        m.points[0].positions, STATE), start=start, what='the target trajectory')
    assert list(msg.joint_names) == JOINTS
    assert np.allclose(msg.points[0].positions, expected)
    assert stamp_s(msg.points[0].time_from_start) == pytest.approx(CONTROL_PERIOD)
    assert jtc_rejection(msg, JOINTS, _now(s).nanoseconds * 1e-9 - 0.05) is None


def test_a_stalled_wrist_camera_holds_that_robot_only(setup):
    s = setup
    start = len(s.trajectories['a'].snapshot())
    # Robot a's wrist camera stops; robot b's cameras go on.
    deadline = time.monotonic() + 30.0
    while 'wrist' not in _hold_reason(s, 'a') and time.monotonic() < deadline:
        _send(s, 'a', skip=('wrist',))
        time.sleep(0.05)
    assert 'image slot wrist' in _hold_reason(s, 'a')
    # The hold of a joint-position robot is "stay": a trajectory to the measured positions.
    s.trajectories['a'].wait_for(lambda m: len(m.points) == 1 and np.allclose(
        m.points[0].positions, STATE), start=start, what='a stay trajectory')
    before = _answered(s, 'b')
    _send(s, 'b')
    wait_until(lambda: _answered(s, 'b') > before, what='robot b still answered')


def test_a_stale_state_holds(setup):
    s = setup
    # The state topic stops while both cameras go on: once the newest state is further than
    # max_state_age from the images, the robot holds and answers nothing.
    deadline = time.monotonic() + 30.0
    while 'robot state' not in _hold_reason(s, 'a') and time.monotonic() < deadline:
        _send(s, 'a', skip=('state',))
        time.sleep(0.1)
    assert 'robot state' in _hold_reason(s, 'a')
    before = _answered(s, 'a')
    for _ in range(3):
        _send(s, 'a', skip=('state',))
        time.sleep(0.1)
    assert _answered(s, 'a') == before


@pytest.mark.parametrize('kind, text', [
    ('nan', 'non-finite position'),
    ('nan_among_extra_joints', "non-finite position of 'j3'"),
    ('bad_wrist_size', 'image slot wrist'),
    ('out_of_sync', 'out of sync'),
])
def test_bad_input_is_refused_with_its_reason_and_nothing_is_acted_on(setup, kind, text):
    s = setup
    before = _answered(s, 'a')
    if kind == 'nan':
        send = lambda: _send(s, 'a', state=STATE[:5] + [float('nan')])      # noqa: E731
    elif kind == 'nan_among_extra_joints':
        names, values = _whole_robot(STATE)
        values[names.index('j3')] = float('nan')
        send = lambda: _send(s, 'a', names=names, state=values)             # noqa: E731
    elif kind == 'bad_wrist_size':
        bad = array_to_image(s.wrist, 'rgb8')
        bad.header.stamp = _now(s).to_msg()
        bad.data = bytes(bad.data[:len(bad.data) // 2])     # half the rows it announces

        def send():
            bad.header.stamp = _now(s).to_msg()
            _send(s, 'a', wrist=bad)
    else:
        send = lambda: _send(s, 'a', wrist_dt=0.05)         # noqa: E731  beyond 0.02 s
    deadline = time.monotonic() + 30.0
    while text not in _hold_reason(s, 'a') and time.monotonic() < deadline:
        send()
        time.sleep(0.1)
    assert text in _hold_reason(s, 'a')
    assert _answered(s, 'a') == before


def test_a_joint_states_of_the_whole_robot_gives_the_model_the_configured_joints(setup):
    """/joint_states with every joint of the robot, in its own order: accepted, and the model
    gets the positions of joint_names in their order (a state no other test sends, so the
    frame that carries it is this message's)."""
    s = setup
    arm = [0.15, -0.25, 0.35, -0.45, 0.55, -0.65]
    names, values = _whole_robot(arm)
    before = _answered(s, 'a')
    deadline = time.monotonic() + 30.0
    while not _carried(s, 'a', arm) and time.monotonic() < deadline:
        _send(s, 'a', names=names, state=values)
        time.sleep(0.1)
    assert _carried(s, 'a', arm), f'no frame carried the arm\'s state; hold: ' \
                                  f'{_hold_reason(s, "a")!r}'
    wait_until(lambda: _answered(s, 'a') > before, what='an answer for robot a')


def test_joints_published_apart_make_one_state(setup):
    """The first three joints in one message, the other three in another (two publishers on
    one topic, as robot_state_publisher takes them), sent back to back: the model gets all
    six, in joint_names' order. The subscription keeps more than the newest message: with
    depth 1 (before) the second overwrote the first whenever the executor was late (an arm
    broadcaster at 500 Hz beside a gripper driver lost the gripper's messages)."""
    s = setup
    (subscription,) = [sub for sub in s.node.subscriptions
                       if sub.topic_name == '/a/joint_states']
    assert subscription.qos_profile.depth >= 50
    arm = [0.11, -0.22, 0.33, -0.44, 0.55, -0.66]
    second = s.probe.create_publisher(JointState, '/a/joint_states', IMAGE_QOS)
    try:
        wait_until(lambda: second.get_subscription_count() > 0, what='the second publisher')
        deadline = time.monotonic() + 30.0
        while not _carried(s, 'a', arm) and time.monotonic() < deadline:
            wrist = JointState(name=JOINTS[3:], position=arm[3:])
            wrist.header.stamp = _now(s).to_msg()
            second.publish(wrist)
            _send(s, 'a', names=JOINTS[:3], state=arm[:3])
            time.sleep(0.1)
        assert _carried(s, 'a', arm), f'no frame carried the merged state; hold: ' \
                                      f'{_hold_reason(s, "a")!r}'
    finally:
        s.probe.destroy_publisher(second)


def test_a_joint_that_stops_coming_holds_naming_it(setup):
    """Messages go on without j6: once its newest position is further than max_state_age
    from the images, the robot holds (stale input) and says which joint."""
    s = setup
    deadline = time.monotonic() + 30.0
    while "joints ['j6']" not in _hold_reason(s, 'a') and time.monotonic() < deadline:
        _send(s, 'a', names=JOINTS[:5], state=STATE[:5])
        time.sleep(0.1)
    reason = _hold_reason(s, 'a')
    assert reason.startswith('stale observation') and "joints ['j6']" in reason, reason
    before = _answered(s, 'a')
    for _ in range(3):
        _send(s, 'a', names=JOINTS[:5], state=STATE[:5])
        time.sleep(0.1)
    assert _answered(s, 'a') == before


def test_a_joint_states_message_of_another_publisher_is_ignored(setup):
    """An arm controller and a gripper driver both publish on /joint_states: the gripper's
    message names none of joint_names, so it is not this state's message, even when it is the
    one nearest to the images; the frames are answered with the arm's state, none refused."""
    s = setup
    gripper = s.probe.create_publisher(JointState, '/a/joint_states', IMAGE_QOS)
    try:
        wait_until(lambda: gripper.get_subscription_count() > 0, what='the gripper publisher')
        before, errors = _answered(s, 'a'), s.node.stats_snapshot('a')['errors']
        deadline = time.monotonic() + 30.0
        while _answered(s, 'a') < before + 3 and time.monotonic() < deadline:
            # The arm's state, then the fingers' (nearer the images in time), each given time
            # to arrive (one topic: a newer message may replace one not taken yet).
            arm = JointState(name=JOINTS, position=STATE)
            arm.header.stamp = (_now(s) - Duration(seconds=0.05)).to_msg()
            s.pubs['a', 'state'].publish(arm)
            time.sleep(0.03)
            fingers = JointState(name=['finger_left', 'finger_right'], position=[0.04, 0.04])
            fingers.header.stamp = _now(s).to_msg()
            gripper.publish(fingers)
            time.sleep(0.03)
            _send(s, 'a', skip=('state',))
            time.sleep(0.1)
        assert _answered(s, 'a') >= before + 3, _hold_reason(s, 'a')
        assert s.node.stats_snapshot('a')['errors'] == errors
        assert 'bad input' not in _hold_reason(s, 'a')
    finally:
        s.probe.destroy_publisher(gripper)
