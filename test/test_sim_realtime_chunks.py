"""Real time through the node: the bridge's camera delay and tick monitor (pure Python), then a
chunked policy driving Meta-World through a real VLA node and the simulator bridge over DDS
with a camera delay, and the closed loop's refusal of lock-step for a chunked policy."""
import dataclasses
import os
import statistics
import threading

import pytest

from vla_spec_ros.sim.bridge_logic import (
    LATE_TICK_PERIODS, MAX_CAMERA_DELAY, BridgeSettings, DelayedCamera, TickMonitor,
    check_camera_delay)

# Unique per module and per run (other modules use 1..230).
DOMAIN_ID = 231 + (os.getpid() % 2)
TASK = 'button-press-topdown'
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


# ---- through the real node (rclpy, torch, Meta-World) -----------------------------------

def _sim_reason():
    from test_closed_loop import SIM_REASON
    return SIM_REASON


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
        from vla_spec_ros.config import preset
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


class ImageProbe:
    """A node of its own Context recording (header stamp, receipt time) of every image, both
    in node-clock nanoseconds."""

    def __init__(self, topic):
        import rclpy
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.node import Node
        from sensor_msgs.msg import Image

        from vla_spec_ros.ros.qos import IMAGE_QOS
        self._rclpy = rclpy
        self.context = rclpy.Context()
        rclpy.init(context=self.context)
        self.node = Node('camera_delay_probe', context=self.context)
        self.items, self._lock = [], threading.Lock()
        self.node.create_subscription(Image, topic, self._record, IMAGE_QOS)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self.executor.spin, daemon=True)
        self.thread.start()

    def _record(self, msg):
        receipt_ns = self.node.get_clock().now().nanoseconds
        stamp_ns = msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec
        with self._lock:
            self.items.append((stamp_ns, receipt_ns))

    def snapshot(self):
        with self._lock:
            return list(self.items)

    def close(self):
        self.executor.shutdown()
        self.node.destroy_node()
        self._rclpy.try_shutdown(context=self.context)
        self.thread.join(timeout=5.0)


def test_chunked_policy_in_real_time_with_a_camera_delay(ros_domain, chunked_policy):
    from vla_spec_ros.harness.closed_loop import run_closed_loop
    policy, key = chunked_policy
    rate_hz, delay, max_steps = 10.0, 2, 10
    period_s = 1.0 / rate_hz
    namespace = f'/test_rt_chunks_{os.getpid()}'
    probe = ImageProbe(f'{namespace}/vla_spec/image')
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
    # Publication d periods after the stamp: never earlier (half a period of timer jitter),
    # and not much later on a loaded machine.
    assert len(frames) >= 1
    ages = [(receipt - stamp) * 1e-9 for stamp, receipt in frames]
    assert min(ages) >= (delay - 0.5) * period_s, ages
    assert statistics.median(ages) <= (delay + 1.5) * period_s, ages
