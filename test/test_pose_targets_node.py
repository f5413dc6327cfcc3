"""Absolute targets from the real node over DDS (ros/pose_output.py): MoveIt Servo's pose mode
and a Cartesian trajectory controller's absolute poses.

A probe publishes the tool pose (PoseStamped, as a robot driver does) and camera frames; the
node runs in this process with `pose_targets: true`, `servo_command_type: pose` and
`~/pose_target` remapped onto the Servo stand-in's `~/pose_target_cmds` (test/servo_double.py).

Expected values: the actions of a separately loaded policy on the same frames (as
test_ros_node), applied to the pose the probe published for that frame with scipy's Rotation
(fixed-axis 'xyz' rpy composed on the left, translation added in the base frame), never with
the node's own pose math. Checked: each target over a sequence of frames with rotating tool
poses; Servo had POSE selected and acted on them; a chunked model's ~/pose_trajectory holds
the chunk's absolute poses with time_from_start (i + 1) control periods (strictly increasing,
the first after 0); no tool pose -> zero twist and no target.
"""
import dataclasses
import importlib.util
import os

import numpy as np
import pytest

HAS_ROS = all(importlib.util.find_spec(m) is not None
              for m in ('rclpy', 'sensor_msgs', 'geometry_msgs', 'std_srvs', 'diagnostic_msgs'))
HAS_TORCH = importlib.util.find_spec('torch') is not None
HAS_TRAJECTORY = importlib.util.find_spec('trajectory_msgs') is not None
pytestmark = pytest.mark.skipif(not (HAS_ROS and HAS_TORCH),
                                reason='needs rclpy + ROS message wheels and torch')
Rotation = pytest.importorskip('scipy.spatial.transform').Rotation

DOMAIN_ID = 181 + (os.getpid() % 10)     # Fast DDS takes domains 0..232 only
INSTRUCTION = 'stack the cups'
UNNORM_KEY = 'bridge_orig'
CONTROL_PERIOD = 0.2
K = 4
TOOL_POSE_TOPIC = '/arm/tool_pose'


def tool_poses():
    """(position, quaternion xyzw) of the tool for each frame: moving and rotating."""
    return [(np.array([0.4 + 0.05 * i, -0.1 * i, 0.3]),
             Rotation.from_euler('xyz', [0.4 * i, -0.3 * i + 0.1, 0.7 * i - 0.2]).as_quat())
            for i in range(4)]


def expected_target(position, quaternion, delta):
    """Base-frame delta (docs/robot.md): translation added, rpy rotation on the left."""
    rotation = Rotation.from_euler('xyz', delta[3:6]) * Rotation.from_quat(quaternion)
    return position + delta[:3], rotation


def pose_arrays(pose):
    p, q = pose.position, pose.orientation
    return np.array([p.x, p.y, p.z]), Rotation.from_quat([q.x, q.y, q.z, q.w])


def assert_pose(actual, position, rotation):
    got_position, got_rotation = actual
    assert np.allclose(got_position, position, atol=1e-9)
    assert (got_rotation.inv() * rotation).magnitude() < 1e-9


@pytest.fixture(scope='module')
def moveit_msgs():
    from ros_interfaces import forget_prefix, interface_prefix, use_prefix

    prefix = interface_prefix('moveit_msgs')
    use_prefix(prefix, 'moveit_msgs')
    yield prefix
    forget_prefix(prefix)


@pytest.fixture(scope='module')
def graph():
    from ros_probe import ros_graph

    with ros_graph(DOMAIN_ID, 'pose_probe', num_threads=2) as (context, executor, probe_node):
        yield context, executor, probe_node


class PoseProbe:
    """The probe of test_ros_node, a tool-pose publisher and pose-target recorders."""

    def __init__(self, probe_node, target):
        from geometry_msgs.msg import PoseStamped
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from ros_probe import Probe, Recorder

        self.probe = Probe(probe_node, target)
        qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
        self.pose_pub = probe_node.create_publisher(PoseStamped, TOOL_POSE_TOPIC, qos)
        self.targets = Recorder(probe_node.get_clock())
        probe_node.create_subscription(PoseStamped, f'/{target}/pose_target', self.targets, qos)
        self.trajectories = Recorder(probe_node.get_clock())
        if HAS_TRAJECTORY:
            from trajectory_msgs.msg import MultiDOFJointTrajectory
            probe_node.create_subscription(MultiDOFJointTrajectory, f'/{target}/pose_trajectory',
                                           self.trajectories, qos)

    def tool_pose(self, position, quaternion, stamp):
        from geometry_msgs.msg import PoseStamped

        msg = PoseStamped()
        msg.header.stamp, msg.header.frame_id = stamp, 'base_link'
        msg.pose.position.x, msg.pose.position.y, msg.pose.position.z = map(float, position)
        o = msg.pose.orientation
        o.x, o.y, o.z, o.w = map(float, quaternion)
        return msg


def start_node(graph, policy, name, remaps=(), **changes):
    from rclpy.parameter import Parameter

    from vla_spec_ros.ros.node import VLASpecNode

    context, executor, probe_node = graph
    overrides = {'enabled': True, 'instruction': INSTRUCTION, 'unnorm_key': UNNORM_KEY,
                 'frame_id': 'base_link', 'control_period': CONTROL_PERIOD,
                 'max_linear_speed': 10.0, 'max_angular_speed': 20.0, 'max_action_age': 20.0,
                 'pose_targets': True, 'tool_pose_topic': TOOL_POSE_TOPIC, **changes}
    cli_args = ['--ros-args'] + [a for own, to in remaps for a in ('-r', f'{own}:={to}')]
    node = VLASpecNode(policy, node_name=name, context=context, cli_args=cli_args,
                       parameter_overrides=[Parameter(k, value=v) for k, v in overrides.items()])
    executor.add_node(node)
    return node, PoseProbe(probe_node, name)


def stop_node(graph, node):
    graph[1].remove_node(node)
    node.destroy_node()


def give_tool_pose(node, probe, position, quaternion):
    """Publish the tool pose until the node has it (its pose history holds the stamp); the
    stamp, which the frame then carries too (so it is the pose read for that frame)."""
    from ros_probe import wait_until

    source = node.serving.channels[0].pose_output.source
    stamp = probe.probe.now().to_msg()
    stamp_s = stamp.sec + 1e-9 * stamp.nanosec
    msg = probe.tool_pose(position, quaternion, stamp)
    for _ in range(80):
        probe.pose_pub.publish(msg)
        try:
            wait_until(lambda: source.history.newest and source.history.newest[0] == stamp_s,
                       timeout=0.25, what='the tool pose at the node')
            return stamp
        except AssertionError:
            continue
    raise AssertionError('the node never received the tool pose')


def frame_with_stamp(probe, image, stamp):
    msg = probe.probe.raw_image(image)
    msg.header.stamp = stamp
    return msg


def answered(recorder, stamp):
    def find():
        return recorder.find(lambda m: m.header.stamp == stamp)
    return find


def test_servo_pose_mode_targets_are_the_deltas_applied_to_the_pose_read(graph, moveit_msgs):
    from servo_double import EXECUTED, POSE, ServoDouble

    from ros_probe import wait_until
    from vla_spec_ros import VLAPolicy

    policy = VLAPolicy.from_pretrained('tiny', restrict_to_action_tokens=True)
    reference = VLAPolicy.from_pretrained('tiny', restrict_to_action_tokens=True, mode='ar')
    rng = np.random.default_rng(5)
    images = [rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for _ in range(4)]
    actions = [reference.predict(im, INSTRUCTION, UNNORM_KEY).action for im in images]
    assert any(np.abs(a[3:6]).max() > 1e-4 for a in actions)        # rotation deltas present

    servo = ServoDouble(context=graph[0], timeout_s=60.0)
    graph[1].add_node(servo)
    node, probe = start_node(graph, policy, 'vla_pose',
                             [('~/pose_target', '/servo_node/pose_target_cmds')],
                             servo_node='/servo_node', servo_command_type='pose')
    # The remapped pose_target goes to Servo; record it there too.
    try:
        wait_until(lambda: ('switch_command_type', POSE, True) in servo.snapshot()[1],
                   what='the node selecting POSE')
        for image, action, (position, quaternion) in zip(images, actions, tool_poses()):
            stamp = give_tool_pose(node, probe, position, quaternion)
            start = len(servo.snapshot()[0])

            def target():
                return next((msg for _, kind, msg, _ in servo.snapshot()[0][start:]
                             if kind == POSE and msg.header.stamp == stamp), None)
            msg = probe.probe.send(frame_with_stamp(probe, image, stamp), target)
            assert msg.header.frame_id == 'base_link'
            assert_pose(pose_arrays(msg.pose), *expected_target(position, quaternion, action))
        commands, _ = servo.snapshot()
        assert [v for _, kind, _, v in commands if kind == POSE].count(EXECUTED) >= 4
    finally:
        stop_node(graph, node)
        graph[1].remove_node(servo)
        servo.destroy_node()


def servo_integrated(quaternion, angular, period):
    """The orientation after Servo holds the twist's angular velocity w (base frame) for one
    period: a constant angular velocity about fixed axes turns the tool by exp(w * period),
    on the left (scipy's rotation vector, independent of the node's rotation math)."""
    return Rotation.from_rotvec(np.asarray(angular) * period) * Rotation.from_quat(quaternion)


def test_the_pose_target_is_where_servo_takes_the_tool_with_the_twist(graph):
    """Both outputs follow one convention (docs/robot.md, "Rotations"): the action's fixed-axis
    rotation Rz @ Ry @ Rx. The twist, integrated over one period as Servo integrates it, turns
    the tool by exactly that rotation, and the pose target of the same frame is that pose."""
    from vla_spec_ros import VLAPolicy

    policy = VLAPolicy.from_pretrained('tiny', restrict_to_action_tokens=True)
    reference = VLAPolicy.from_pretrained('tiny', restrict_to_action_tokens=True, mode='ar')
    rng = np.random.default_rng(11)
    images = [rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for _ in range(4)]
    actions = [reference.predict(im, INSTRUCTION, UNNORM_KEY).action for im in images]
    # The test tells the conventions apart: reading the angles as a rotation vector is off.
    gaps = [(Rotation.from_rotvec(a[3:6]).inv() * Rotation.from_euler('xyz', a[3:6]))
            .magnitude() for a in actions]
    assert max(gaps) > 1e-6
    node, probe = start_node(graph, policy, 'vla_pose_twist')
    try:
        for image, action, (position, quaternion) in zip(images, actions, tool_poses()):
            stamp = give_tool_pose(node, probe, position, quaternion)
            _, target = probe.probe.send(frame_with_stamp(probe, image, stamp),
                                         answered(probe.targets, stamp))
            _, twist = probe.probe.twists.wait_for(lambda m: m.header.stamp == stamp,
                                                   what='the twist of the frame')
            angular = [twist.twist.angular.x, twist.twist.angular.y, twist.twist.angular.z]
            turned = servo_integrated(quaternion, angular, CONTROL_PERIOD)
            _, wanted = expected_target(position, quaternion, action)
            _, target_rotation = pose_arrays(target.pose)
            assert (turned.inv() * wanted).magnitude() < 1e-9
            assert (target_rotation.inv() * turned).magnitude() < 1e-9
    finally:
        stop_node(graph, node)


def test_without_a_tool_pose_the_robot_holds(graph):
    from ros_probe import is_zero

    from vla_spec_ros import VLAPolicy

    policy = VLAPolicy.from_pretrained('tiny', restrict_to_action_tokens=True)
    node, probe = start_node(graph, policy, 'vla_no_pose',
                             tool_pose_topic='/arm/no_such_pose')
    try:
        image = np.zeros((48, 64, 3), np.uint8)
        probe.probe.send(probe.probe.raw_image(image),
                         lambda: (node.stats_snapshot()['hold_reason'] or '').startswith(
                             'no tool pose'), restamp=True)
        assert 'no tool pose received' in node.stats_snapshot()['hold_reason']
        assert probe.targets.snapshot() == []
        assert all(is_zero(m) for _, m in probe.probe.twists.snapshot())
    finally:
        stop_node(graph, node)


def test_the_frames_of_the_tool_pose_are_fixed_at_start_up(graph):
    """The tool pose is read in frame_id (and, from TF, of tool_frame) from start-up on:
    before, both could be changed at run time and were accepted, and the targets computed in
    the old frames went out named with the new ones (a tool0 -> tip offset sent as a jump).
    Now such a change is refused with the reason, and the values stay."""
    from vla_spec_ros import VLAPolicy

    policy = VLAPolicy.from_pretrained('tiny', restrict_to_action_tokens=True)
    node, probe = start_node(graph, policy, 'vla_pose_frames')
    try:
        for name, value, words in (('frame_id', 'world', 'fixed at start-up while pose_targets'),
                                   ('tool_frame', 'tip', 'load-time'),
                                   ('servo_pause_on_hold', False, 'load-time')):
            before = probe.probe.get_param(name)
            result = probe.probe.set_param(name, value)
            assert not result.successful and words in result.reason, (name, result.reason)
            assert probe.probe.get_param(name) == before
    finally:
        stop_node(graph, node)


@pytest.mark.skipif(not HAS_TRAJECTORY, reason='needs trajectory_msgs (ros extra)')
def test_a_chunk_gives_absolute_poses_on_the_controllers_timing(graph, tmp_path):
    from ros_probe import wait_until, stamp_s

    from vla_spec_ros import VLAPolicy
    from vla_spec_ros.models.registry import preset
    from vla_spec_ros.models.openvla.random_checkpoint import make_checkpoint

    folder = make_checkpoint(dataclasses.replace(preset('tiny'), action_chunk=K),
                             tmp_path / 'tiny_chunk', seed=5)
    reference = VLAPolicy.from_pretrained(str(folder), restrict_to_action_tokens=True, mode='ar')
    policy = VLAPolicy.from_pretrained(str(folder), restrict_to_action_tokens=True)
    image = np.random.default_rng(9).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    chunk = reference.predict(image, INSTRUCTION, UNNORM_KEY).action        # (K, 7)
    node, probe = start_node(graph, policy, 'vla_pose_chunk', tool_frame='tool0')
    try:
        position, quaternion = tool_poses()[2]
        stamp = give_tool_pose(node, probe, position, quaternion)
        _, trajectory = probe.probe.send(frame_with_stamp(probe, image, stamp),
                                         answered(probe.trajectories, stamp))
        assert trajectory.header.frame_id == 'base_link'
        assert trajectory.joint_names == ['tool0']
        assert len(trajectory.points) == K
        times = [stamp_s(p.time_from_start) for p in trajectory.points]
        assert times[0] > 0.0 and all(b > a for a, b in zip(times, times[1:]))
        assert times == pytest.approx([(i + 1) * CONTROL_PERIOD for i in range(K)], abs=1e-9)
        # Point i: the pose after steps 0..i, each applied to the previous target.
        expected_position, expected_rotation = position, Rotation.from_quat(quaternion)
        for point, step in zip(trajectory.points, chunk):
            expected_position = expected_position + step[:3]
            expected_rotation = Rotation.from_euler('xyz', step[3:6]) * expected_rotation
            (transform,) = point.transforms
            t, r = transform.translation, transform.rotation
            assert_pose((np.array([t.x, t.y, t.z]), Rotation.from_quat([r.x, r.y, r.z, r.w])),
                        expected_position, expected_rotation)
            assert point.velocities == [] and point.accelerations == []
        # The step targets on ~/pose_target are the trajectory's points, each stamped like its
        # twist: the image's stamp + i control periods (steps whose slot passed are skipped).
        t0 = stamp_s(stamp)

        def step_targets():
            out = {}
            for _, msg in probe.targets.snapshot():
                i = round((stamp_s(msg.header.stamp) - t0) / CONTROL_PERIOD)
                if 0 <= i < K and abs(stamp_s(msg.header.stamp) - t0 - i * CONTROL_PERIOD) < 1e-6:
                    out[i] = msg
            return out
        wait_until(step_targets, what='a step target')
        for i, msg in step_targets().items():
            assert_pose(pose_arrays(msg.pose), *pose_arrays_from_transform(trajectory.points[i]))
        # The chunk runs out and the robot holds: the controller is stopped with a trajectory
        # it accepts (a trajectory controller rejects an empty one): one point, the tool pose
        # measured last (the one given above), one period after the hold's stamp, so that it
        # does not end in the past when it arrives.
        received, stop = probe.trajectories.wait_for(
            lambda m: m.header.stamp != stamp, what='the stop trajectory at the run-out')
        assert stop.joint_names == ['tool0'] and stop.header.frame_id == 'base_link'
        assert len(stop.points) == 1
        assert stamp_s(stop.points[0].time_from_start) == pytest.approx(
            CONTROL_PERIOD, abs=1e-9)
        assert_pose(pose_arrays_from_transform(stop.points[0]), position,
                    Rotation.from_quat(quaternion))
        assert stamp_s(stop.header.stamp) >= t0 + K * CONTROL_PERIOD - 0.01
        # Stamped when it is published (the hold), not at an older step: its one point ends a
        # period later. (Its arrival here, `received`, also counts this process's executor,
        # 0.29 s late on a loaded runner: only a generous bound holds on every machine.)
        assert stamp_s(stop.header.stamp) <= received + 0.01
        assert received - stamp_s(stop.header.stamp) < 1.0
    finally:
        stop_node(graph, node)


def pose_arrays_from_transform(point):
    t, r = point.transforms[0].translation, point.transforms[0].rotation
    return np.array([t.x, t.y, t.z]), Rotation.from_quat([r.x, r.y, r.z, r.w])
