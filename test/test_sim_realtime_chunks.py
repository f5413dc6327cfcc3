"""Real time through the node: the bridge's camera delay and tick monitor (pure Python), then a
chunked policy driving Meta-World through a real VLA node and the simulator bridge over DDS
with a camera delay, and the closed loop's refusal of lock-step for a chunked policy."""
import dataclasses
import os
import statistics

import pytest

from machine_pace import control_rate_for
from vla_spec_ros.sim.answer_pairing import AnswerPairs, FrameRegistry
from vla_spec_ros.sim.bridge_settings import MAX_CAMERA_DELAY, BridgeSettings, check_camera_delay
from vla_spec_ros.sim.realtime_clock import (
    LATE_TICK_PERIODS, DelayedCamera, RealtimeCommand, TickMonitor, answer_lag, due_stamp_ns)

# Unique per module and per run (other modules use 1..230).
DOMAIN_ID = 231 + (os.getpid() % 2)
TASK = 'button-press-topdown'
INSTRUCTION = 'press the button down'    # for timing only: the rate's measurement
K = 4


def test_camera_publishes_each_frame_d_periods_after_capture_in_order():
    camera = DelayedCamera(2)
    published = []
    for period in range(6):
        camera.capture(period, f'frame{period}')
        published.append(camera.due(period))
    assert published == [[], [], ['frame0'], ['frame1'], ['frame2'], ['frame3']]
    assert len(camera) == 2          # frames 4 and 5 wait for periods 6 and 7
    camera.begin_episode()           # an episode ended: they are never published
    assert len(camera) == 0 and camera.due(100) == []


def test_camera_without_delay_publishes_in_the_capture_period():
    camera = DelayedCamera(0)
    for period in range(3):
        camera.capture(period, period)
        assert camera.due(period) == [period]


def test_camera_hands_out_every_overdue_frame_once():
    camera = DelayedCamera(1)
    camera.capture(0, 'a')
    camera.capture(1, 'b')
    camera.capture(3, 'c')           # period 2 had no capture (the caller's business)
    assert camera.due(3) == ['a', 'b']
    assert camera.due(3) == [] and camera.due(4) == ['c']


def test_camera_capture_periods_must_increase():
    camera = DelayedCamera(1)
    camera.capture(2, 'a')
    with pytest.raises(ValueError, match='period'):
        camera.capture(2, 'b')
    with pytest.raises(ValueError, match='period'):
        camera.capture(-1, 'b')
    camera.begin_episode()
    camera.capture(0, 'c')           # a new episode counts from 0 again


@pytest.mark.parametrize('value', [-1, 1.0, True, MAX_CAMERA_DELAY + 1, '2'])
def test_bad_camera_delay_names_the_field(value):
    with pytest.raises(ValueError, match='camera_delay'):
        DelayedCamera(value)
    with pytest.raises(ValueError, match='camera_delay'):
        BridgeSettings(sim_mode='realtime', camera_delay=value)


def test_camera_delay_is_realtime_only():
    assert BridgeSettings(sim_mode='realtime', camera_delay=3).camera_delay == 3
    assert BridgeSettings().camera_delay == 0
    with pytest.raises(ValueError, match='camera_delay: applies to sim_mode realtime'):
        BridgeSettings(camera_delay=1)
    with pytest.raises(ValueError, match='camera_delay'):
        check_camera_delay(1, 'lockstep')
    assert check_camera_delay(0, 'lockstep') == 0


def test_tick_monitor_counts_ticks_later_than_the_limit():
    ticks = TickMonitor(0.1)
    ticks.begin_episode(10.0)
    late = [ticks.on_tick(t) for t in (10.1, 10.2, 10.2 + LATE_TICK_PERIODS * 0.1 + 0.01, 10.5)]
    assert late == [False, False, True, False]
    assert ticks.num_late_ticks == 1
    assert ticks.max_gap_s == pytest.approx(LATE_TICK_PERIODS * 0.1 + 0.01)
    ticks.begin_episode()
    assert ticks.on_tick(99.0) is False and ticks.num_late_ticks == 0 and ticks.max_gap_s == 0
    with pytest.raises(ValueError, match='period_s'):
        TickMonitor(0.0)


def test_realtime_tells_hold_twists_from_answers():
    frames = FrameRegistry()
    frames.add(1_000, 0.0)
    state = RealtimeCommand(AnswerPairs(frames, chunk_period_s=0.1), 0.5, 1.0)
    state.begin_episode(1_000, 1.0)
    assert not state.is_hold                                   # nothing received yet
    state.on_twist(5_555, (0, 0, 0), (0, 0, 0), 0.0)           # node-clock stamp: a hold
    assert not state.is_hold                                   # not in effect before a tick
    assert state.command_at(0.1)[3] and state.is_hold          # applied, fresh, a hold
    state.on_twist(1_000, (1, 0, 0), (0, 0, 0), 0.2)           # the frame's answer
    state.command_at(0.2)
    assert not state.is_hold and state.source == (1_000, 0)
    state.on_twist(1_000 + 2 * 100_000_000, (2, 0, 0), (0, 0, 0), 0.3)   # its chunk step 2
    assert state.command_at(0.3)[0] == (2, 0, 0) and state.source == (1_000, 2)


PERIOD_NS = 100_000_000


def chunk_state(*frames_ns):
    frames = FrameRegistry()
    for stamp in frames_ns:
        frames.add(stamp, 0.0)
    state = RealtimeCommand(AnswerPairs(frames, chunk_period_s=0.1), 0.5, 1.0)
    state.begin_episode(frames_ns[0], 1.0)
    return state


def test_realtime_applies_a_chunk_step_only_from_its_time_with_its_gripper():
    frame = 1_000_000_000
    state = chunk_state(frame)
    for index, gripper in ((0, 0.0), (1, 0.5)):     # step 1 arrives before the tick (late)
        state.on_twist(frame + index * PERIOD_NS, (index, 0, 0), (0, 0, 0), 0.0)
        state.on_gripper(gripper)
    # The tick steps the state captured at `frame`: step 1 (a period later) waits.
    due = due_stamp_ns(frame, 0.1)
    assert due == frame + PERIOD_NS // 2
    assert state.command_at(0.05, due) == ((0, 0, 0), (0, 0, 0), 0.0, True)
    assert state.source == (frame, 0)
    # The next state (captured a period later): step 1 with its gripper.
    assert state.command_at(0.15, due + PERIOD_NS) == ((1, 0, 0), (0, 0, 0), 0.5, True)


def test_realtime_a_newer_due_twist_supersedes_earlier_waiting_ones():
    old, new = 1_000_000_000, 1_000_000_000 + PERIOD_NS + 3_000_000
    state = chunk_state(old, new)
    state.on_twist(old + 2 * PERIOD_NS, (2, 0, 0), (0, 0, 0), 0.0)   # old chunk, step 2
    state.on_gripper(0.2)
    state.on_twist(new + PERIOD_NS, (9, 0, 0), (0, 0, 0), 0.01)      # new chunk, step 1
    state.on_gripper(0.9)
    # Both are due for the state after `new`; the newest received wins, the old one is gone.
    due = due_stamp_ns(new + PERIOD_NS, 0.1)
    assert state.command_at(0.02, due) == ((9, 0, 0), (0, 0, 0), 0.9, True)
    assert state.command_at(0.03, due + PERIOD_NS)[0] == (9, 0, 0)
    # A newer due twist drops a waiting one received before it, even one not yet due.
    state.on_twist(new + 3 * PERIOD_NS, (3, 0, 0), (0, 0, 0), 0.04)   # new chunk, step 3
    state.on_twist(7_777, (0, 0, 0), (0, 0, 0), 0.05)                 # a hold, stamped early
    assert state.command_at(0.06, due + PERIOD_NS) == ((0, 0, 0), (0, 0, 0), 0.9, True)
    assert state.is_hold
    assert state.command_at(0.07, due + 5 * PERIOD_NS)[0] == (0, 0, 0)


def test_realtime_ignores_a_previous_episodes_chunk_steps_stamped_after_the_new_start():
    period_ns = 100_000_000
    frames = FrameRegistry()
    frames.add(1_000, 0.0)                                     # episode A's frame
    frames.add(1_000 + period_ns // 2, 0.0)                    # episode B's first frame
    state = RealtimeCommand(AnswerPairs(frames, chunk_period_s=0.1), 0.5, 1.0)
    state.begin_episode(1_000 + period_ns // 2, 1.0)
    # Step 3 of A's chunk is stamped after B began, but it answers A's frame.
    state.on_twist(1_000 + 3 * period_ns, (3, 0, 0), (0, 0, 0), 0.0)
    state.on_gripper(0.0)
    assert state.num_ignored_answers == 1 and state.source is None
    assert state.command_at(0.0) == ((0, 0, 0), (0, 0, 0), 1.0, False)


def test_answer_lag_counts_periods_after_the_planned_state():
    assert answer_lag(7, 5, 2) == 0          # step 2 of period 5's chunk, applied at 7
    assert answer_lag(7, 5, 0) == 2          # a single action from a frame 2 periods old
    assert answer_lag(7, 5, 3) == -1         # a late tick took the next slot's step


def demo_parser():
    import argparse

    from vla_spec_ros.harness import demo_options
    parser = argparse.ArgumentParser()
    demo_options.add_arguments(parser)
    return parser


def test_demo_camera_delays_and_lockstep_models_options():
    from vla_spec_ros.harness import demo_options
    parser = demo_parser()
    plan = demo_options.resolve_options(parser.parse_args([]))
    assert plan['camera_delays'] == [0] and plan['lockstep_models'] == ['metaworld-demo']
    plan = demo_options.resolve_options(parser.parse_args([
        '--sim-mode', 'realtime', '--camera-delays', '0,1,2', '--lockstep-models',
        'metaworld-demo,metaworld-demo-chunk4']))
    assert plan['camera_delays'] == [0, 1, 2]
    assert plan['lockstep_models'] == ['metaworld-demo', 'metaworld-demo-chunk4']
    for argv, option in ((['--camera-delays', '1'], '--camera-delays: applies to --sim-mode '
                                                    'realtime'),
                         (['--sim-mode', 'realtime', '--camera-delays', '0,0'], '--camera-delays'),
                         (['--sim-mode', 'realtime', '--camera-delays', '-1'], '--camera-delays'),
                         (['--lockstep-models', 'a,a'], '--lockstep-models')):
        with pytest.raises(ValueError, match=option):
            demo_options.resolve_options(parser.parse_args(argv))


def realtime_row(model, chunk, delay, success, **counts):
    row = {'model': model, 'mode': 'pipeline_spec', 'relax_threshold': 0, 'camera_delay': delay,
           'action_chunk': chunk, 'success_rate': success,
           'success_rate_per_task': {TASK: success}, 'latency_p50_ms': 20.0,
           'latency_p99_ms': 40.0, 'num_stale_commands': 1, 'num_hold_commands': 2,
           'num_steps': 100, 'num_late_ticks': 0, 'num_chunk_steps_published': 0,
           'num_answer_steps': 80, 'answer_lag_sum': 160, 'num_answer_steps_on_time': 0,
           'num_chunk_steps_skipped': 0, 'num_chunk_run_outs': 0, 'episodes': [{}] * 3}
    row.update(counts)
    return row


def test_demo_realtime_table_one_row_per_model_and_camera_delay():
    from vla_spec_ros.harness import demo_placement, demo_report, demo_tables
    rows = [realtime_row('single', 1, 0, 1.0), realtime_row('single', 1, 2, 0.33),
            realtime_row('chunked', K, 0, 1.0, num_chunk_steps_published=90),
            realtime_row('chunked', K, 2, 0.67, num_chunk_steps_published=80,
                         num_chunk_steps_skipped=60, num_chunk_run_outs=3, answer_lag_sum=2,
                         num_answer_steps_on_time=78, num_chunks_refused=1)]
    record = {'model': 'single', 'tasks': [TASK], 'lockstep': {
        'episodes': 3, 'sim_mode': 'realtime', 'control_rate_hz': 10.0, 'rows': rows,
        'models': ['single', 'chunked'], 'camera_delays': [0, 2]}}
    table = demo_tables.format_realtime_table(record)
    lines = [line for line in table.splitlines() if line.startswith('| chunked')]
    assert lines[1].split(' | ')[1:] == [
        'pipeline_spec', '0', '2', '0.67', '0.67', '20.0 / 40.0', '0.03, 98%', '1 / 2 / 100', '0',
        '80 / 60', '3 / 1', '3 |']
    assert ('| single (single-step) | pipeline_spec | 0 | 2 | 0.33 | 0.33 | 20.0 / 40.0 | '
            '2.00, 0% |') in table
    report = demo_report.format_report(record)
    assert 'Real time through the ROS 2 node' in report and 'Camera delay d' in report
    # Only the first model's row without a camera delay is placed on the delay curve.
    assert demo_placement.lockstep_rows_placed(record) == [rows[0]]


# ---- through the real node (rclpy, torch, Meta-World) -----------------------------------

def _sim_reason():
    from test_closed_loop import SIM_REASON
    return SIM_REASON


@pytest.fixture(scope='module')
def ros_domain():
    from ros_probe import ros_domain_environment
    with ros_domain_environment(DOMAIN_ID):
        yield


@pytest.fixture(scope='module')
def chunked_policy(tmp_path_factory):
    """(policy, unnorm key): the embedded chunked model when shipped, else a random-weight
    tiny one with action_chunk K (greedy over action tokens, so its chunks are valid)."""
    reason = _sim_reason()
    if reason is not None:
        pytest.skip(f'simulator: {reason}')
    from vla_spec_ros import VLAPolicy
    from vla_spec_ros.assets import embedded_checkpoint
    if embedded_checkpoint('metaworld-demo-chunk4') is not None:
        model, key = 'metaworld-demo-chunk4', 'metaworld_scripted'
    else:
        from vla_spec_ros.models.registry import preset
        from vla_spec_ros.models.openvla.random_checkpoint import make_checkpoint
        folder = tmp_path_factory.mktemp('models') / 'tiny-chunk4'
        make_checkpoint(dataclasses.replace(preset('tiny'), action_chunk=K), folder, seed=5)
        model, key = str(folder), 'bridge_orig'
    policy = VLAPolicy.from_pretrained(model, restrict_to_action_tokens=True)
    assert policy.model_config.action_chunk == K
    return policy, key


def test_closed_loop_refuses_lockstep_for_a_chunked_policy(chunked_policy):
    from vla_spec_ros.harness.closed_loop import run_closed_loop
    policy, key = chunked_policy
    with pytest.raises(ValueError, match='sim_mode: lockstep .*chunked policy .*realtime'):
        run_closed_loop(policy, [TASK], 1, sim_mode='lockstep', max_steps=4, unnorm_key=key)
    with pytest.raises(ValueError, match='camera_delay'):
        run_closed_loop(policy, [TASK], 1, sim_mode='lockstep', camera_delay=1, max_steps=4,
                        unnorm_key=key)


def image_probe(topic):
    """(header stamp, receipt time) of every image on `topic`, both in node-clock nanoseconds
    (a node of its own Context)."""
    from sensor_msgs.msg import Image

    from ros_probe import TopicProbe
    from vla_spec_ros.ros.qos import IMAGE_QOS

    def stamp_and_receipt(msg, node):
        receipt_ns = node.get_clock().now().nanoseconds
        return msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec, receipt_ns
    return TopicProbe('camera_delay_probe', Image, topic, IMAGE_QOS, stamp_and_receipt)


def test_chunked_policy_in_real_time_with_a_camera_delay(ros_domain, chunked_policy):
    from vla_spec_ros.harness.closed_loop import run_closed_loop
    policy, key = chunked_policy
    # At most 10 Hz, slower where one chunk's inference would not fit a quarter period.
    rate_hz = control_rate_for(policy, INSTRUCTION, key, max_hz=10.0)
    delay, max_steps = 2, 10
    period_s = 1.0 / rate_hz
    namespace = f'/test_rt_chunks_{os.getpid()}'
    probe = image_probe(f'{namespace}/vla_spec/image')
    logs = []
    try:
        report = run_closed_loop(policy, [TASK], 1, seed=4, sim_mode='realtime',
                                 control_rate_hz=rate_hz, max_steps=max_steps, unnorm_key=key,
                                 namespace=namespace, camera_delay=delay,
                                 on_episode=lambda result, log: logs.append(log))
        frames = probe.snapshot()
    finally:
        probe.close()
    counters = logs[0].counters
    assert report.action_chunk == K and report.camera_delay == delay
    # The episode ran its steps on the control clock, with commands the node published.
    assert counters.num_steps == report.episodes[0].num_steps == max_steps
    assert counters.num_commands_applied >= 1 and logs[0].latencies_s
    assert not counters.is_timed_out and logs[0].end_reason == 'max_steps'
    # Frames of periods 0 .. max_steps - 1 are captured; each is published d periods later,
    # so the last d never are.
    assert counters.num_frames_published == max_steps - delay
    # The node executed chunks: steps published on its clock, and each chunk's first d steps
    # already past when it arrived (its image was stamped d periods before publication).
    assert report.num_actions >= 1 and report.num_chunk_steps_published >= 1
    assert report.num_chunk_steps_skipped >= delay
    # ... and the bridge applied steps planned for the state they acted on (lag 0).
    assert counters.num_answer_steps >= 1 and counters.num_answer_steps_on_time >= 1
    # Publication d periods after the stamp: never earlier (half a period of timer jitter),
    # and not much later on a loaded machine.
    assert len(frames) >= 1
    ages = [(receipt - stamp) * 1e-9 for stamp, receipt in frames]
    assert min(ages) >= (delay - 0.5) * period_s, ages
    assert statistics.median(ages) <= (delay + 1.5) * period_s, ages


def test_demo_realtime_part_runs_a_chunked_model_with_camera_delays(
        ros_domain, chunked_policy, tmp_path):
    import json

    from vla_spec_ros.harness import demo
    policy, key = chunked_policy
    # 4 steps at the demo's 10 Hz leave a loaded machine no time to answer one frame: the rate
    # is the highest at which a chunk's inference fits a quarter of a period here.
    rate_hz = control_rate_for(policy, INSTRUCTION, key, max_hz=10.0)
    args = demo_parser().parse_args([
        '--model', str(policy.source), '--unnorm-key', key, '--tasks', TASK, '--parts',
        'lockstep', '--sim-mode', 'realtime', '--camera-delays', '0,1', '--modes', 'ar',
        '--max-steps', '4', '--control-rate-hz', f'{rate_hz:.3f}',
        '--restrict-to-action-tokens', '--out', str(tmp_path)])
    assert demo.run(args) == 0
    (path,) = tmp_path.glob('demo-*.json')
    record = json.loads(path.read_text())
    rows = record['lockstep']['rows']
    assert [(r['camera_delay'], r['action_chunk'], r['num_steps']) for r in rows] == [
        (0, K, 4), (1, K, 4)]
    assert all(r['num_chunk_steps_published'] >= 1 for r in rows)
    assert '| ar | 0 | 1 |' in path.with_suffix('.md').read_text()
