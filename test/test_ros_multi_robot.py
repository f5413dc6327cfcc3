"""Integration: two robots on one `vla_spec` node, over real DDS (rclpy + Fast DDS).

Each robot has its own camera, instruction, twist and services (`<robot>/...`) and its own
parameters (`<robot>.frame_id`, ...); one engine (pipeline mode) packs their frames. Checked:
each robot gets only its own twists (stamps and frame_id match its frames), its actions equal
the AR reference for each of its frames, one robot's stalled camera gives a zero twist to that
robot only, and per-robot enable and parameters act on that robot only.
"""
import importlib.util
import os
import time

import numpy as np
import pytest

HAS_ROS = all(importlib.util.find_spec(m) is not None
              for m in ('rclpy', 'sensor_msgs', 'geometry_msgs', 'std_srvs', 'diagnostic_msgs'))
HAS_TORCH = importlib.util.find_spec('torch') is not None
pytestmark = pytest.mark.skipif(not (HAS_ROS and HAS_TORCH),
                                reason='needs rclpy + ROS message wheels and torch')

if HAS_ROS and HAS_TORCH:
    from diagnostic_msgs.msg import DiagnosticArray
    from rclpy.parameter import Parameter
    from std_msgs.msg import String
    from std_srvs.srv import SetBool

    from ros_probe import (Probe, ros_graph, Recorder, is_zero, stamp_s, turn_rate,
                           twist_values, wait_until)
    from vla_spec_ros.ros.node import VLASpecNode

DOMAIN_ID = 131 + (os.getpid() % 40)
ROBOTS = ('arm_a', 'arm_b')
INSTRUCTIONS = {'arm_a': 'put the red block in the drawer', 'arm_b': 'open the drawer'}
UNNORM_KEY = 'bridge_orig'
CONTROL_PERIOD = 0.2
MAX_ACTION_AGE = 1.5


def frames_for(robot):
    rng = np.random.default_rng(1 if robot == 'arm_a' else 2)
    return [rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for _ in range(3)]


@pytest.fixture(scope='module')
def ros():
    with ros_graph(DOMAIN_ID, 'multi_probe', num_threads=2) as graph:
        yield graph


@pytest.fixture(scope='module')
def reference():
    """The AR actions of each robot's frames, from a separately loaded policy."""
    from vla_spec_ros import VLAPolicy

    policy = VLAPolicy.from_pretrained('tiny', restrict_to_action_tokens=True)
    return {robot: [policy.predict(im, INSTRUCTIONS[robot], UNNORM_KEY).action
                    for im in frames_for(robot)] for robot in ROBOTS}


@pytest.fixture(scope='module')
def fleet(ros):
    from vla_spec_ros import VLAPolicy

    context, executor, probe_node = ros
    policy = VLAPolicy.from_pretrained('tiny', restrict_to_action_tokens=True, mode='pipeline',
                                       max_inflight=4, max_streams=2)
    overrides = {'robots': list(ROBOTS), 'enabled': True, 'unnorm_key': UNNORM_KEY,
                 'control_period': CONTROL_PERIOD, 'max_linear_speed': 10.0,
                 'max_angular_speed': 20.0, 'max_action_age': MAX_ACTION_AGE,
                 'diagnostics_period': 0.2, 'arm_a.frame_id': 'a_tool',
                 'arm_b.frame_id': 'b_tool'}
    node = VLASpecNode(policy, node_name='vla_fleet', context=context,
                       parameter_overrides=[Parameter(k, value=v) for k, v in overrides.items()])
    executor.add_node(node)
    probes = {robot: Probe(probe_node, robot, node_name='vla_fleet') for robot in ROBOTS}
    for robot, probe in probes.items():
        probe.instruction_pub.publish(String(data=INSTRUCTIONS[robot]))
    wait_until(lambda: all(node.serving.values[f'{r}.instruction'] == INSTRUCTIONS[r]
                           for r in ROBOTS), what='both instructions')
    diagnostics = Recorder(probe_node.get_clock())
    probe_node.create_subscription(DiagnosticArray, '/diagnostics', diagnostics, 10)
    yield node, probes, diagnostics
    executor.remove_node(node)
    node.destroy_node()


def _twist_for(probe, image, start):
    return probe.twists.find(lambda m: m.header.stamp == image.header.stamp, start)


def test_each_robot_gets_only_its_own_actions_equal_to_ar(fleet, reference):
    node, probes, _ = fleet
    assert node.serving.engine.config.max_streams == 2
    for i in range(3):
        images = {r: probes[r].raw_image(frames_for(r)[i]) for r in ROBOTS}
        starts = {r: len(probes[r].twists.snapshot()) for r in ROBOTS}
        for robot in ROBOTS:            # both frames in flight together on one engine
            probes[robot].image_pub.publish(images[robot])
        for robot in ROBOTS:
            probe = probes[robot]
            twist = probe.send(images[robot],
                               lambda: _twist_for(probe, images[robot], starts[robot]),
                               restamp=True)[1]
            action = reference[robot][i]
            expected = np.concatenate([action[:3] / CONTROL_PERIOD,
                                       turn_rate(action[3:6], CONTROL_PERIOD)])
            np.testing.assert_allclose(twist_values(twist), expected, rtol=1e-12, atol=1e-12)
            assert twist.header.frame_id == {'arm_a': 'a_tool', 'arm_b': 'b_tool'}[robot]
    # No robot ever received a twist stamped with the other robot's frames.
    for robot in ROBOTS:
        other = probes[ROBOTS[1 - ROBOTS.index(robot)]]
        own_stamps = {stamp_s(m.header.stamp) for _, m in probes[robot].twists.snapshot()
                      if not is_zero(m)}
        other_stamps = {stamp_s(m.header.stamp) for _, m in other.twists.snapshot()
                        if not is_zero(m)}
        assert own_stamps and own_stamps.isdisjoint(other_stamps)


def test_a_stalled_camera_zeroes_only_its_robot(fleet):
    node, probes, _ = fleet
    live, stalled = probes['arm_a'], probes['arm_b']
    # arm_b's last frame is answered (so it is publishing actions, not already holding).
    last = stalled.raw_image(frames_for('arm_b')[0])
    start = len(stalled.twists.snapshot())
    stalled.send(last, lambda: _twist_for(stalled, last, start), restamp=True)
    stall_time = stalled.now().nanoseconds * 1e-9        # probe clock, as the recorder's
    live_start = len(live.twists.snapshot())
    stop_time = time.monotonic() + 3 * MAX_ACTION_AGE
    while time.monotonic() < stop_time:      # arm_a keeps streaming, arm_b's camera is silent
        live.image_pub.publish(live.raw_image(frames_for('arm_a')[1]))
        time.sleep(0.1)
    # arm_b gets zero twists once its newest frame is older than max_action_age, and never an
    # action after that (an answer to its last frame may arrive before).
    after = [(t, m) for t, m in stalled.twists.snapshot() if t > stall_time]
    assert any(is_zero(m) for _, m in after)
    assert all(is_zero(m) for t, m in after if t > stall_time + MAX_ACTION_AGE)
    assert any(not is_zero(m) for _, m in live.twists.snapshot()[live_start:])
    assert node.stats_snapshot('arm_b')['hold_reason'].startswith('stale observation')
    assert node.stats_snapshot('arm_a')['actions_published'] > 0


def test_per_robot_enable_and_parameters(fleet):
    node, probes, diagnostics = fleet
    a, b = probes['arm_a'], probes['arm_b']
    response = b.call(b.enable_client, SetBool.Request(data=False))
    assert response.success, response.message
    assert node.serving.values['arm_b.enabled'] is False
    assert node.serving.values['arm_a.enabled'] is True
    image = a.raw_image(frames_for('arm_a')[2])
    start = len(a.twists.snapshot())
    a.send(image, lambda: _twist_for(a, image, start), restamp=True)
    # Node-wide values of per-robot parameters are refused at run time, with the reason.
    result = a.set_param('frame_id', 'elsewhere')
    assert not result.successful and '<robot>.frame_id' in result.reason
    result = a.set_param('arm_a.gripper_action_name', '/other/gripper_cmd')
    assert not result.successful and 'load-time' in result.reason
    assert a.set_param('arm_a.max_linear_speed', 0.5).successful
    assert node.serving.channels[0].settings.max_linear_speed == 0.5
    assert node.serving.channels[1].settings.max_linear_speed == 10.0
    # One diagnostics status per robot, each naming it.
    names = wait_until(lambda: {s.name for _, m in diagnostics.snapshot() for s in m.status
                                if 'vla_fleet' in s.name} or None, what='diagnostics')
    assert any('(arm_a)' in n for n in names) and any('(arm_b)' in n for n in names)
    # arm_b's camera keeps sending while it is disabled: the engine's summary leaves it out
    # (before: it was the "least answered" robot, answered 0 %, the one an operator would
    # move off a saturated engine).
    received = node.stats_snapshot('arm_b')['frames_received']
    b.image_pub.publish(b.raw_image(frames_for('arm_b')[0]))
    wait_until(lambda: node.stats_snapshot('arm_b')['frames_received'] > received,
               what='arm_b\'s frame received while disabled')
    summary = node.serving.engine_summary()
    assert summary['robots'] == 1 and summary['least_answered_robot'] == 'arm_a'
    assert b.call(b.enable_client, SetBool.Request(data=True)).success


def test_bad_robot_parameters_fail_at_start_up(ros):
    from vla_spec_ros import VLAPolicy

    context, _, _ = ros
    policy = VLAPolicy.from_pretrained('tiny', restrict_to_action_tokens=True)
    for overrides, words in (({'robots': ['a', 'a']}, 'repeated'),
                             ({'robots': ['bad-name']}, 'not a valid name'),
                             ({'robots': ['a'], 'a.frame_id': ' '}, 'a.frame_id'),
                             ({'robots': ['a'], 'b.frame_id': 'x'}, 'unknown parameters')):
        with pytest.raises(ValueError, match=words):
            VLASpecNode(policy, node_name='vla_bad_fleet', context=context,
                        parameter_overrides=[Parameter(k, value=v)
                                             for k, v in overrides.items()])
