"""Integration: the VLA node driving Meta-World through the simulator bridge over DDS.

Real rclpy nodes (VLASpecNode + SimBridgeNode) in lock-step, one short episode; a probe node in
its own rclpy Context records what the VLA node publishes on ~/action. The model is the
embedded "metaworld-demo" when it is shipped, else the random-weight "tiny" preset (greedy over
action tokens, so its actions are valid). Also `vla-spec demo`'s table / result files and one
end-to-end `demo.run`.
"""
import argparse
import importlib.util
import json
import math
import os
import threading
import time

import numpy as np
import pytest

HAS_ROS = all(importlib.util.find_spec(m) is not None
              for m in ('rclpy', 'sensor_msgs', 'geometry_msgs', 'std_srvs', 'diagnostic_msgs'))
HAS_TORCH = importlib.util.find_spec('torch') is not None

from vla_spec_ros.harness import demo  # noqa: E402  (pure Python at import)
from vla_spec_ros.harness.closed_loop import ClosedLoopReport  # noqa: E402
from vla_spec_ros.sim.demos import EpisodeResult  # noqa: E402

# Unique per module and per run (test_ros_node uses 11..50, test_launch 51..90).
DOMAIN_ID = 91 + (os.getpid() % 11)
TASK = 'button-press-topdown'
MAX_STEPS = 6


def _sim_reason():
    if not (HAS_ROS and HAS_TORCH):
        return 'needs rclpy + ROS message wheels and torch'
    os.environ.setdefault('MUJOCO_GL', 'osmesa')
    from vla_spec_ros.sim.metaworld_env import sim_unavailable_reason
    return sim_unavailable_reason()


SIM_REASON = _sim_reason()
needs_sim = pytest.mark.skipif(SIM_REASON is not None, reason=f'simulator: {SIM_REASON}')


def model_and_key():
    from vla_spec_ros.assets import embedded_checkpoint
    if embedded_checkpoint('metaworld-demo') is not None:
        return 'metaworld-demo', 'metaworld_scripted'
    return 'tiny', 'bridge_orig'


@pytest.fixture(scope='module')
def ros_domain():
    saved = {k: os.environ.get(k) for k in ('ROS_DOMAIN_ID', 'ROS_AUTOMATIC_DISCOVERY_RANGE')}
    os.environ['ROS_DOMAIN_ID'] = str(DOMAIN_ID)
    os.environ['ROS_AUTOMATIC_DISCOVERY_RANGE'] = 'LOCALHOST'
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope='module')
def policy():
    from vla_spec_ros import VLAPolicy
    model, key = model_and_key()
    return VLAPolicy.from_pretrained(model, restrict_to_action_tokens=True), key


class ActionProbe:
    """A node of its own Context recording Float64MultiArray messages on one topic."""

    def __init__(self, topic):
        import rclpy
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.node import Node
        from std_msgs.msg import Float64MultiArray

        from vla_spec_ros.ros.qos import COMMAND_QOS
        self._rclpy = rclpy
        self.context = rclpy.Context()
        rclpy.init(context=self.context)
        self.node = Node('closed_loop_probe', context=self.context)
        self.items, self._lock = [], threading.Lock()
        self.node.create_subscription(Float64MultiArray, topic, self._record, COMMAND_QOS)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self.executor.spin, daemon=True)
        self.thread.start()

    def _record(self, msg):
        with self._lock:
            self.items.append(np.array(msg.data, dtype=np.float64))

    def snapshot(self):
        with self._lock:
            return list(self.items)

    def close(self):
        self.executor.shutdown()
        self.node.destroy_node()
        self._rclpy.try_shutdown(context=self.context)
        self.thread.join(timeout=5.0)


def run_once(policy_and_key, namespace, probe_topic=None):
    from vla_spec_ros.harness.closed_loop import run_closed_loop
    policy, key = policy_and_key
    probe = ActionProbe(probe_topic) if probe_topic else None
    logs = []
    try:
        report = run_closed_loop(policy, [TASK], 1, seed=3, sim_mode='lockstep',
                                 max_steps=MAX_STEPS, unnorm_key=key, namespace=namespace,
                                 on_episode=lambda result, log: logs.append(log))
        if probe is not None:   # the last action travels to the probe on its own
            deadline = time.monotonic() + 5.0
            while len(probe.snapshot()) < report.num_actions and time.monotonic() < deadline:
                time.sleep(0.01)
        published = probe.snapshot() if probe is not None else []
    finally:
        if probe is not None:
            probe.close()
    return report, logs[0], published


@needs_sim
def test_lockstep_actions_reach_the_simulator_and_runs_are_deterministic(ros_domain, policy):
    namespace = f'/test_closed_loop_{os.getpid()}'
    report, log, published = run_once(policy, namespace + '_a', f'{namespace}_a/vla_spec/action')
    counters, result = log.counters, report.episodes[0]
    assert result.task_name == TASK and result.num_steps >= 1
    # Every step applied a received command; the env's own step counter agrees.
    assert counters.num_steps == result.num_steps == len(log.applied_actions)
    assert counters.num_commands_applied == counters.num_steps
    assert counters.num_stale_commands == 0 and not counters.is_timed_out
    assert result.is_success or result.num_steps == MAX_STEPS
    assert report.num_actions >= report.num_episode_actions >= counters.num_steps
    assert report.actions_per_s == pytest.approx(report.num_episode_actions / report.wall_s)
    assert log.end_reason in ('success', 'max_steps') and not counters.is_unanswered
    assert len(log.latencies_s) == counters.num_steps
    # What was applied is what the VLA published on ~/action (gripper: clipped to [0, 1]).
    assert published, 'the probe received no ~/action message'
    applied = np.stack(log.applied_actions)

    def matches(action):
        expected = np.r_[action[:6], np.clip(action[6], 0.0, 1.0)]
        return np.any(np.all(np.abs(applied - expected) <= 1e-12 + 1e-9 * np.abs(expected),
                             axis=1))
    assert sum(matches(a) for a in published) >= 1
    if counters.num_republished_frames == 0:     # no duplicate answers: each was applied
        assert all(matches(a) for a in published)
        if len(published) == len(applied):       # the probe saw them all: same order
            expected = np.stack([np.r_[a[:6], np.clip(a[6], 0.0, 1.0)] for a in published])
            np.testing.assert_allclose(applied, expected, rtol=1e-9, atol=1e-12)
    # Same seed, fresh nodes: the same actions in the same order.
    _, again, _ = run_once(policy, namespace + '_b')
    np.testing.assert_allclose(np.stack(again.applied_actions), applied, rtol=0, atol=1e-12)


@needs_sim
def test_lockstep_without_commands_republishes_the_same_frame_then_fails(ros_domain):
    import rclpy
    from rclpy.executors import MultiThreadedExecutor
    from rclpy.parameter import Parameter
    from sensor_msgs.msg import Image

    from vla_spec_ros.harness.sim_bridge import SimBridgeNode
    context = rclpy.Context()
    rclpy.init(context=context)
    executor = MultiThreadedExecutor(context=context)
    namespace = f'/test_bridge_alone_{os.getpid()}'
    bridge = SimBridgeNode(context=context, namespace=namespace, parameter_overrides=[
        Parameter('lockstep_timeout_s', value=0.2), Parameter('max_republish', value=3),
        Parameter('image_size', value=32), Parameter('instruction_settle_s', value=0.0)])
    stamps = []
    bridge.create_subscription(Image, f'{namespace}/sim_bridge/image',
                               lambda msg: stamps.append((msg.header.stamp.sec,
                                                          msg.header.stamp.nanosec)), 10)
    executor.add_node(bridge)
    thread = threading.Thread(target=executor.spin, daemon=True)
    thread.start()
    try:
        result = bridge.run_episode(TASK, 5, 'press the button', timeout_s=30.0)
        log = bridge.episode_log()
    finally:
        executor.shutdown()
        bridge.destroy_node()
        rclpy.try_shutdown(context=context)
        thread.join(timeout=5.0)
    assert not result.is_success and result.num_steps == 0
    # Three republications, then the episode fails long before its timeout.
    assert log.counters.is_unanswered and not log.counters.is_timed_out
    assert log.end_reason == 'unanswered' and log.wall_s < 20.0
    assert log.counters.num_steps == 0 and log.applied_actions == []
    assert log.counters.num_commands_applied == 0
    assert log.counters.num_republished_frames == 3
    assert log.counters.num_frames_published == 4
    assert len(stamps) >= 2 and len(set(stamps)) == 1      # one frame, one stamp


def _twist_msg(stamp_ns, linear):
    from geometry_msgs.msg import TwistStamped
    msg = TwistStamped()
    msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(stamp_ns, 1_000_000_000)
    msg.twist.linear.x, msg.twist.linear.y, msg.twist.linear.z = linear
    return msg


def _gripper_msg(position):
    from std_msgs.msg import Float64MultiArray
    return Float64MultiArray(data=[position])


def _frame_stamp_ns(bridge):
    """Stamp of the frame the bridge published last (its own message object)."""
    stamp = bridge._frame_msg.header.stamp
    return stamp.sec * 1_000_000_000 + stamp.nanosec


@needs_sim
def test_realtime_bridge_ignores_a_previous_episode_and_destroy_releases_a_waiter(ros_domain):
    # The bridge's callbacks are called directly (no executor): the order of events is exact.
    import rclpy
    from rclpy.parameter import Parameter

    from vla_spec_ros.harness.sim_bridge import SimBridgeNode
    context = rclpy.Context()
    rclpy.init(context=context)
    bridge = SimBridgeNode(context=context, namespace=f'/test_bridge_rt_{os.getpid()}',
                           parameter_overrides=[
                               Parameter('sim_mode', value='realtime'),
                               Parameter('control_rate_hz', value=0.1),
                               Parameter('command_timeout_s', value=60.0),
                               Parameter('image_size', value=32),
                               Parameter('instruction_settle_s', value=0.0)])
    is_destroyed, outcome = False, {}
    try:
        bridge.start_episode(TASK, 5, 'press the button')          # episode A
        bridge._on_control_tick()                                  # A's second frame
        old_stamp = _frame_stamp_ns(bridge)
        bridge.start_episode(TASK, 6, 'press the button')          # episode B
        first_stamp = _frame_stamp_ns(bridge)
        # A late answer to episode A: neither its twist nor its gripper moves the arm.
        bridge._on_twist(_twist_msg(old_stamp, (0.05, 0.0, 0.0)))
        bridge._on_gripper(_gripper_msg(0.0))
        bridge._on_control_tick()
        log = bridge.episode_log()
        np.testing.assert_array_equal(log.applied_actions[-1], np.r_[np.zeros(6), 1.0])
        assert log.counters.num_stale_commands == 1 and log.latencies_s == []
        # The answer to B's first frame is applied, and its latency recorded.
        bridge._on_twist(_twist_msg(first_stamp, (0.05, 0.0, 0.0)))
        bridge._on_gripper(_gripper_msg(0.25))
        bridge._on_control_tick()
        log = bridge.episode_log()
        np.testing.assert_allclose(log.applied_actions[-1],
                                   np.r_[0.05 * 0.2, np.zeros(5), 0.25], rtol=1e-12)
        assert log.counters.num_commands_applied == 1 and len(log.latencies_s) == 1
        bridge.stop_episode()
        assert bridge.episode_log().counters.num_other_answers == 1
        assert bridge.episode_log().end_reason == 'stopped'

        def wait_for_episode():
            outcome['result'] = bridge.run_episode(TASK, 7, 'press the button', 600.0)
        waiter = threading.Thread(target=wait_for_episode, daemon=True)
        waiter.start()
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline:          # until episode C has published a frame
            log = bridge.episode_log()
            if log.result is None and log.counters.num_frames_published >= 1:
                break
            time.sleep(0.01)
        bridge.destroy_node()
        is_destroyed = True
        waiter.join(timeout=10.0)
        assert not waiter.is_alive(), 'destroy_node did not release run_episode'
    finally:
        if not is_destroyed:
            bridge.destroy_node()
        rclpy.try_shutdown(context=context)
    assert outcome['result'].seed == 7 and not outcome['result'].is_success


@needs_sim
def test_realtime_steps_at_the_control_rate_with_fresh_or_zero_commands(ros_domain, policy):
    from vla_spec_ros.harness.closed_loop import run_closed_loop
    model_policy, key = policy
    logs = []
    report = run_closed_loop(model_policy, [TASK], 1, seed=4, sim_mode='realtime',
                             control_rate_hz=10.0, max_steps=MAX_STEPS, unnorm_key=key,
                             on_episode=lambda result, log: logs.append(log))
    counters = logs[0].counters
    assert counters.num_steps == report.episodes[0].num_steps == MAX_STEPS
    assert counters.num_commands_applied + counters.num_stale_commands == MAX_STEPS
    assert counters.num_commands_applied >= 1
    # A timer at 10 Hz: MAX_STEPS periods, give or take scheduling on a loaded machine.
    assert 0.5 * MAX_STEPS / 10.0 <= logs[0].wall_s <= MAX_STEPS / 10.0 + 2.0


def fake_report(mode, r, rate, acceptance):
    forwards = 7.0 if math.isnan(acceptance) else 7.0 / acceptance
    episodes = [EpisodeResult(TASK, 1, 'press the button', rate > 0.5, 10),
                EpisodeResult('drawer-open', 2, 'open the drawer', False, 150)]
    return ClosedLoopReport(mode, r, 'lockstep', 10.0, episodes=episodes, success_rate=rate,
                            success_rate_per_task={TASK: 1.0, 'drawer-open': 0.0},
                            num_actions=160, num_steps=160, wall_s=8.0, actions_per_s=20.0,
                            latency_p50_ms=12.34, latency_p99_ms=56.78,
                            acceptance_length=acceptance, forwards_per_action=forwards)


def test_demo_table_and_result_files(tmp_path, monkeypatch, capsys):
    reports = [fake_report('ar', 0, 0.5, math.nan), fake_report('spec', 0, 0.5, 2.5),
               fake_report('spec', 4, 0.25, 3.5)]
    expert = {'success_rate': 1.0, 'per_task': {TASK: 1.0, 'drawer-open': 1.0},
              'num_episodes': 4}
    table = demo.format_table(reports, [TASK, 'drawer-open'], expert)
    lines = table.strip().splitlines()
    assert lines[0].startswith('| mode | r | success | button-press-topdown | drawer-open |')
    assert lines[2].startswith('| expert | - | 1.00 | 1.00 | 1.00 |')
    assert lines[3] == '| ar | 0 | 0.50 | 1.00 | 0.00 | 20.00 | 12.3 | 56.8 | - | 7.00 | 2 |'
    assert '| spec | 4 | 0.25 |' in lines[5] and '| 3.50 | 2.00 | 2 |' in lines[5]
    record = {'command': 'vla-spec demo --episodes 2', 'created': 'now', 'model': 'tiny',
              'sim_mode': 'lockstep', 'control_rate_hz': 10.0, 'max_steps': 150,
              'episodes': 2, 'seed': 0, 'machine': {'cpu_count': 2}}
    monkeypatch.setitem(__import__('sys').modules, 'matplotlib', None)   # not installed
    paths = demo.write_results(tmp_path, record, reports, [TASK, 'drawer-open'], expert)
    assert paths['png'] is None
    assert 'matplotlib is not installed' in capsys.readouterr().out
    text = paths['json'].read_text()
    assert 'NaN' not in text                 # strict JSON: nothing measured is null
    data = json.loads(text)
    assert data['command'] == record['command'] and data['expert'] == expert
    assert data['rows'][0]['acceptance_length'] is None
    assert [(row['mode'], row['relax_threshold']) for row in data['rows']] == [
        ('ar', 0), ('spec', 0), ('spec', 4)]
    assert data['rows'][2]['episodes'][1]['task_name'] == 'drawer-open'
    text = paths['md'].read_text()
    assert '`vla-spec demo --episodes 2`' in text and table in text


def test_demo_configurations_expand_thresholds_for_speculative_modes_only():
    assert demo.configurations(['ar', 'spec', 'pipeline_spec'], [0, 2]) == [
        ('ar', 0), ('spec', 0), ('spec', 2), ('pipeline_spec', 0), ('pipeline_spec', 2)]
    with pytest.raises(ValueError, match='--modes'):
        demo.configurations(['fast'], [0])
    with pytest.raises(ValueError, match='--modes'):
        demo.configurations(['ar', 'spec', 'ar'], [0])
    with pytest.raises(ValueError, match='--relax-thresholds'):
        demo.configurations(['spec'], [2, 0, 2])


def test_closed_loop_rate_and_step_limits():
    from vla_spec_ros.harness.closed_loop import (
        MAX_EPISODE_STEPS, check_control_rate, check_max_steps, control_rate_range)
    assert control_rate_range() == (0.1, 1000.0)     # the node's control_period: [1 ms, 10 s]
    assert check_control_rate(0.1) == 0.1 and check_control_rate(1000) == 1000.0
    for bad in (0.05, 1001.0, math.nan, math.inf, True, '10'):
        with pytest.raises(ValueError, match='rate_hz'):
            check_control_rate(bad, 'rate_hz')
    assert check_max_steps(MAX_EPISODE_STEPS) == MAX_EPISODE_STEPS == 500
    for bad in (0, MAX_EPISODE_STEPS + 1, 10.0, True):
        with pytest.raises(ValueError, match='steps'):
            check_max_steps(bad, 'steps')


@pytest.mark.skipif(not HAS_TORCH, reason='demo.run imports torch')
@pytest.mark.parametrize('argv, option', [
    (['--tasks', 'drawer-open,drawer-open-v3'], '--tasks'),
    (['--modes', 'ar,ar'], '--modes'),
    (['--relax-thresholds', '2,2'], '--relax-thresholds'),
    (['--control-rate-hz', '0.01'], '--control-rate-hz'),
    (['--control-rate-hz', '2000'], '--control-rate-hz'),
    (['--max-steps', '501'], '--max-steps'),
])
def test_demo_rejects_bad_options_before_loading_anything(argv, option, monkeypatch):
    from vla_spec_ros.policy import VLAPolicy

    def refuse(*args, **kwargs):
        raise AssertionError('a policy was loaded before the options were checked')
    monkeypatch.setattr(VLAPolicy, 'from_pretrained', refuse)
    monkeypatch.setattr(demo, '_expert_rates', refuse)
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    args = parser.parse_args(argv + ['--expert'])
    with pytest.raises(ValueError, match=option):
        demo.run(args)


@needs_sim
def test_demo_run_end_to_end(ros_domain, tmp_path):
    pytest.importorskip('matplotlib', reason='the plot needs matplotlib')
    model, key = model_and_key()
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    args = parser.parse_args(['--model', model, '--unnorm-key', key, '--tasks', TASK,
                              '--episodes', '1', '--max-steps', '3', '--modes', 'ar,spec',
                              '--relax-thresholds', '0,2', '--draft-path', 'random',
                              '--restrict-to-action-tokens', '--expert', '--out',
                              str(tmp_path)])
    args.argv = ['demo', '--model', model]
    assert demo.run(args) == 0
    (json_file,) = tmp_path.glob('demo-*.json')
    data = json.loads(json_file.read_text())
    assert [(r['mode'], r['relax_threshold']) for r in data['rows']] == [
        ('ar', 0), ('spec', 0), ('spec', 2)]
    for row in data['rows']:
        assert len(row['episodes']) == 1 and row['num_steps'] >= 1
        assert row['num_timeouts'] == 0 and row['num_unanswered'] == 0
    assert data['rows'][0]['acceptance_length'] is None        # not measured: null
    for row in data['rows'][1:]:
        assert row['acceptance_length'] >= 1.0
        if row['num_republished_frames'] == 0:
            # Lock-step keeps one request in flight, every verifier forward decides
            # acceptance-length tokens: the node's statistic and the engine's counter agree.
            assert row['acceptance_length'] * row['forwards_per_action'] == pytest.approx(7.0)
    assert data['command'] == f'vla-spec demo --model {model}'
    assert data['expert']['num_episodes'] == 1 and set(data['expert']['per_task']) == {TASK}
    assert (json_file.with_suffix('.png')).stat().st_size > 0
    text = json_file.with_suffix('.md').read_text()
    assert text.count('| spec |') == 2 and '| expert | - |' in text
