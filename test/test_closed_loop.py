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

from vla_spec_ros.harness import (demo, demo_options, demo_placement, demo_report,  # noqa: E402
                                  demo_results, demo_tables)

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


def _second_model():
    from vla_spec_ros.assets import embedded_checkpoint
    return 'metaworld-demo-fast' if embedded_checkpoint('metaworld-demo-fast') else 'none'


SECOND_MODEL = _second_model()


def model_and_key():
    from vla_spec_ros.assets import embedded_checkpoint
    if embedded_checkpoint('metaworld-demo') is not None:
        return 'metaworld-demo', 'metaworld_scripted'
    return 'tiny', 'bridge_orig'


@pytest.fixture(scope='module')
def ros_domain():
    from ros_probe import ros_domain_environment
    with ros_domain_environment(DOMAIN_ID):
        yield


@pytest.fixture(scope='module')
def policy():
    from vla_spec_ros import VLAPolicy
    model, key = model_and_key()
    return VLAPolicy.from_pretrained(model, restrict_to_action_tokens=True), key


def action_probe(topic):
    """Every Float64MultiArray on `topic` as a float64 array (a node of its own Context)."""
    from std_msgs.msg import Float64MultiArray

    from ros_probe import TopicProbe
    from vla_spec_ros.ros.qos import COMMAND_QOS
    return TopicProbe('closed_loop_probe', Float64MultiArray, topic, COMMAND_QOS,
                      lambda msg, node: np.array(msg.data, dtype=np.float64))


def run_once(policy_and_key, namespace, probe_topic=None):
    from vla_spec_ros.harness.closed_loop import run_closed_loop
    policy, key = policy_and_key
    probe = action_probe(probe_topic) if probe_topic else None
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
@pytest.mark.parametrize('frames, hold', [('every', 'previous'), ('one_in_flight', 'zero')])
def test_delayed_lockstep_over_dds_applies_what_the_in_process_path_applies(
        ros_domain, policy, frames, hold):
    # d = 2 through the real node and the bridge, then the same episode in process
    # (harness.inprocess, as the demo's delay sweep runs it): the same actions, period by period.
    from vla_spec_ros.harness import inprocess
    from vla_spec_ros.harness.closed_loop import run_closed_loop
    model_policy, key = policy
    logs = []
    report = run_closed_loop(model_policy, [TASK], 1, seed=3, max_steps=MAX_STEPS,
                             unnorm_key=key, namespace=f'/test_delay_{os.getpid()}_{frames}',
                             action_delay=2, delay_hold=hold, delay_frames=frames,
                             on_episode=lambda result, log: logs.append(log))
    counters = logs[0].counters
    assert report.action_delay == 2 and not counters.is_unanswered
    assert counters.num_steps == report.episodes[0].num_steps == len(logs[0].applied_actions)
    # Holds: the first two periods, and with one frame in flight every other period after.
    expected_held = 2 if frames == 'every' else counters.num_steps - (counters.num_steps - 1) // 2
    assert counters.num_stale_commands == expected_held
    assert counters.num_commands_applied == counters.num_steps - expected_held
    (point,) = inprocess.run_sweep(
        [inprocess.SweepPoint(action_delay=2, delay_hold=hold, delay_frames=frames)], [TASK],
        1, model=model_and_key()[0], unnorm_key=key, seed=3, max_steps=MAX_STEPS,
        progress=False, keep_actions=True, engine_options={'restrict_to_action_tokens': True})
    (applied, tokens), = point.details
    assert point.episodes == report.episodes
    np.testing.assert_allclose(np.array(applied), np.stack(logs[0].applied_actions),
                               rtol=1e-9, atol=1e-12)
    assert len(tokens) == point.num_actions == counters.num_frames_published


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


def episode(task, seed, ok, steps):
    return {'task_name': task, 'seed': seed, 'instruction': 'x', 'is_success': ok,
            'num_steps': steps}


def lockstep_row(mode, r, episodes, p50=20.0, mean=25.0, acceptance=None):
    rate = sum(e['is_success'] for e in episodes) / len(episodes)
    return {'mode': mode, 'relax_threshold': r, 'episodes': episodes, 'success_rate': rate,
            'success_rate_per_task': {TASK: rate}, 'actions_per_s': 12.0,
            'latency_p50_ms': p50, 'latency_p99_ms': 2 * p50, 'latency_mean_ms': mean,
            'node_actions_per_s': 1e3 / mean, 'acceptance_length': acceptance,
            'forwards_per_action': 7.0 if acceptance is None else 7.0 / acceptance}


def sweep_point(success, steps_per_task=None, **point):
    base = {'mode': 'ar', 'relax_threshold': 0, 'tree_depth': None, 'tree_top_k': None,
            'tree_max_nodes': None, 'action_delay': 0, 'delay_hold': 'previous',
            'delay_frames': 'every', 'compare_ar': False}
    base.update(point)
    return {'point': base, 'episodes': [episode(TASK, 1, success > 0.5, 10)],
            'success_rate': success, 'success_rate_per_task': {TASK: success},
            'num_token_mismatches': point.pop('mismatches', 0), 'acceptance_length': None,
            'forwards_per_action': 7.0, 'bin_distance_counts': []}


def demo_record():
    """A recorded run of every part, small enough to check each number by hand."""
    same = [episode(TASK, 1, True, 40), episode(TASK, 2, False, 150)]
    other = [episode(TASK, 1, True, 40), episode(TASK, 2, True, 90)]
    delay = [sweep_point(1.0), sweep_point(0.9, action_delay=1), sweep_point(0.7, action_delay=2),
             sweep_point(0.3, action_delay=4), sweep_point(0.5, action_delay=2,
                                                           delay_frames='one_in_flight'),
             sweep_point(0.1, action_delay=4, delay_frames='one_in_flight')]
    relax = []
    for r, success, acceptance, counts, mismatches in (
            (0, 1.0, 2.6, [[10, 0, 0]] * 7, 0), (8, 0.5, 3.2, [[8, 1, 1]] * 7, 14)):
        point = sweep_point(success, relax_threshold=r, mode='spec', compare_ar=True,
                            tree_depth=6, tree_top_k=1, tree_max_nodes=7)
        point.update(acceptance_length=acceptance, forwards_per_action=7.0 / acceptance,
                     bin_distance_counts=counts, num_token_mismatches=mismatches)
        relax.append(point)
    bench = [{'mode': m, 'actions_per_s': a, 'ratio_vs_hf': a / 20.0, 'latency_p50_ms': 40.0,
              'forwards_per_action': f, 'acceptance_length': 1.0}
             for m, a, f in (('hf', 20.0, math.nan), ('ar', 30.0, 7.0), ('pipeline', 50.0, 1.2))]
    paced = {'30.0': {'ar': {'latency_p50_ms': 45.0, 'answered_fraction': 0.6},
                      'pipeline': {'latency_p50_ms': 25.0, 'answered_fraction': 1.0}}}
    return {'command': 'vla-spec demo --episodes 2', 'created': 'now', 'model': 'tiny',
            'tasks': [TASK], 'seed': 0, 'max_steps': 150, 'dtype': 'float32', 'device': 'cpu',
            'parts': list(demo_options.PARTS), 'machine': {'cpu_count': 2}, 'wall_s': 12.0,
            'lockstep': {'episodes': 2, 'sim_mode': 'lockstep', 'control_rate_hz': 10.0,
                         'expert': {'success_rate': 1.0, 'per_task': {TASK: 1.0},
                                    'num_episodes': 2},
                         'rows': [lockstep_row('ar', 0, same, p50=30.0),
                                  lockstep_row('pipeline', 0, same, p50=70.0),
                                  lockstep_row('spec', 0, other, acceptance=2.5)]},
            'speed': {'bench_rows': bench, 'bench_frames': 10, 'paced': paced},
            'delay': {'episodes': 1, 'hold': 'previous', 'mode': 'ar', 'path': 'in process',
                      'points': delay},
            'relax': {'episodes': 1, 'mode': 'spec', 'tree': [6, 1, 7], 'path': 'in process',
                      'points': relax}}


def table_rows(text, first_cell):
    return [[c.strip() for c in line.strip('|').split('|')] for line in text.splitlines()
            if line.startswith(f'| {first_cell} |')]


def test_demo_lockstep_table_compares_strict_modes_with_ar_and_labels_speeds():
    record = demo_record()
    table = demo_tables.format_lockstep_table(record)
    assert 'lock-step steps/s (simulator-bound)' in table.splitlines()[0]
    assert table_rows(table, 'expert')[0][:3] == ['expert', '-', '1.00']
    (ar,), (pipeline,), (spec,) = (table_rows(table, m) for m in ('ar', 'pipeline', 'spec'))
    assert ar[3] == '-' and pipeline[3] == 'yes' and spec[3] == 'no (1 differ)'
    # steps/s, node latency p50 / p99, node actions/s = 1000 / mean ms, model-only (bench).
    assert pipeline[4:8] == ['12.0', '70.0 / 140.0', '40.0', '50.0']
    assert spec[7] == '-' and spec[8:10] == ['2.50', '2.80']


def test_demo_places_each_mode_on_the_delay_curve():
    record = demo_record()
    curve = demo_placement.delay_curve(record)
    assert curve['every'] == {0: 1.0, 1: 0.9, 2: 0.7, 4: 0.3}
    assert curve['one_in_flight'] == {0: 1.0, 1: 0.9, 2: 0.5, 4: 0.1}
    assert demo_placement.success_at(curve, 'every', 3) == (pytest.approx(0.5), '~')
    assert demo_placement.success_at(curve, 'every', 9) == (0.3, '>')
    places = {p['mode']: p for p in demo_placement.placements(record)}
    # ar answered 60% of the 30 Hz frames: one in flight; 45 ms = 1.35 periods -> d = 2.
    assert places['ar']['frames'] == 'one_in_flight'
    assert places['ar']['model'] == {'latency_p50_ms': 45.0, 'delay': 2, 'success': 0.5,
                                     'mark': ''}
    # On the node (lock-step p50 30 ms): 0.9 periods -> d = 1.
    assert places['ar']['node']['delay'] == 1 and places['ar']['node']['success'] == 0.9
    # pipeline keeps up: every frame; 25 ms -> d = 1 (model), 70 ms -> d = 3 (node, ~0.5).
    assert places['pipeline']['frames'] == 'every'
    assert places['pipeline']['model']['delay'] == 1
    assert places['pipeline']['node']['delay'] == 3
    assert places['pipeline']['node']['success'] == pytest.approx(0.5)
    assert places['pipeline']['node']['mark'] == '~'
    text = demo_tables.format_delay_table(record)
    assert table_rows(text, '2')[0][:4] == ['2', '0.70', '0.50', '67']


def test_demo_report_files_and_report_again(tmp_path, monkeypatch, capsys):
    record = demo_record()
    text = demo_report.format_report(record)
    for title in ('Lock-step through', 'Model only', 'action delay', 'Relaxed acceptance'):
        assert title in text
    relax = demo_tables.format_relax_table(record)
    assert relax in text
    (r0,), (r8,) = table_rows(relax, '0'), table_rows(relax, '8')
    assert r0[1:6] == ['1.00', '2.60', '2.69', '0.0%', '0'] and r8[4:6] == ['20.0%', '2']
    with_plots = importlib.util.find_spec('matplotlib') is not None
    paths = demo_results.write_results(tmp_path, record, 'demo-x')
    assert (paths['delay_png'] is not None) == (paths['relax_png'] is not None) == with_plots
    data = json.loads(paths['json'].read_text())       # strict JSON: NaN written as null
    assert data['speed']['bench_rows'][0]['forwards_per_action'] is None
    assert '`vla-spec demo --episodes 2`' in paths['md'].read_text()
    monkeypatch.setitem(__import__('sys').modules, 'matplotlib', None)     # not installed
    parser = argparse.ArgumentParser()
    demo_options.add_arguments(parser)
    assert demo.run(parser.parse_args(['--report', str(paths['json'])])) == 0
    out = capsys.readouterr().out
    assert 'matplotlib is not installed' in out
    assert demo_tables.format_lockstep_table(record) in out
    # Another run's latencies placed on this run's curve: <name>-placed-<other name>.*
    other = demo_record()
    other['speed']['paced']['30.0']['ar']['latency_p50_ms'] = 100.0      # 3 periods
    del other['lockstep'], other['delay'], other['relax']
    other_file = tmp_path / 'other.json'
    other_file.write_text(json.dumps(demo_results._nan_to_none(other)))
    args = parser.parse_args(['--report', str(paths['json']), '--latencies-from',
                              str(other_file)])
    assert demo.run(args) == 0
    placed = json.loads((tmp_path / 'demo-x-placed-other.json').read_text())
    assert placed['latencies_from']['file'] == 'other.json' and 'lockstep' not in placed
    (ar,) = [p for p in demo_placement.placements(placed) if p['mode'] == 'ar']
    assert ar['model']['delay'] == 3 and 'node' not in ar
    assert 'Latencies (stream, speed and lock-step parts) from other.json' in (
        tmp_path / 'demo-x-placed-other.md').read_text()
    with pytest.raises(ValueError, match='--latencies-from'):
        demo.run(parser.parse_args(['--latencies-from', str(other_file)]))


def test_demo_defaults_are_the_quick_run_and_full_is_everything():
    parser = argparse.ArgumentParser()
    demo_options.add_arguments(parser)
    plan = demo_options.resolve_options(parser.parse_args([]))
    assert plan['parts'] == ['stream', 'lockstep', 'speed', 'delay']
    assert (plan['stream_hz'], plan['stream_seconds']) == (30.0, 10.0)
    assert (plan['episodes'], plan['delay_episodes']) == (1, 1)
    assert plan['delays'] == [0, 1, 2, 4, 8] and plan['one_in_flight_delays'] == [2, 4, 8]
    assert plan['configs'] == [('ar', 0), ('pipeline', 0), ('spec', 0), ('pipeline_spec', 0)]
    full = demo_options.resolve_options(parser.parse_args(['--full', '--one-in-flight-delays',
                                                           'none']))
    assert full['parts'] == list(demo_options.PARTS) and full['one_in_flight_delays'] == []
    assert full['episodes'] == full['delay_episodes'] == full['relax_episodes'] == 20
    assert full['relax_tree'] == [6, 1, 7] and full['relax_sweep'] == [0, 2, 8, 32, 64, 128, 255]


def test_demo_second_model_pass_is_the_equivalent_standalone_command():
    from vla_spec_ros.harness.demo_second import second_model_args, second_model_argv
    parser = argparse.ArgumentParser()
    demo_options.add_arguments(parser)
    args = parser.parse_args(['--tasks', 'drawer-open', '--episodes', '3', '--rates', '10,30'])
    assert args.second_model == 'auto' and args.model == 'metaworld-demo'   # the main job
    argv = second_model_argv(args, demo_options.resolve_options(args))
    assert argv[:11] == ['demo', '--model', 'metaworld-demo-fast', '--parts',
                         'stream,lockstep,speed', '--modes', 'ar,pipeline_spec', '--sim-mode',
                         'realtime', '--chunk-blend', 'ensemble']
    second = second_model_args(argv)
    plan = demo_options.resolve_options(second)
    assert plan['tasks'] == ['drawer-open'] and plan['episodes'] == 3
    assert plan['rates'] == [10.0, 30.0] and plan['chunk_blend'] == 'ensemble'
    third = second_model_argv(second, plan)            # the reasoning model after it
    assert second.argv == argv and third[:11] == [
        'demo', '--model', 'metaworld-demo-reason', '--parts', 'stream,lockstep,speed',
        '--modes', 'ar,pipeline_spec', '--sim-mode', 'realtime', '--chunk-blend', 'latest']
    assert second_model_argv(second_model_args(third), plan) is None     # the chain's end
    for changes in (['--second-model', 'none'], ['--model', 'metaworld-demo-reason'],
                    ['--parts', 'delay'], ['--model', 'tiny'],
                    ['--model', 'metaworld-demo-fast', '--second-model', 'metaworld-demo-fast']):
        other = parser.parse_args(changes)
        assert second_model_argv(other, demo_options.resolve_options(other)) is None


def test_demo_configurations_expand_thresholds_for_speculative_modes_only():
    assert demo_options.configurations(['ar', 'spec', 'pipeline_spec'], [0, 2]) == [
        ('ar', 0), ('spec', 0), ('spec', 2), ('pipeline_spec', 0), ('pipeline_spec', 2)]
    with pytest.raises(ValueError, match='--modes'):
        demo_options.configurations(['fast'], [0])
    with pytest.raises(ValueError, match='--modes'):
        demo_options.configurations(['ar', 'spec', 'ar'], [0])
    with pytest.raises(ValueError, match='--relax-thresholds'):
        demo_options.configurations(['spec'], [2, 0, 2])


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
    (['--parts', 'lockstep,fast'], '--parts'),
    (['--delays', '0,-1'], '--delays'),
    (['--delays', '0,x'], '--delays'),
    (['--one-in-flight-delays', '1'], '--one-in-flight-delays'),
    (['--rates', '30,30'], '--rates'),
    (['--rates', '5000'], '--rates'),
    (['--relax-tree', '6,1'], '--relax-tree'),
    (['--relax-tree', '6,1,600'], '--relax-tree'),
    (['--relax-sweep', '0,300'], '--relax-sweep'),
    (['--episodes', '0'], '--episodes'),
    (['--workers', '0'], '--workers'),
])
def test_demo_rejects_bad_options_before_loading_anything(argv, option, monkeypatch):
    from vla_spec_ros.policy import VLAPolicy

    def refuse(*args, **kwargs):
        raise AssertionError('a policy was loaded before the options were checked')
    monkeypatch.setattr(VLAPolicy, 'from_pretrained', refuse)
    monkeypatch.setattr(demo, '_expert_rates', refuse)
    monkeypatch.setattr(demo, '_unnorm_key', refuse)
    parser = argparse.ArgumentParser()
    demo_options.add_arguments(parser)
    args = parser.parse_args(argv + ['--expert'])
    with pytest.raises(ValueError, match=option):
        demo.run(args)


@needs_sim
def test_demo_run_end_to_end(ros_domain, tmp_path, capsys):
    model, key = model_and_key()
    parser = argparse.ArgumentParser()
    demo_options.add_arguments(parser)
    args = parser.parse_args(['--model', model, '--unnorm-key', key, '--tasks', TASK,
                              '--parts', 'stream,lockstep,speed,delay,relax', '--episodes', '1',
                              '--stream-seconds', '1',
                              '--max-steps', '3', '--modes', 'ar,spec', '--delays', '0,2',
                              '--rates', '30', '--speed-frames', '3', '--relax-sweep', '0,8',
                              '--relax-episodes', '1', '--workers', '1', '--draft-path',
                              'random', '--restrict-to-action-tokens', '--expert', '--out',
                              str(tmp_path), '--second-model', SECOND_MODEL])
    args.argv = ['demo', '--model', model]
    assert demo.run(args) == 0
    out = capsys.readouterr().out
    json_files = sorted(tmp_path.glob('demo-*.json'), key=lambda f: f.stat().st_mtime)
    json_file = json_files[0]
    data = json.loads(json_file.read_text())
    if SECOND_MODEL != 'none':
        # The second model's pass: its own record, with its standalone command, AR and the
        # default mode through the node in real time with the ensemble blend.
        from vla_spec_ros.assets import embedded_checkpoint
        third = 'metaworld-demo-reason' if embedded_checkpoint('metaworld-demo-reason') else None
        assert len(json_files) == (3 if third else 2)
        second = json.loads(json_files[1].read_text())
        assert second['model'] == SECOND_MODEL and second['parts'] == [
            'stream', 'lockstep', 'speed']
        assert second['command'].startswith(f'vla-spec demo --model {SECOND_MODEL} ')
        assert '--sim-mode realtime --chunk-blend ensemble' in second['command']
        rows = second['lockstep']['rows']
        assert [(r['mode'], r['chunk_blend'], r['action_chunk']) for r in rows] == [
            ('ar', 'ensemble', 8), ('pipeline_spec', 'ensemble', 8)]
        assert all(r['num_steps'] >= 1 and r['num_timeouts'] == 0 for r in rows)
        assert [r['mode'] for r in second['stream']['rows']] == ['ar', 'pipeline_spec', 'hf']
        assert [b['mode'] for b in second['speed']['bench_rows']] == [
            'hf', 'ar', 'pipeline_spec']
        assert second['speed']['drafter']['pipeline_spec'] == \
            'previous action + shifted chunk'
        assert f'# The next model: vla-spec demo --model {SECOND_MODEL}' in out
        # The chain ends with one table of every model (from the records it wrote).
        from vla_spec_ros.harness.demo_rollup import format_rollup
        assert format_rollup([json.loads(f.read_text()) for f in json_files]) in out
        if third:
            # Then the reasoning model: single-step, the node's default blend, its draft.
            reason = json.loads(json_files[2].read_text())
            assert reason['model'] == third
            assert f'# The next model: vla-spec demo --model {third}' in out
            assert '--sim-mode realtime --chunk-blend latest' in reason['command']
            assert [(r['mode'], r['action_chunk']) for r in reason['lockstep']['rows']] == [
                ('ar', 1), ('pipeline_spec', 1)]
            assert all(r['num_timeouts'] == 0 for r in reason['lockstep']['rows'])
            assert [b['mode'] for b in reason['speed']['bench_rows']] == [
                'hf', 'ar', 'pipeline_spec']
    else:
        assert len(json_files) == 1
    assert data['command'] == f'vla-spec demo --model {model}'
    rows = data['lockstep']['rows']
    assert [(r['mode'], r['relax_threshold']) for r in rows] == [('ar', 0), ('spec', 0)]
    for row in rows:
        assert len(row['episodes']) == 1 and row['num_steps'] >= 1
        assert row['num_timeouts'] == 0 and row['num_unanswered'] == 0
    assert rows[0]['acceptance_length'] is None        # not measured: null
    if rows[1]['num_republished_frames'] == 0:
        # Lock-step keeps one request in flight, every verifier forward decides
        # acceptance-length tokens: the node's statistic and the engine's counter agree.
        assert rows[1]['acceptance_length'] * rows[1]['forwards_per_action'] == \
            pytest.approx(7.0)
    assert [b['mode'] for b in data['speed']['bench_rows']] == ['hf', 'ar', 'spec']
    assert data['speed']['bench_frame_source'] == 'metaworld-episodes'
    stream = data['stream']
    assert [(r['mode'], r['where']) for r in stream['rows']] == [
        ('ar', 'ROS 2 node (DDS)'), ('spec', 'ROS 2 node (DDS)'),
        ('hf', 'model only (not on the node)')]
    assert stream['num_frames'] == 30 and all(r['num_answered'] > 0 for r in stream['rows'])
    assert stream['rows'][1]['drafter'] == 'random' and not stream['rows'][1]['is_default']
    assert 'the default configuration was not run' in out
    assert set(data['speed']['paced']['30.0']) == {'hf', 'ar', 'spec'}   # HF placed too
    delays = [(p['point']['action_delay'], p['point']['delay_frames'])
              for p in data['delay']['points']]
    assert delays == [(0, 'every'), (2, 'every'), (2, 'one_in_flight')]
    # d = 0 in process and the ROS lock-step run: the same AR episode.
    assert data['delay']['points'][0]['episodes'] == rows[0]['episodes']
    relax = data['relax']['points']
    assert [p['point']['relax_threshold'] for p in relax] == [0, 8]
    assert relax[0]['num_token_mismatches'] == 0          # strict: AR's tokens
    assert data['lockstep']['expert']['num_episodes'] == 1
    for name in ('delay', 'relax'):
        png = json_file.with_name(f'{json_file.stem}-{name}.png')
        assert png.stat().st_size > 0 or importlib.util.find_spec('matplotlib') is None
    assert 'same episodes as AR' in out and 'results: ' in out


@needs_sim
def test_node_parameters_reach_the_node_and_matched_ones_are_refused(ros_domain, policy):
    """`node_parameters` go to the VLA node, which validates them like any start (a bad
    chunk_blend is refused by the node, naming it); the harness's matched parameters cannot be
    overridden."""
    from vla_spec_ros.harness.closed_loop import run_closed_loop
    model_policy, key = policy
    namespace = f'/test_closed_loop_params_{os.getpid()}'
    with pytest.raises(ValueError, match='control_period'):
        run_closed_loop(model_policy, [TASK], 1, seed=3, max_steps=2, unnorm_key=key,
                        namespace=namespace + '_a', node_parameters={'control_period': 0.5})
    with pytest.raises(ValueError, match='chunk_blend'):
        run_closed_loop(model_policy, [TASK], 1, seed=3, max_steps=2, unnorm_key=key,
                        namespace=namespace + '_b', node_parameters={'chunk_blend': 'mean'})
    report = run_closed_loop(model_policy, [TASK], 1, seed=3, max_steps=2, unnorm_key=key,
                             namespace=namespace + '_c',
                             node_parameters={'chunk_blend': 'ensemble'})
    assert report.chunk_blend == 'ensemble' and len(report.episodes) == 1
