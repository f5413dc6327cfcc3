"""Integration over DDS: a chunked model's joint actions through the running node (rclpy + Fast
DDS, no mocks of rclpy).

The model: the tiny OpenVLA preset made with an action chunk of K steps (as test_ros_chunks.py
does); its 7 values per step are read as 6 joints + the gripper. The expected values come from a
separately loaded reference policy's `predict` and the documented per-joint clamps
(docs/action_spaces.md), written out here:

  joint_velocity: step i's JointJog has velocities = clip(chunk[i][:6], -limit, +limit), one
      message per control period on the node's chunk clock, stamped image stamp + i periods;
      the run-out (and any hold) is a JointJog of zero velocities.
  joint_position: the chunk, on arrival, as one JointTrajectory whose timing ROS 2's
      JointTrajectoryController (JTC) accepts (the rules in `jtc_rejection` below); a hold
      is a one-point trajectory to the measured joint positions.

The control period is scaled to this machine's measured inference latency
(test/machine_pace.py), so a loaded machine changes the rate, not the assertions.
"""
import dataclasses
import importlib.util
import os
import threading

import numpy as np
import pytest

HAS_ROS = all(importlib.util.find_spec(m) is not None
              for m in ('rclpy', 'sensor_msgs', 'trajectory_msgs', 'diagnostic_msgs'))
HAS_TORCH = importlib.util.find_spec('torch') is not None
pytestmark = pytest.mark.skipif(not (HAS_ROS and HAS_TORCH),
                                reason='needs rclpy, sensor_msgs, trajectory_msgs and torch')

DOMAIN_ID = 141 + (os.getpid() % 40)
INSTRUCTION = 'put the red block in the drawer'
UNNORM_KEY = 'bridge_orig'
K = 4
JOINTS = ['j1', 'j2', 'j3', 'j4', 'j5', 'j6']            # + the gripper: 7 values per step
# Limits that clamp some joints and leave others as the model decided them.
MAX_VELOCITY = [0.01, 5.0, 0.01, 5.0, 0.01, 5.0]
POSITION_MIN = [-0.01, -5.0, -0.01, -5.0, -0.01, -5.0]
POSITION_MAX = [0.01, 5.0, 0.01, 5.0, 0.01, 5.0]
STATE = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
SLACK = 0.08            # scheduling + DDS delivery on a loaded two-core machine
PACE = {'period': 0.2}  # the control period, set from the measured latency (`chunked`)


def _ns(t):
    return t.sec * 1_000_000_000 + t.nanosec


def _s(t):
    return _ns(t) * 1e-9


def jtc_rejection(msg, controller_joints, receipt_s):
    """Why ROS 2's JTC would reject `msg` on its topic (validate_trajectory_msg, as written in
    ros2_controllers' joint_trajectory_controller.cpp), or None:
      - joint_names: not empty, each one of the controller's joints (all of them: partial
        goals are off by default);
      - points: not empty;
      - the last point's velocities, if given, zero (allow_nonzero_velocity_at_trajectory_end
        is off by default);
      - a non-zero header stamp: stamp + the last point's time_from_start not before the
        controller's now (here: when the message arrived);
      - time_from_start strictly increasing;
      - every point: one position per joint; velocities / accelerations / effort empty or
        one per joint."""
    n = len(msg.joint_names)
    if n == 0:
        return 'empty joint names'
    if sorted(msg.joint_names) != sorted(controller_joints):
        return "joints don't match the controller joints"
    if not msg.points:
        return 'empty trajectory'
    if any(v != 0.0 for v in msg.points[-1].velocities):
        return 'non-zero velocity at the end'
    if _ns(msg.header.stamp) != 0 and _s(msg.header.stamp) + _s(
            msg.points[-1].time_from_start) < receipt_s:
        return 'ends in the past'
    previous = None
    for point in msg.points:
        t = _ns(point.time_from_start)
        if previous is not None and t <= previous:
            return 'time not strictly increasing'
        previous = t
        if len(point.positions) != n:
            return 'positions size mismatch'
        for field in (point.velocities, point.accelerations, point.effort):
            if len(field) not in (0, n):
                return 'field size mismatch'
    return None


def test_the_interface_build_cache_key_covers_every_interface_file(tmp_path):
    """A prefix built before JointJog.msg was added is not reused: the key changes with any
    file of the package (added, or edited)."""
    import shutil

    from ros_interfaces import PACKAGE_SOURCES, cache_key

    source = tmp_path / 'control_msgs'
    shutil.copytree(PACKAGE_SOURCES['control_msgs'], source)
    assert (source / 'msg' / 'JointJog.msg').is_file()
    with_joint_jog = cache_key(source)
    (source / 'msg' / 'JointJog.msg').unlink()
    without = cache_key(source)
    assert without != with_joint_jog
    cmake = source / 'CMakeLists.txt'
    cmake.write_text(cmake.read_text().replace('  "msg/JointJog.msg"\n', ''))
    assert cache_key(source) not in (without, with_joint_jog)


@pytest.fixture(scope='module')
def control_msgs():
    from ros_interfaces import forget_prefix, interface_prefix, use_prefix

    prefix = interface_prefix('control_msgs')
    use_prefix(prefix, 'control_msgs')
    yield prefix
    forget_prefix(prefix)


@pytest.fixture(scope='module')
def chunked(tmp_path_factory):
    """A chunked tiny checkpoint, its frames and a separately loaded reference's chunks."""
    from machine_pace import frame_latency_s
    from vla_spec_ros import VLAPolicy
    from vla_spec_ros.models.registry import preset
    from vla_spec_ros.models.openvla.random_checkpoint import make_checkpoint

    folder = make_checkpoint(dataclasses.replace(preset('tiny'), action_chunk=K),
                             tmp_path_factory.mktemp('joint_chunk') / 'tiny_chunk', seed=5)
    reference = VLAPolicy.from_pretrained(str(folder), restrict_to_action_tokens=True,
                                          mode='ar')
    rng = np.random.default_rng(17)
    frames = [rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for _ in range(2)]
    expected = [reference.predict(f, INSTRUCTION, UNNORM_KEY).action for f in frames]
    for chunk in expected:
        assert chunk.shape == (K, 7) and np.all(np.isfinite(chunk))
    # One chunk decided in at most a quarter period (AR, the slowest mode).
    PACE['period'] = max(0.2, 4.0 * frame_latency_s(reference, INSTRUCTION, UNNORM_KEY))
    assert PACE['period'] <= 2.0, f'{PACE["period"]} s period: too slow for these tests'
    return folder, frames, expected


@pytest.fixture(scope='module')
def ros():
    from ros_probe import ros_graph

    with ros_graph(DOMAIN_ID, 'joint_chunk_probe') as graph:
        yield graph


def _start(ros, chunked, name, **changes):
    from rclpy.parameter import Parameter
    from sensor_msgs.msg import Image

    from vla_spec_ros import VLAPolicy
    from vla_spec_ros.ros.node import VLASpecNode
    from vla_spec_ros.ros.qos import IMAGE_QOS

    context, executor, probe = ros
    period = PACE['period']
    policy = VLAPolicy.from_pretrained(str(chunked[0]), restrict_to_action_tokens=True)
    overrides = {'enabled': True, 'instruction': INSTRUCTION, 'unnorm_key': UNNORM_KEY,
                 'control_period': period, 'max_action_age': 2.5 * period,
                 'joint_names': JOINTS, **changes}
    node = VLASpecNode(policy, node_name=name, context=context, parameter_overrides=[
        Parameter(k, value=v) for k, v in overrides.items()])
    executor.add_node(node)
    image_pub = probe.create_publisher(Image, f'/{name}/image', IMAGE_QOS)
    return node, image_pub


def _stop(ros, node):
    ros[1].remove_node(node)
    node.destroy_node()


def _send_until(probe, image_pub, array, until, timeout=30.0):
    """Publish `array` freshly stamped (again every control period: the image subscription
    is best effort) until `until(stamps sent)` is true; the stamps sent."""
    import time

    from ros_probe import wait_until

    from vla_spec_ros.image_messages import array_to_image

    wait_until(lambda: image_pub.get_subscription_count() > 0, what='image subscriber')
    stamps = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stamp = probe.get_clock().now().to_msg()
        stamps.append(stamp)
        image_pub.publish(array_to_image(array, 'rgb8', stamp=stamp, frame_id='camera'))
        try:
            wait_until(lambda: until(stamps), timeout=PACE['period'])
            return stamps
        except AssertionError:
            continue
    raise AssertionError('no answer to the published image')


def test_joint_velocity_chunk_goes_out_as_one_joint_jog_per_control_period(
        ros, chunked, control_msgs):
    from control_msgs.msg import JointJog
    from rclpy.parameter import Parameter
    from ros_probe import Recorder, wait_until

    from vla_spec_ros.ros.qos import COMMAND_QOS

    _, frames, expected = chunked
    period = PACE['period']
    period_ns = round(period * 1e9)
    probe = ros[2]
    jogs = Recorder(probe.get_clock())
    name = 'vla_joint_velocity'
    sub = probe.create_subscription(JointJog, f'/{name}/joint_jog', jogs, COMMAND_QOS)
    node, image_pub = _start(ros, chunked, name, action_space='joint_velocity',
                             joint_max_velocity=MAX_VELOCITY)
    try:
        assert node.serving.chunk_steps == K and node.serving.chunk_clock is not None
        wait_until(lambda: sub.get_publisher_count() > 0, what='joint_jog publisher')
        start = len(jogs.snapshot())

        def steps_of(stamp, items):
            """(index in items, step i) of the non-zero JointJogs stamped stamp + i periods."""
            t0 = _ns(stamp)
            out = []
            for k, (_, m) in enumerate(items):
                offset = _ns(m.header.stamp) - t0
                if any(m.velocities) and offset % period_ns == 0 and 0 <= offset < K * period_ns:
                    out.append((k, offset // period_ns))
            return out

        stamps = _send_until(probe, image_pub, frames[0], lambda stamps: any(
            steps_of(s, jogs.snapshot()[start:]) for s in stamps))

        def ran_out():
            # The newest image answered: its chunk was not replaced by a later one. Its steps
            # and the first zero JointJog after them (the run-out).
            items = jogs.snapshot()[start:]
            answered = [s for s in stamps if steps_of(s, items)]
            ours = steps_of(answered[-1], items)
            zeros = [k for k, (_, m) in enumerate(items)
                     if k > ours[-1][0] and not any(m.velocities)]
            return (answered[-1], ours, zeros[0], items) if zeros else None
        stamp, ours, zero, items = wait_until(ran_out, timeout=10 * K * period + 10.0,
                                              what='the chunk and its run-out')
        t0 = _s(stamp)
        indices = [i for _, i in ours]
        assert indices == list(range(indices[0], K)), indices     # each due step once, in order
        clamped = np.abs(expected[0][:, :6]) > np.array(MAX_VELOCITY)
        assert clamped.any() and not clamped.all()        # the limits matter, not everywhere
        velocities_expected = np.clip(expected[0][:, :6], -np.array(MAX_VELOCITY),
                                      np.array(MAX_VELOCITY))
        received = []
        for k, i in ours:
            t, msg = items[k]
            assert list(msg.joint_names) == JOINTS
            np.testing.assert_allclose(msg.velocities, velocities_expected[i], rtol=1e-9,
                                       atol=1e-12)
            assert list(msg.displacements) == [] and msg.duration == 0.0
            assert _ns(msg.header.stamp) == _ns(stamp) + i * period_ns
            # published inside its slot on the control clock
            assert t0 + i * period - 0.01 <= t < t0 + (i + 1) * period + SLACK, (i, t - t0)
            received.append(t)
        for a, b in zip(received[1:], received[2:]):      # the chunk clock's steps: one period
            assert abs((b - a) - period) < SLACK, (a, b)
        # the run-out: a JointJog of zero velocities, once the last slot ended
        t, msg = items[zero]
        assert list(msg.joint_names) == JOINTS and list(msg.velocities) == [0.0] * len(JOINTS)
        assert t >= t0 + K * period - 0.01
        assert node.stats_snapshot()['hold_reason'].startswith('chunk ran out')
        # a hold (disabled) is a zero JointJog too, and no step follows it
        before = len(jogs.snapshot())
        node.set_parameters([Parameter('enabled', value=False)])
        jogs.wait_for(lambda m: list(m.velocities) == [0.0] * len(JOINTS) and list(
            m.joint_names) == JOINTS, start=before, what='the zero JointJog of the hold')
    finally:
        probe.destroy_subscription(sub)
        _stop(ros, node)


def test_a_joint_list_that_no_longer_fits_the_checkpoint_is_refused_at_run_time(
        ros, chunked):
    """joint_names may be renamed at run time, not resized (with its limits, in one atomic
    set): with the checkpoint's 7 values (6 joints + the gripper), 7 joints would send the
    gripper's value to the 7th joint as a joint command and 5 made every frame an engine
    error; both are refused with the reason and nothing changes. Renaming is accepted."""
    from rclpy.parameter import Parameter

    node, _ = _start(ros, chunked, 'vla_joint_names', action_space='joint_velocity',
                     joint_max_velocity=MAX_VELOCITY)
    try:
        for joints in (JOINTS + ['j7'], JOINTS[:5]):
            limits = [MAX_VELOCITY[0]] * len(joints)
            result = node.set_parameters_atomically([
                Parameter('joint_names', value=joints),
                Parameter('joint_max_velocity', value=limits)])
            assert not result.successful
            assert result.reason.startswith(f'joint_names: {len(joints)} joints, but the node '
                                            'started with 6'), result.reason
        assert list(node.serving.settings.joint_names) == JOINTS
        renamed = [f'arm_{j}' for j in JOINTS]
        assert node.set_parameters([Parameter('joint_names', value=renamed)])[0].successful
        assert list(node.serving.settings.joint_names) == renamed
    finally:
        _stop(ros, node)


def test_joint_position_chunk_is_one_trajectory_jtc_accepts_and_a_hold_stays(ros, chunked):
    from ros_probe import Recorder, wait_until
    from sensor_msgs.msg import JointState
    from trajectory_msgs.msg import JointTrajectory

    from vla_spec_ros.ros.qos import COMMAND_QOS, IMAGE_QOS

    _, frames, expected = chunked
    period = PACE['period']
    probe = ros[2]
    trajectories = Recorder(probe.get_clock())
    name = 'vla_joint_position'
    sub = probe.create_subscription(JointTrajectory, f'/{name}/joint_trajectory', trajectories,
                                    COMMAND_QOS)
    state_pub = probe.create_publisher(JointState, f'/{name}/joint_states', IMAGE_QOS)
    # The robot driver's joint states, 20 Hz for the whole test (in another order than
    # joint_names: the node maps them by name).
    stop_states = threading.Event()

    def publish_states():
        order = list(reversed(range(len(JOINTS))))
        while not stop_states.wait(0.05):
            msg = JointState(name=[JOINTS[k] for k in order], position=[STATE[k] for k in order])
            msg.header.stamp = probe.get_clock().now().to_msg()
            state_pub.publish(msg)
    states = threading.Thread(target=publish_states, daemon=True)
    node, image_pub = _start(ros, chunked, name, action_space='joint_position',
                             joint_position_min=POSITION_MIN, joint_position_max=POSITION_MAX,
                             state_input='joint_state', max_state_age=0.5)
    states.start()
    try:
        assert node.serving.chunk_steps == K
        wait_until(lambda: sub.get_publisher_count() > 0, what='joint_trajectory publisher')
        start = len(trajectories.snapshot())

        def chunk_trajectory():
            # The chunk's trajectory: more than one point, or one point that is not the stay.
            return trajectories.find(lambda m: len(m.points) > 1 or not np.allclose(
                m.points[0].positions, STATE), start)
        _send_until(probe, image_pub, frames[0], lambda stamps: chunk_trajectory())
        received, msg = chunk_trajectory()
        # JTC's rules (jtc_rejection), checked at the time it arrived here
        why = jtc_rejection(msg, JOINTS, received)
        assert why is None, why
        assert list(msg.joint_names) == JOINTS
        assert all(len(p.positions) == len(JOINTS) for p in msg.points)
        times = [_s(p.time_from_start) for p in msg.points]
        assert times[0] == pytest.approx(period, abs=1e-9)        # one period ahead, not 0
        assert all(b > a for a, b in zip(times, times[1:]))
        assert np.allclose(np.diff(times), period, atol=1e-9)
        assert _s(msg.header.stamp) > 0.0                          # JTC checks its end
        assert _s(msg.header.stamp) <= received                    # stamped when sent
        assert _s(msg.header.stamp) + times[-1] >= received        # not ending in the past
        # the points: the chunk's steps still due, each clamped to its joint's range
        clamped = (expected[0][:, :6] < POSITION_MIN) | (expected[0][:, :6] > POSITION_MAX)
        assert clamped.any() and not clamped.all()
        positions_expected = np.clip(expected[0][:, :6], POSITION_MIN, POSITION_MAX)
        first = K - len(msg.points)
        assert 0 <= first < K
        np.testing.assert_allclose([list(p.positions) for p in msg.points],
                                   positions_expected[first:], rtol=1e-9, atol=1e-12)
        assert all(list(p.velocities) == [] for p in msg.points)
        # The chunk runs out; the hold is "stay": one point, the measured positions (in
        # joint_names order), one period ahead, which JTC accepts as well.
        after = len(trajectories.snapshot())
        received, hold = trajectories.wait_for(
            lambda m: len(m.points) == 1 and np.allclose(m.points[0].positions, STATE),
            start=after, timeout=10 * K * period + 10.0, what='the stay trajectory')
        assert jtc_rejection(hold, JOINTS, received) is None
        assert list(hold.points[0].positions) == STATE
        assert _s(hold.points[0].time_from_start) == pytest.approx(period, abs=1e-9)
        assert _s(hold.header.stamp) + period >= received
        assert node.stats_snapshot()['hold_reason'].startswith('chunk ran out')
    finally:
        stop_states.set()
        states.join(timeout=2.0)
        probe.destroy_subscription(sub)
        probe.destroy_publisher(state_pub)
        _stop(ros, node)
