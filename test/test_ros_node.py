"""Integration: the real `vla_spec` node over DDS (rclpy + Fast DDS), no mocks of rclpy.

A probe node publishes images + an instruction and records ~/twist, ~/gripper, ~/action and
/diagnostics; parameters and services are driven through their ROS interfaces (the
equivalents of `ros2 param set` / `ros2 service call`). The graph is isolated: its own
ROS_DOMAIN_ID, discovery limited to localhost, a private rclpy Context.

Expected actions come from `VLAPolicy.predict` on the same inputs (tiny preset, greedy over
action tokens so that the random-weight model yields valid actions); the scaling applied to
them here is the documented one, written out in this file.
"""
import contextlib
import gc
import importlib.util
import os
import threading
import time

import numpy as np
import pytest

from engine_wrappers import FaultEngine, WrappedPolicy

HAS_ROS = all(importlib.util.find_spec(m) is not None
              for m in ('rclpy', 'sensor_msgs', 'geometry_msgs', 'std_srvs', 'diagnostic_msgs'))
HAS_TORCH = importlib.util.find_spec('torch') is not None
pytestmark = pytest.mark.skipif(not (HAS_ROS and HAS_TORCH),
                                reason='needs rclpy + ROS message wheels and torch')

if HAS_ROS and HAS_TORCH:
    from diagnostic_msgs.msg import DiagnosticArray
    from rclpy.parameter import Parameter
    from std_msgs.msg import String
    from std_srvs.srv import SetBool, Trigger

    from ros_probe import Probe, ros_graph, Recorder, is_zero, stamp_s, twist_values, wait_until
    from vla_spec_ros.image_messages import rgb_to_compressed
    from vla_spec_ros.ros.diagnostics import FRAME_STAGES
    from vla_spec_ros.ros.node import VLASpecNode
    from vla_spec_ros.ros.frame_slot import LatestFrameSlot

# Unique per module and per run: other test processes on this host use other domains.
DOMAIN_ID = 11 + (os.getpid() % 40)
INSTRUCTION = 'put the red block in the drawer'
UNNORM_KEY = 'bridge_orig'
CONTROL_PERIOD = 0.2
OPEN, CLOSED = 0.04, 0.0
TIMEOUT = 20.0


# ---- helpers ----------------------------------------------------------------------------------

def expected_twist(action, linear_scale=1.0, angular_scale=1.0):
    # Documented scaling: velocity = delta / control_period * scale, the angular delta as the
    # rotation vector of its fixed-axis angles (limits set high here).
    from ros_probe import turn_rate
    return np.concatenate([action[:3] / CONTROL_PERIOD * linear_scale,
                           turn_rate(action[3:6], CONTROL_PERIOD, angular_scale)])


def expected_gripper(action):
    return OPEN if action[6] >= 0.5 else CLOSED


def images():
    rng = np.random.default_rng(7)
    return [rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for _ in range(4)]


# ---- fixtures ---------------------------------------------------------------------------------

@pytest.fixture(scope='module')
def ros():
    with ros_graph(DOMAIN_ID, 'probe') as graph:
        yield graph


@pytest.fixture(scope='module')
def reference():
    """A separately loaded policy and the actions it predicts for the test images."""
    from vla_spec_ros import VLAPolicy

    import cv2

    policy = VLAPolicy.from_pretrained('tiny', restrict_to_action_tokens=True)
    frames = images()
    expected = {'rgb': [policy.predict(im, INSTRUCTION, UNNORM_KEY).action for im in frames]}
    gray = frames[2][:, :, 1]
    expected['mono'] = policy.predict(np.dstack([gray] * 3), INSTRUCTION, UNNORM_KEY).action
    jpeg = rgb_to_compressed(frames[3], 'jpeg', quality=90)
    decoded = cv2.cvtColor(cv2.imdecode(np.frombuffer(jpeg.data, np.uint8), cv2.IMREAD_COLOR),
                           cv2.COLOR_BGR2RGB)
    expected['jpeg'] = policy.predict(decoded, INSTRUCTION, UNNORM_KEY).action
    for action in expected['rgb']:
        assert np.all(np.isfinite(action))
    return policy, frames, expected, jpeg


@pytest.fixture(scope='module')
def main_node(ros):
    """The node loading its own model through `VLAPolicy.from_pretrained` (no policy given)."""
    context, executor, probe_node = ros
    overrides = {'model_path': 'tiny', 'restrict_to_action_tokens': True,
                 'unnorm_key': UNNORM_KEY, 'frame_id': 'tool0',
                 'control_period': CONTROL_PERIOD, 'max_linear_speed': 10.0,
                 'max_angular_speed': 20.0, 'gripper_open_position': OPEN,
                 'gripper_closed_position': CLOSED, 'max_action_age': 5.0,
                 'diagnostics_period': 0.2}
    node = VLASpecNode(context=context, parameter_overrides=[
        Parameter(k, value=v) for k, v in overrides.items()])
    executor.add_node(node)
    probe = Probe(probe_node, 'vla_spec')
    diagnostics = Recorder(probe_node.get_clock())
    probe_node.create_subscription(DiagnosticArray, '/diagnostics', diagnostics, 10)
    yield node, probe, diagnostics
    executor.remove_node(node)
    node.destroy_node()


# ---- main node: end to end, parameters, services, safety -------------------------------------

def test_starts_disabled_and_enable_needs_an_instruction(main_node):
    node, probe, _ = main_node
    assert probe.get_param('enabled') is False
    probe.instruction_pub.publish(String(data=INSTRUCTION))   # latched: arrives once matched
    wait_until(lambda: probe.get_param('instruction') == INSTRUCTION, what='instruction')
    response = probe.call(probe.enable_client, SetBool.Request(data=True))
    assert response.success, response.message
    assert probe.get_param('enabled') is True


def test_end_to_end_values_stamps_and_frame_id(main_node, reference):
    node, probe, _ = main_node
    _, frames, expected, _ = reference
    cases = [(probe.raw_image(frames[0], 'rgb8'), expected['rgb'][0]),
             (probe.raw_image(frames[1][:, :, ::-1], 'bgr8', padding=6), expected['rgb'][1]),
             (probe.raw_image(frames[2][:, :, 1], 'mono8', padding=3), expected['mono'])]
    for image, action in cases:
        start = len(probe.twists.snapshot())
        image_stamp = stamp_s(image.header.stamp)

        def answered():
            return [m for _, m in probe.twists.snapshot()[start:]
                    if stamp_s(m.header.stamp) == image_stamp]
        twist = probe.send(image, answered)[0]
        assert twist.header.frame_id == 'tool0'
        assert twist.header.stamp == image.header.stamp
        np.testing.assert_allclose(twist_values(twist), expected_twist(action), rtol=1e-12,
                                   atol=1e-15)
        # ~/action carries the raw 7-vector; ~/gripper the mapped position.
        probe.actions.wait_for(lambda m: np.allclose(m.data, action, rtol=0, atol=1e-12),
                               what='raw action')
        gripper = probe.grippers.wait_for(
            lambda m: m.data[0] == expected_gripper(action), what='gripper')[1]
        assert len(gripper.data) == 1


def test_tunable_parameter_changes_the_next_output(main_node, reference):
    node, probe, _ = main_node
    _, frames, expected, _ = reference
    result = probe.set_param('linear_scale', 2.0)
    assert result.successful, result.reason
    result = probe.set_param('relax_threshold', 3)          # engine tunable
    assert result.successful, result.reason
    image = probe.raw_image(frames[0])
    start = len(probe.twists.snapshot())
    twist = probe.send(image, lambda: probe.twists.find(
        lambda m: m.header.stamp == image.header.stamp, start))[1]
    np.testing.assert_allclose(twist_values(twist),
                               expected_twist(expected['rgb'][0], linear_scale=2.0), rtol=1e-12)
    assert node.serving.engine.config.relax_threshold == 3          # applied before that frame
    assert probe.set_param('linear_scale', 1.0).successful


@pytest.mark.parametrize('name, value, words', [
    ('control_period', 0.0, 'out of range'),
    ('max_action_age', 100.0, 'out of range'),
    ('relax_threshold', 300, 'out of range'),
    ('model_path', '/models/other', 'load-time'),
    ('device', 'cuda', 'load-time'),
    ('dtype', 'bfloat16', 'load-time'),
    ('draft_path', '/models/draft', 'load-time'),
    ('frame_id', '', 'frame_id'),
    ('mode', 'spec', 'load-time'),
    ('unnorm_key', 'no_such_dataset', 'unnorm_key'),
    # An engine tunable in range that this model cannot take: refused when set (before, it
    # was accepted, then failed in the worker as an engine error that held the robot and
    # reset the engine, and the parameter kept a value the engine never ran).
    ('reasoning_every_n', 2, 'writes no reasoning'),
])
def test_refused_parameters_give_a_reason(main_node, name, value, words):
    node, probe, _ = main_node
    before = probe.get_param(name)
    result = probe.set_param(name, value)
    assert not result.successful
    assert words in result.reason, result.reason
    assert probe.get_param(name) == before


def test_latest_frame_wins_and_drops_are_counted(main_node, reference):
    node, probe, _ = main_node
    _, frames, _, _ = reference
    wait_until(lambda: probe.image_pub.get_subscription_count() > 0)
    before = node.stats_snapshot()
    start = len(probe.twists.snapshot())
    burst = []
    # Hold the engine so that the worker cannot take frames while the burst arrives.
    with node.serving.engine_lock:
        for i in range(5):
            image = probe.raw_image(frames[i % 4])
            burst.append(image)
            received = node.stats_snapshot()['frames_received']
            probe.image_pub.publish(image)
            wait_until(lambda: node.stats_snapshot()['frames_received'] > received,
                       what='frame received')
    last = burst[-1]
    probe.twists.wait_for(lambda m: m.header.stamp == last.header.stamp, start=start,
                          what='action for the newest frame')
    after = node.stats_snapshot()
    # The worker may have taken the first frame before the lock (then 3 drops), else 4.
    assert after['frames_dropped'] - before['frames_dropped'] in (3, 4)
    answered = {stamp_s(m.header.stamp) for _, m in probe.twists.snapshot()[start:]}
    for image in burst[1:-1]:
        assert stamp_s(image.header.stamp) not in answered


def test_diagnostics_report_rate_latency_and_mode(main_node):
    node, probe, diagnostics = main_node

    def ours(msg):
        return [s for s in msg.status if s.name.startswith('/vla_spec:')]

    def has_actions(msg):
        values = {kv.key: kv.value for s in ours(msg) for kv in s.values}
        # after the burst test: several actions and the dropped frames
        return (values and int(values['actions_published']) >= 3
                and int(values['frames_dropped']) >= 3)
    _, msg = diagnostics.wait_for(has_actions, what='diagnostics with actions and drops')
    status = ours(msg)[0]
    values = {kv.key: kv.value for kv in status.values}
    for key in ('action_rate_hz', 'latency_p50_ms', 'latency_p99_ms', 'acceptance_length',
                'frames_dropped', 'frames_stale', 'last_error'):
        assert key in values, key
    # Where the frames' time went: each stage's p50 and p99, together about the latency.
    stages = [float(values[f'{stage}_p50_ms']) for stage in FRAME_STAGES]
    assert all(v >= 0.0 for v in stages) and float(values['steps_p50_ms']) > 0.0
    assert float(values['queue_p99_ms']) >= float(values['queue_p50_ms'])
    assert values['mode'] == 'pipeline_spec'                # the default configuration
    assert float(values['latency_p99_ms']) >= float(values['latency_p50_ms']) > 0.0
    assert float(values['acceptance_length']) >= 1.0        # tokens per verifier forward
    assert int(values['frames_dropped']) >= 3
    assert status.hardware_id == 'tiny'
    # The engine's status carries the process's garbage-collection pauses, and the node froze
    # what it loaded, so no full collection walks the model again (ros/gc_pauses.py).
    engine = next(s for s in ours(msg) if s.name == '/vla_spec: engine')
    engine_values = {kv.key: kv.value for kv in engine.values}
    for key in ('gc_collections_in_window', 'gc_full_collections_in_window', 'gc_pause_max_ms'):
        assert key in engine_values, key
    tracked = {id(o) for o in gc.get_objects()}        # the frozen ones are not listed
    assert id(node.serving.engine) not in tracked and id(node.serving.engine.runner) not in tracked


def test_camera_stop_publishes_zero_within_max_action_age(main_node, reference):
    node, probe, _ = main_node
    _, frames, _, _ = reference
    max_age = 0.5
    assert probe.set_param('max_action_age', max_age).successful
    image = probe.raw_image(frames[0])
    start = len(probe.twists.snapshot())
    # Re-stamped on each retry: with the age limit at 0.5 s, a first frame the node is slow to
    # answer (its first inference, a loaded machine) must not leave only stale retries.
    probe.send(image, lambda: probe.twists.find(
        lambda m: m.header.stamp == image.header.stamp, start), restamp=True)
    # Zeros from before this frame (the age limit was just lowered) do not count: look only
    # after the action for this frame.
    answered = next(i for i, (_, m) in enumerate(probe.twists.snapshot())
                    if i >= start and m.header.stamp == image.header.stamp)
    # The camera stops now. A zero twist must follow once the image is max_age old.
    received, zero = probe.twists.wait_for(is_zero, start=answered + 1, timeout=5.0,
                                           what='zero twist after the camera stopped')
    delay = received - stamp_s(image.header.stamp)
    # Lower bound: not before the image went stale. Upper bound: the watchdog period
    # (0.02 s) plus scheduling and DDS slack on a loaded two-core machine.
    assert max_age - 0.05 <= delay <= max_age + 0.4, delay
    assert zero.header.frame_id == 'tool0'
    later = [m for _, m in probe.twists.snapshot()[start:] if not is_zero(m)
             and m.header.stamp != image.header.stamp]
    assert later == []
    assert node.stats_snapshot()['hold_reason'].startswith('stale observation')
    assert probe.set_param('max_action_age', 5.0).successful


def test_a_command_does_not_stand_while_the_engine_is_late(main_node, reference):
    """The camera stays fresh but the engine stops answering (a step taking seconds: a huge
    image being decoded, a stalled device): the last twist must not stand once its image is
    older than max_action_age. The watchdog holds, naming the standing command's image."""
    node, probe, _ = main_node
    _, frames, _, _ = reference
    max_age = 0.5
    assert probe.set_param('max_action_age', max_age).successful
    try:
        image = probe.raw_image(frames[0])
        start = len(probe.twists.snapshot())
        probe.send(image, lambda: probe.twists.find(
            lambda m: m.header.stamp == image.header.stamp, start))
        with _slow_steps(node, 3.0):
            # The camera keeps sending (its newest image is always fresh) until the zero.
            def zero_after_a_move():
                items = probe.twists.snapshot()[start:]
                moves = [i for i, (_, m) in enumerate(items) if not is_zero(m)]
                if not moves:
                    return None
                zeros = [i for i in range(moves[-1] + 1, len(items)) if is_zero(items[i][1])]
                return (items[moves[-1]], items[zeros[0]]) if zeros else None
            deadline = time.monotonic() + 30.0
            while zero_after_a_move() is None:
                assert time.monotonic() < deadline, 'no zero while the engine was late'
                probe.image_pub.publish(probe.raw_image(frames[1]))
                time.sleep(0.05)
            (_, last_move), (zero_time, _) = zero_after_a_move()
            reason = node.stats_snapshot()['hold_reason']
        assert reason.startswith('stale observation') and 'still standing' in reason, reason
        # Not before the command's image went stale; the watchdog period (0.02 s) plus
        # scheduling and DDS slack after.
        delay = zero_time - stamp_s(last_move.header.stamp)
        assert max_age - 0.05 <= delay <= max_age + 0.4, delay
    finally:
        # The frames sent while the engine was late are not answered into the next test.
        assert probe.call(probe.reset_client, Trigger.Request()).success
        wait_until(lambda: not node.serving.engine.has_work(), what='an idle engine')
        assert probe.set_param('max_action_age', 5.0).successful


def test_disable_publishes_zero_and_stops_actions(main_node, reference):
    node, probe, _ = main_node
    _, frames, _, _ = reference
    start = len(probe.twists.snapshot())
    called = probe.now().nanoseconds * 1e-9
    assert probe.call(probe.enable_client, SetBool.Request(data=False)).success
    probe.twists.wait_for(lambda m: is_zero(m) and stamp_s(m.header.stamp) >= called,
                          start=start, timeout=5.0, what='zero twist on disable')
    assert node.stats_snapshot()['hold_reason'] == 'disabled'
    actions_before = len(probe.actions.snapshot())
    image = probe.raw_image(frames[1])
    received = node.stats_snapshot()['frames_received']
    probe.image_pub.publish(image)
    wait_until(lambda: node.stats_snapshot()['frames_received'] > received, what='frame')
    time.sleep(0.3)    # absence check: a disabled node must not answer this frame
    assert len(probe.actions.snapshot()) == actions_before
    assert not [m for _, m in probe.twists.snapshot()[start:] if not is_zero(m)]
    assert probe.call(probe.enable_client, SetBool.Request(data=True)).success


def test_reset_service(main_node):
    node, probe, _ = main_node
    response = probe.call(probe.reset_client, Trigger.Request())
    assert response.success and 'dropped' in response.message
    assert node.stats_snapshot()['hold_reason'] == 'reset: ~/reset called'


# ---- failure injection: a policy wrapper around the real engine ------------------------------

@pytest.fixture(scope='module')
def fault_node(ros, reference, main_node):
    context, executor, probe_node = ros
    policy = WrappedPolicy(reference[0], FaultEngine)
    overrides = {'image_transport': 'compressed', 'enabled': True, 'instruction': INSTRUCTION,
                 'unnorm_key': UNNORM_KEY, 'control_period': CONTROL_PERIOD,
                 'max_linear_speed': 10.0, 'max_angular_speed': 20.0, 'max_action_age': 5.0,
                 'frame_id': 'ee_link', 'diagnostics_period': 0.2}
    node = VLASpecNode(policy, node_name='vla_spec_faults', context=context,
                       parameter_overrides=[Parameter(k, value=v) for k, v in overrides.items()])
    executor.add_node(node)
    probe = Probe(probe_node, 'vla_spec_faults', transport='compressed')
    diagnostics = Recorder(probe_node.get_clock())
    probe_node.create_subscription(DiagnosticArray, '/diagnostics', diagnostics, 10)
    yield node, policy, probe, diagnostics
    executor.remove_node(node)
    node.destroy_node()


def _compressed(probe, array, fmt, quality=90):
    return rgb_to_compressed(array, fmt, quality=quality, stamp=probe.now().to_msg())


def _send_and_get_twist(probe, msg):
    start = len(probe.twists.snapshot())
    return probe.send(msg, lambda: probe.twists.find(
        lambda m: m.header.stamp == msg.header.stamp, start))[1]


def test_compressed_png_and_jpeg_end_to_end(fault_node, reference):
    node, policy, probe, _ = fault_node
    _, frames, expected, jpeg = reference
    twist = _send_and_get_twist(probe, _compressed(probe, frames[0], 'png'))
    assert twist.header.frame_id == 'ee_link'
    np.testing.assert_allclose(twist_values(twist), expected_twist(expected['rgb'][0]),
                               rtol=1e-12)
    jpeg.header.stamp = probe.now().to_msg()
    twist = _send_and_get_twist(probe, jpeg)
    np.testing.assert_allclose(twist_values(twist), expected_twist(expected['jpeg']),
                               rtol=1e-12)


@pytest.mark.parametrize('fault, reason', [
    ('raise', 'engine error: RuntimeError: injected failure'),
    ('error', 'engine error: injected error'),
    ('nan', 'non-finite action'),
    ('invalid', 'invalid action: injected non-action token'),
])
def test_failures_publish_zero_and_report(fault_node, reference, fault, reason):
    node, policy, probe, diagnostics = fault_node
    _, frames, _, _ = reference
    msg = _compressed(probe, frames[1], 'png')
    # Every gripper command published so far has arrived (reliable QoS).
    wait_until(lambda: len(probe.grippers.snapshot()) == node.stats_snapshot()[
        'actions_published'], what='earlier gripper commands')
    num_grippers = len(probe.grippers.snapshot())
    start = len(probe.twists.snapshot())
    num_holds = node.stats_snapshot()['holds']
    policy.engine.fault = fault
    try:
        probe.send(msg, lambda: node.stats_snapshot()['holds'] > num_holds)
        _, zero = probe.twists.wait_for(
            lambda m: is_zero(m) and stamp_s(m.header.stamp) >= stamp_s(msg.header.stamp),
            start=start, what='zero twist after the failure')
    finally:
        policy.engine.fault = None
    assert zero.header.frame_id == 'ee_link'
    snapshot = node.stats_snapshot()
    assert snapshot['hold_reason'].startswith(reason), snapshot['hold_reason']
    assert not [m for _, m in probe.twists.snapshot()[start:] if not is_zero(m)]
    assert len(probe.grippers.snapshot()) == num_grippers      # gripper held: nothing sent
    # /diagnostics reports the failure as an error with its reason.
    diag_start = len(diagnostics.snapshot())

    def error_status(m):
        return any(s.name.startswith('/vla_spec_faults:') and s.level == b'\x02'
                   and any(kv.key == 'last_error' and kv.value.startswith(reason)
                           for kv in s.values) for s in m.status)
    diagnostics.wait_for(error_status, start=diag_start, what='diagnostics error')
    # The node recovers: the next frame gets a real action again.
    twist = _send_and_get_twist(probe, _compressed(probe, frames[0], 'png'))
    assert not is_zero(twist)


# ---- a pipelined engine behind the node --------------------------------------------------

def _enabled_node(ros, node_name: str, **engine_overrides):
    """A node loading 'tiny' with ``engine_overrides``, enabled with the test instruction;
    yields (node, probe) and tears the node down."""
    context, executor, probe_node = ros
    overrides = {'model_path': 'tiny', 'restrict_to_action_tokens': True, 'enabled': True,
                 'instruction': INSTRUCTION, 'unnorm_key': UNNORM_KEY,
                 'control_period': CONTROL_PERIOD, 'max_linear_speed': 10.0,
                 'max_angular_speed': 20.0, 'max_action_age': 10.0, **engine_overrides}
    node = VLASpecNode(node_name=node_name, context=context, parameter_overrides=[
        Parameter(k, value=v) for k, v in overrides.items()])
    executor.add_node(node)
    yield node, Probe(probe_node, node_name)
    executor.remove_node(node)
    node.destroy_node()


@pytest.fixture(scope='module')
def pipeline_node(ros, fault_node):
    yield from _enabled_node(ros, 'vla_spec_pipeline', mode='pipeline')


def test_warm_up_fills_the_pipeline_before_ready_and_leaves_nothing_behind(pipeline_node):
    """The node's warm-up (before ``ready``) ran a burst of 2 x max_inflight throw-away frames
    through the pipelined engine (every frame its 7 steps), and the engine is idle now: the
    first real frame meets an empty pipeline and no warm-up action is left to publish."""
    node, probe = pipeline_node
    engine = node.serving.engine
    stats = engine.strategy.stats
    max_inflight = engine.config.max_inflight
    assert not engine.has_work() and engine.strategy.scheduler.active_streams == ()
    # Burst of 14 frames, one admitted per step, 7 steps each: 14 + 6 steps, and the
    # requests per step summed over them: 14 frames x 7 steps.
    assert stats.num_steps >= 2 * max_inflight + 6
    assert stats.num_advanced >= 2 * max_inflight * 7


def test_pipeline_mode_finishes_without_new_frames_and_matches_ar(pipeline_node, reference):
    node, probe = pipeline_node
    _, frames, expected, _ = reference
    assert node.serving.engine.config.mode == 'pipeline'
    # One frame and then silence: its in-flight request must still finish (S6).
    twist = _send_and_get_twist(probe, probe.raw_image(frames[0]))
    np.testing.assert_allclose(twist_values(twist), expected_twist(expected['rgb'][0]),
                               rtol=1e-12)
    # A quick stream: every answered frame carries its own AR action (S2), the newest is
    # answered.
    stream = []
    start = len(probe.twists.snapshot())
    for i in (1, 2, 0):
        stream.append((probe.raw_image(frames[i]), expected['rgb'][i]))
        probe.image_pub.publish(stream[-1][0])
        time.sleep(0.03)
    last = stream[-1][0]
    probe.send(last, lambda: probe.twists.find(lambda m: m.header.stamp == last.header.stamp,
                                               start))
    by_stamp = {stamp_s(image.header.stamp): action for image, action in stream}
    answered = [m for _, m in probe.twists.snapshot()[start:]
                if stamp_s(m.header.stamp) in by_stamp]
    for m in answered:
        np.testing.assert_allclose(twist_values(m), expected_twist(by_stamp[stamp_s(
            m.header.stamp)]), rtol=1e-12)


def _idle_start(node, probe):
    """Waits for an idle engine; -> (twists recorded so far, frames dropped so far)."""
    wait_until(lambda: not node.serving.engine.has_work(), what='an idle engine')
    return len(probe.twists.snapshot()), node.stats_snapshot()['frames_dropped']


@contextlib.contextmanager
def _slow_steps(node, seconds: float):
    """Every engine step of ``node`` takes ``seconds`` longer while inside: a frame stays in
    flight long enough (7 steps in this mode) for what a test does meanwhile. (Holding the
    engine lock instead stops the worker wherever it happens to be, before or after it took
    a frame.)"""
    engine = node.serving.engine
    real_step = engine.step

    def slow_step():
        time.sleep(seconds)
        return real_step()
    engine.step = slow_step
    try:
        yield
    finally:
        del engine.step


def _submit(node, probe, image):
    """Publishes ``image`` (again while the best-effort subscription drops it) until the node
    has submitted it to the engine. A late duplicate may be received too (and dropped)."""
    submitted = node.stats_snapshot()['frames_submitted']
    probe.send(image, lambda: node.stats_snapshot()['frames_submitted'] > submitted)


def test_no_command_for_an_image_older_than_a_refused_frame(pipeline_node, reference):
    """A frame refused as bad input gets a zero twist, and no command for an older image
    follows it: the frame in flight when it was refused finishes its steps, and its action is
    dropped (counted), not published; the next good frame is answered as usual."""
    node, probe = pipeline_node
    _, frames, expected, _ = reference
    start, dropped = _idle_start(node, probe)
    older, bad = probe.raw_image(frames[0]), probe.raw_image(frames[1])
    bad.encoding = 'yuv422'                    # refused by the conversion
    with _slow_steps(node, 0.1):               # `older` in flight for 7 x 100 ms at least
        _submit(node, probe, older)
        probe.image_pub.publish(bad)
        _, zero = probe.twists.wait_for(is_zero, start=start,
                                        what='zero twist for the bad frame')
        assert node.serving.engine.has_work()   # `older` was still in flight then
    assert node.stats_snapshot()['hold_reason'].startswith('bad input: image encoding')
    # The next good frame is answered with its own action; the older frame's never was.
    newer = probe.raw_image(frames[2])
    twist = _send_and_get_twist(probe, newer)
    np.testing.assert_allclose(twist_values(twist), expected_twist(expected['rgb'][2]),
                               rtol=1e-12)
    stamps = [m.header.stamp for _, m in probe.twists.snapshot()[start:]]
    assert older.header.stamp not in stamps
    assert node.stats_snapshot()['frames_dropped'] >= dropped + 1    # (+ a late duplicate)


def test_no_command_for_a_frame_of_an_instruction_changed_since(pipeline_node, reference):
    """A frame in flight when the robot's instruction changes answers a question nobody asks
    any more: it is dropped from the engine at the change (counted; before, it ran to its end
    first) and never published; the next frame is answered under the new instruction."""
    node, probe = pipeline_node
    _, frames, _, _ = reference
    channel = node.serving.channels[0]
    start, dropped = _idle_start(node, probe)
    older = probe.raw_image(frames[0])
    other = 'open the drawer'
    try:
        with _slow_steps(node, 0.2):           # `older` in flight for 7 x 200 ms at least
            _submit(node, probe, older)
            assert probe.set_param('instruction', other).successful
            wait_until(lambda: channel.settings.instruction == other, what='new instruction')
            wait_until(lambda: node.stats_snapshot()['frames_dropped'] >= dropped + 1,
                       what='the older frame dropped')
            assert not node.serving.engine.has_work()   # not run to its end first
        newer = probe.raw_image(frames[2])
        twist = _send_and_get_twist(probe, newer)
        assert twist.header.stamp == newer.header.stamp
        assert older.header.stamp not in [m.header.stamp
                                          for _, m in probe.twists.snapshot()[start:]]
    finally:
        assert probe.set_param('instruction', INSTRUCTION).successful


# ---- temporal drafting behind the node ------------------------------------------------------

@pytest.fixture(scope='module')
def temporal_node(ros, pipeline_node):
    """pipeline_spec drafting with each stream's previous action (``draft_path:
    previous_action``), loaded by the node from its parameters like any drafter."""
    yield from _enabled_node(ros, 'vla_spec_temporal', mode='pipeline_spec',
                             draft_path='previous_action')


def _settled_stats(node, quiet_s=0.2, timeout_s=5.0) -> dict:
    """The node's stats once no frame's stats are still being recorded (two reads ``quiet_s``
    apart agree)."""
    deadline = time.monotonic() + timeout_s
    snapshot = node.stats_snapshot()
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        again = node.stats_snapshot()
        if (again['verify_steps'], again['accepted_tokens']) == \
                (snapshot['verify_steps'], snapshot['accepted_tokens']):
            return again
        snapshot = again
    raise AssertionError('the node\'s stats kept changing')


def test_previous_action_drafting_decides_a_repeated_frame_in_its_prefill(
        temporal_node, reference):
    """A camera showing one scene: every answer is the AR action, and once the frame's action
    is the stream's previous one, the forward that prefills the frame accepts the six drafted
    tokens it carries and adds the verifier's last one (speculative prefill): per frame one
    forward, 7 tokens. The node records a frame's stats just after publishing its twist, so
    the counters are read once they settle."""
    node, probe = temporal_node
    _, frames, expected, _ = reference
    assert type(node.serving.engine.strategy.drafter).__name__ == 'PreviousActionDrafter'
    for _ in range(2):                  # the stream's previous action becomes this frame's
        _send_and_get_twist(probe, probe.raw_image(frames[1]))
    before = _settled_stats(node)       # the second frame's stats land after its twist
    for _ in range(3):
        twist = _send_and_get_twist(probe, probe.raw_image(frames[1]))
        np.testing.assert_allclose(twist_values(twist), expected_twist(expected['rgb'][1]),
                                   rtol=1e-12)
    after = _settled_stats(node)
    assert (after['verify_steps'] - before['verify_steps'],
            after['accepted_tokens'] - before['accepted_tokens']) == (3, 21)


# ---- pure pieces of node.py -----------------------------------------------------------------

def test_latest_frame_slot():
    slot = LatestFrameSlot()
    assert slot.take(0.0) is None
    assert slot.put('a') is False
    assert slot.put('b') is True           # 'a' dropped
    assert slot.take(0.0) == 'b'
    assert slot.take(0.01) is None
    slot.put('c')
    assert slot.clear() == 1 and slot.take(0.0) is None
    got = []
    thread = threading.Thread(target=lambda: got.append(slot.take(5.0)))
    thread.start()
    slot.put('d')
    thread.join(5.0)
    assert got == ['d']
