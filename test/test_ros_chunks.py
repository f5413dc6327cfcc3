"""A chunked model's steps on the controller's clock (docs/chunks.md).

Pure part (no rclpy): the schedule of ros/chunk_rules.py on a fake clock (due step, skip,
run-out, expiry, latest vs ensemble), the arrival checks and the counters. DDS part: the real
node with a chunked tiny model (action_chunk 4, random weights) and a probe camera recording
~/twist, ~/action and ~/trajectory: steps one control period apart, stamped image stamp +
i * control_period, past steps skipped, stale frames refused, the trajectory equal to the
engine's chunk, and the node without trajectory_msgs.
"""
import dataclasses
import importlib.util
import math
import os
import time

import numpy as np
import pytest

from engine_wrappers import FaultEngine, RecordingEngine, WrappedPolicy
from vla_spec_ros.ros import chunk_rules as chunks
from vla_spec_ros.ros import command_rules as cmd
from vla_spec_ros.ros import params
from vla_spec_ros.ros.diagnostics import InferenceStats

P = 0.2          # control period of the pure tests


def settings(**changes):
    return dataclasses.replace(params.default_node_settings(), **changes)


def chunk(t0, num_steps=4, period=P, offset=0.0):
    """A chunk whose step i is (offset + i) in every dimension."""
    actions = offset + np.repeat(np.arange(num_steps, dtype=np.float64)[:, None], 7, axis=1)
    return chunks.Chunk(actions, t0, period)


# ---- the schedule on a fake clock ------------------------------------------------------------

def test_each_step_is_due_once_inside_its_slot_then_the_chunk_runs_out():
    schedule = chunks.ChunkSchedule()
    assert schedule.due(10.0) is None and schedule.next_wake_s() is None
    assert schedule.add(chunk(10.0), 10.05) == (True, False)
    step = schedule.due(10.05)
    # slot of step 0: [10.0, 10.2)
    assert (step.index, step.num_skipped, step.num_blended) == (0, 0, 1)
    assert step.age_s == pytest.approx(0.05) and step.action[0] == 0.0
    assert schedule.due(10.1) is None                     # decided once
    assert schedule.next_wake_s() == pytest.approx(10.2)
    step = schedule.due(10.2 + 1e-6)
    assert step.index == 1 and step.action[3] == 1.0 and step.age_s == pytest.approx(1e-6)
    # the clock missed slot 2 ([10.4, 10.6)): step 3 next, one skipped, never step 2 late
    step = schedule.due(10.65)
    assert (step.index, step.num_skipped) == (3, 1)
    assert schedule.next_wake_s() == pytest.approx(10.8)          # its end: the run-out
    assert schedule.due(10.79) is None
    out = schedule.due(10.8)
    assert isinstance(out, chunks.RunOut) and out.num_skipped == 0
    assert schedule.due(10.9) is None and schedule.next_wake_s() is None   # reported once


def test_a_chunk_arriving_late_skips_its_past_steps():
    schedule = chunks.ChunkSchedule()
    schedule.add(chunk(10.0), 10.45)
    step = schedule.due(10.45)
    assert (step.index, step.num_skipped) == (2, 2)      # slots 0 and 1 passed
    assert step.age_s == pytest.approx(0.05)


def test_a_chunk_that_runs_out_unpublished_counts_its_steps_as_skipped():
    schedule = chunks.ChunkSchedule()
    schedule.add(chunk(10.0), 10.0)
    assert schedule.due(10.0).index == 0
    out = schedule.due(11.0)                     # the clock stalled past the whole chunk
    assert isinstance(out, chunks.RunOut) and out.num_skipped == 3


def test_nothing_is_due_before_the_first_slot():
    schedule = chunks.ChunkSchedule()
    schedule.add(chunk(10.0), 9.9)               # stamped 0.1 s ahead of the node clock
    assert schedule.due(9.95) is None
    assert schedule.next_wake_s() == pytest.approx(10.0)
    assert schedule.due(10.0).index == 0


def test_latest_the_newest_chunk_wins_from_its_first_due_step():
    schedule = chunks.ChunkSchedule()
    schedule.add(chunk(10.0, offset=0.0), 10.1)
    assert schedule.due(10.1).index == 0
    # B (image at 10.15) arrives at 10.3 while A still has steps: replaced
    assert schedule.add(chunk(10.15, offset=100.0), 10.3) == (True, True)
    step = schedule.due(10.3)
    assert step.chunk.start_s == 10.15 and step.index == 0 and step.action[0] == 100.0
    step = schedule.due(10.35)
    assert step.index == 1 and step.action[0] == 101.0
    # A's steps never come back; B runs out at 10.15 + 4 * 0.2
    step = schedule.due(10.949)
    assert step.chunk.start_s == 10.15 and step.index == 3 and step.num_skipped == 1
    assert isinstance(schedule.due(10.95), chunks.RunOut)


def test_a_chunk_after_the_previous_ran_out_is_not_a_replacement():
    schedule = chunks.ChunkSchedule()
    schedule.add(chunk(10.0), 10.0)
    assert isinstance(schedule.due(10.8), chunks.RunOut)
    assert schedule.add(chunk(10.7), 10.9) == (True, False)


def test_an_older_chunk_is_not_accepted_and_one_of_the_same_time_takes_over():
    """A chunk of an older image is ignored (a camera clock stepped back); one of the same
    image time is the later frame (two frames aged by one coarse /clock tick) and takes over
    (before: ignored as 'not newer', with the camera blamed)."""
    schedule = chunks.ChunkSchedule()
    schedule.add(chunk(10.0, offset=0.0), 10.1)
    assert schedule.add(chunk(9.9, offset=5.0), 10.2) == (False, False)
    assert schedule.add(chunk(10.0, offset=5.0), 10.2) == (True, True)
    assert schedule.due(10.2).action[0] == 6.0


def test_ensemble_is_the_weighted_mean_of_every_chunk_covering_the_step():
    schedule = chunks.ChunkSchedule()
    a, b = chunk(10.0, offset=0.0), chunk(10.1, offset=100.0)
    schedule.add(a, 10.0)
    schedule.add(b, 10.1)
    # at 10.3: b's step 1 (slot [10.3, 10.5), age 0) and a's step 1 ([10.2, 10.4), age 0.1)
    step = schedule.due(10.3, blend='ensemble', decay=0.0)
    assert (step.index, step.num_blended) == (1, 2)
    np.testing.assert_allclose(step.action, np.full(7, (101.0 + 1.0) / 2))
    assert step.age_s == pytest.approx(0.1)              # the oldest contributor's
    # decay 1: weights 1 and e^-1 for the newest and the one before
    schedule = chunks.ChunkSchedule()
    schedule.add(a, 10.0)
    schedule.add(b, 10.1)
    step = schedule.due(10.3, blend='ensemble', decay=1.0)
    w = math.exp(-1.0)
    np.testing.assert_allclose(step.action, np.full(7, (101.0 + w * 1.0) / (1 + w)))


def test_an_older_chunks_step_joins_the_ensemble_at_the_newest_chunks_period():
    """After control_period went from 0.2 to 0.1 s between two chunks, an older step (a
    displacement over 0.2 s) joins the ensemble halved, as a displacement over the newest
    chunk's 0.1 s, in its ee_delta motion values (per_period_dims 6); the gripper (7th) and
    joint values are not displacements per period and blend as they are."""
    schedule = chunks.ChunkSchedule()
    a, b = chunk(10.0, offset=10.0), chunk(10.15, period=0.1, offset=100.0)
    schedule.add(a, 10.0)
    schedule.add(b, 10.15)
    # at 10.25: b's step 1 ([10.25, 10.35)) and a's step 1 ([10.2, 10.4)): 101 and 11
    step = schedule.due(10.25, blend='ensemble', decay=0.0, per_period_dims=6)
    assert step.num_blended == 2
    np.testing.assert_allclose(step.action[:6], np.full(6, (101.0 + 11.0 * 0.5) / 2))
    assert step.action[6] == pytest.approx((101.0 + 11.0) / 2)
    schedule = chunks.ChunkSchedule()
    schedule.add(a, 10.0)
    schedule.add(b, 10.15)
    step = schedule.due(10.25, blend='ensemble', decay=0.0)        # joint spaces
    np.testing.assert_allclose(step.action, np.full(7, (101.0 + 11.0) / 2))
    np.testing.assert_allclose(a.actions[1], np.full(7, 11.0))     # the chunk is untouched


def test_ensemble_leaves_out_expired_and_too_old_steps():
    schedule = chunks.ChunkSchedule()
    schedule.add(chunk(10.0, offset=0.0), 10.0)
    schedule.add(chunk(10.1, offset=100.0), 10.1)
    # max_age 0.05: a's step at 10.3 is 0.1 old, left out
    step = schedule.due(10.3, blend='ensemble', decay=0.0, max_age_s=0.05)
    assert step.num_blended == 1 and step.action[0] == 101.0
    # at 10.85 a (ends 10.8) no longer covers the time: b alone
    step = schedule.due(10.85, blend='ensemble', decay=0.0)
    assert step.num_blended == 1 and step.action[0] == 103.0
    with pytest.raises(ValueError, match='blend'):
        schedule.due(10.95, blend='average')


@pytest.mark.parametrize('blend, decay, max_age, period', [
    ('ensemble', 0.0, math.inf, 0.2),
    ('ensemble', 0.7, 0.25, 0.2),
    ('ensemble', -0.3, math.inf, 0.1),
    ('latest', 0.0, math.inf, 0.2),
])
def test_the_planned_steps_are_the_due_steps_at_each_slot_start(blend, decay, max_age, period):
    """ChunkSchedule.planned (what a trajectory output sends on arrival) against the
    reference, `due` called at each slot's start on a copy of the schedule, for three chunks
    on random grids (one at another period)."""
    rng = np.random.default_rng(int(decay * 10) + 3)
    starts = sorted(10.0 + rng.uniform(0.0, 0.5, 3))
    made = [chunk(t, offset=100.0 * i, period=period if i == 2 else 0.2)
            for i, t in enumerate(starts)]
    for c in made:
        c.actions[:] += rng.normal(0.0, 1.0, c.actions.shape)

    def schedule_of():
        schedule = chunks.ChunkSchedule()
        for c in made:
            schedule.add(c, c.start_s)
        return schedule

    plan = schedule_of().planned(blend=blend, decay=decay, max_age_s=max_age,
                                 per_period_dims=6)
    newest = made[-1]
    assert len(plan) == newest.num_steps
    for index, planned in enumerate(plan):
        reference = schedule_of().due(newest.slot_start(index), blend=blend, decay=decay,
                                      max_age_s=max_age, per_period_dims=6)
        assert reference.index == index
        np.testing.assert_allclose(planned, reference.action, rtol=0, atol=1e-12)


def test_ensemble_weights():
    np.testing.assert_allclose(chunks.ensemble_weights(3, 0.0), [1 / 3] * 3)
    assert not chunks.ensemble_weights(3, 0.0).flags.writeable     # cached: shared, read-only
    w = chunks.ensemble_weights(2, math.log(2.0))          # 1 and 1/2
    np.testing.assert_allclose(w, [2 / 3, 1 / 3])
    w = chunks.ensemble_weights(200, -10.0)                # ACT's order: the oldest weighs most
    assert np.all(np.isfinite(w)) and w[-1] > 0.9999 and w.sum() == pytest.approx(1.0)


def test_is_running_until_the_newest_chunk_ends_or_runs_out():
    schedule = chunks.ChunkSchedule()
    assert not schedule.is_running(10.0)
    schedule.add(chunk(10.0), 10.0)             # 4 slots of P = 0.2 s: ends at 10.8
    assert schedule.is_running(10.0) and schedule.is_running(10.79)
    assert not schedule.is_running(10.8)
    assert isinstance(schedule.due(10.85), chunks.RunOut)
    assert not schedule.is_running(10.5)       # ran out: nothing runs, whatever the time


def test_clear_forgets_everything():
    schedule = chunks.ChunkSchedule()
    schedule.add(chunk(10.0), 10.0)
    schedule.clear()
    assert len(schedule) == 0 and schedule.due(10.1) is None and schedule.next_wake_s() is None


# ---- arrival checks and the per-step safety decision --------------------------------------------

@dataclasses.dataclass(frozen=True)
class FakeResult:
    action: np.ndarray
    is_valid: bool = True
    invalid_reason: str | None = None


ACTIONS = np.tile(np.array([0.01, -0.02, 0.02, 0.1, 0.0, -0.05, 1.0]), (4, 1))


def decide(result=FakeResult(ACTIONS), *, error=None, enabled=True, age=0.1, steps=4, **s):
    return chunks.decide_chunk(result, error=error, is_enabled=enabled, age_s=age,
                               num_steps=steps, settings=settings(**s))


def test_chunk_age_limit_is_max_action_age_plus_the_later_slots():
    s = settings(max_action_age=0.5, control_period=0.2)
    assert chunks.chunk_age_limit(4, s) == pytest.approx(1.1)
    assert chunks.chunk_age_limit(1, s) == pytest.approx(0.5)       # one step: as today
    assert decide(age=1.1, max_action_age=0.5, control_period=0.2).hold_reason is None
    reason = decide(age=1.11, max_action_age=0.5, control_period=0.2).hold_reason
    assert reason.startswith('stale observation') and 'chunk limit 1.100' in reason
    reason = decide(age=-0.6, max_action_age=0.5).hold_reason
    assert reason.startswith('observation from the future')


def test_a_good_chunk_gives_its_scaled_limited_commands():
    decision = decide(control_period=0.2, linear_scale=2.0, max_linear_speed=0.25,
                      max_angular_speed=10.0)
    assert decision.hold_reason is None and len(decision.commands) == 4
    # linear (0.1, -0.2, 0.2) * 2 has norm 0.6 -> clamped to 0.25, direction kept
    expected = np.array([0.2, -0.4, 0.4]) * 0.25 / 0.6
    np.testing.assert_allclose(decision.commands[2].linear, expected)
    # angular: the rotation vector of Rz(-0.05) @ Rx(0.1) over 0.2 s, about (0.5, -0.01, -0.25)
    from ros_probe import turn_rate
    np.testing.assert_allclose(decision.commands[2].angular, turn_rate((0.1, 0.0, -0.05), 0.2),
                               rtol=1e-12)
    assert decision.commands[0].gripper == 1.0


@pytest.mark.parametrize('kwargs, reason', [
    (dict(enabled=False), 'disabled'),
    (dict(error='boom'), 'engine error: boom'),
    (dict(result=FakeResult(ACTIONS, False, 'non-action token')),
     'invalid action: non-action token'),
    (dict(result=FakeResult(ACTIONS[0])), 'invalid action: chunk has shape (7,)'),
    (dict(result=FakeResult(ACTIONS), steps=3), 'invalid action'),
    (dict(result=FakeResult(np.where(np.arange(28).reshape(4, 7) == 15, np.inf, ACTIONS))),
     'non-finite action: step 2'),
    (dict(age=None), 'no image received'),
])
def test_a_bad_chunk_is_refused_whole(kwargs, reason):
    decision = decide(**kwargs)
    assert decision.hold_reason.startswith(reason), decision.hold_reason
    assert decision.commands == ()


def test_a_step_older_than_max_action_age_is_refused_by_the_usual_decision():
    # control_period 0.5 > max_action_age 0.3: late in its slot a step is too old
    s = settings(control_period=0.5, max_action_age=0.3)
    schedule = chunks.ChunkSchedule()
    schedule.add(chunk(10.0, period=0.5), 10.4)
    step = schedule.due(10.4)
    command = cmd.decide_command(chunks.StepAction(step.action), error=None, is_enabled=True,
                                 age_s=step.age_s, settings=s)
    assert command.hold_reason.startswith('stale observation: age 0.400 s > max_action_age')
    step = schedule.due(10.5)                   # the next slot's start: fresh
    assert not cmd.decide_command(chunks.StepAction(step.action), error=None, is_enabled=True,
                                  age_s=step.age_s, settings=s).is_hold


def test_observation_time_is_the_base_of_observation_age():
    header, receipt = settings(stamp_source='header'), settings(stamp_source='receipt')
    assert cmd.observation_time(9.7, 9.9, header) == 9.7
    assert cmd.observation_time(9.7, 9.9, receipt) == 9.9
    assert cmd.observation_time(0.0, 9.9, header) == 9.9          # unstamped driver


def test_blend_parameters():
    assert params.CHUNK_BLENDS == chunks.BLENDS
    assert params.INVALID_CHUNK_RULES == chunks.INVALID_CHUNK_RULES
    assert params.PARAMETERS_BY_NAME['invalid_chunk'].default == 'continue'
    assert 'invalid_chunk' in params.TUNABLE_PARAMETERS
    assert 'invalid_chunk' in params.ROBOT_PARAMETERS
    with pytest.raises(ValueError, match='invalid_chunk'):
        params.settings_from_parameters({'invalid_chunk': 'ignore'})
    assert params.PARAMETERS_BY_NAME['chunk_blend'].default == 'latest'
    for name in ('chunk_blend', 'chunk_ensemble_decay'):
        assert name in params.TUNABLE_PARAMETERS and name in params.ROBOT_PARAMETERS
    with pytest.raises(ValueError, match='chunk_blend'):
        params.settings_from_parameters({'chunk_blend': 'mean'})
    with pytest.raises(ValueError, match='chunk_ensemble_decay'):
        params.settings_from_parameters({'chunk_ensemble_decay': 11.0})


def test_chunk_counters():
    stats = InferenceStats()
    stats.record_chunk(replaced=False)
    stats.record_chunk(replaced=True)
    stats.record_chunk_step(published=True, num_skipped=2, lateness_s=0.001)
    stats.record_chunk_step(published=True, num_skipped=0, lateness_s=0.003)
    stats.record_chunk_step(published=False, num_skipped=1)
    stats.record_chunk_run_out(num_skipped=1)
    stats.record_chunk_refused('invalid action: 50 coefficients')
    snap = stats.snapshot(0.0)
    assert (snap['chunk_steps_published'], snap['chunk_steps_skipped'],
            snap['chunks_replaced'], snap['chunk_run_outs']) == (2, 4, 1, 1)
    # a refused chunk is an error, not a hold
    assert (snap['chunks_refused'], snap['errors'], snap['holds']) == (1, 1, 0)
    assert snap['last_error'] == 'invalid action: 50 coefficients'
    assert snap['step_late_p50_ms'] == pytest.approx(1.0)
    assert snap['step_late_p99_ms'] == pytest.approx(3.0)
    assert math.isnan(InferenceStats().snapshot(0.0)['step_late_p99_ms'])


# ---- over DDS: the node with a chunked model --------------------------------------------------

HAS_ROS = all(importlib.util.find_spec(m) is not None
              for m in ('rclpy', 'sensor_msgs', 'geometry_msgs', 'std_srvs', 'diagnostic_msgs'))
HAS_TORCH = importlib.util.find_spec('torch') is not None
HAS_TRAJECTORY = importlib.util.find_spec('trajectory_msgs') is not None
needs_ros = pytest.mark.skipif(not (HAS_ROS and HAS_TORCH),
                               reason='needs rclpy + ROS message wheels and torch')

DOMAIN_ID = 51 + (os.getpid() % 40)
INSTRUCTION = 'put the red block in the drawer'
UNNORM_KEY = 'bridge_orig'
K = 4
# The DDS tests' clock: the control period is at least 0.2 s, and longer where this machine
# needs more than a quarter period to decide one chunk (measured in the `chunked` fixture, which
# sets these before any node is made); every other duration of those tests is a multiple of it.
CONTROL_PERIOD = 0.2
MAX_AGE = 2.5 * CONTROL_PERIOD
SLACK = 0.08         # scheduling + DDS delivery on a loaded two-core machine


def _pace_to(latency_s: float) -> None:
    """Control period (and the age limit, in periods) for a chunk decided in ``latency_s``."""
    global CONTROL_PERIOD, MAX_AGE
    CONTROL_PERIOD = max(0.2, 4.0 * latency_s)
    MAX_AGE = 2.5 * CONTROL_PERIOD
    # The late-step test runs at 5 periods, and control_period is at most 10 s.
    assert CONTROL_PERIOD <= 2.0, f'{latency_s:.2f} s per chunk: too slow for these tests'


def expected_twist(action):
    # Documented scaling: velocity = delta / control_period (scales 1, limits set high here),
    # the angular delta as the rotation vector of its fixed-axis angles.
    from ros_probe import turn_rate
    return np.concatenate([action[:3] / CONTROL_PERIOD, turn_rate(action[3:6], CONTROL_PERIOD)])


def _ns(stamp):
    return stamp.sec * 1_000_000_000 + stamp.nanosec


@pytest.fixture(scope='module')
def chunked(tmp_path_factory):
    """A chunked tiny checkpoint, the node's policy and a separately loaded reference."""
    if not (HAS_ROS and HAS_TORCH):
        pytest.skip('needs rclpy + ROS message wheels and torch')
    from vla_spec_ros import VLAPolicy
    from vla_spec_ros.models.registry import preset
    from vla_spec_ros.models.openvla.random_checkpoint import make_checkpoint

    folder = make_checkpoint(dataclasses.replace(preset('tiny'), action_chunk=K),
                             tmp_path_factory.mktemp('chunk4') / 'tiny_chunk4', seed=5)
    reference = VLAPolicy.from_pretrained(str(folder), restrict_to_action_tokens=True,
                                          mode='ar')
    assert reference.model_config.action_chunk == K
    rng = np.random.default_rng(11)
    frames = [rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for _ in range(3)]
    expected = [reference.predict(f, INSTRUCTION, UNNORM_KEY).action for f in frames]
    for chunk_actions in expected:
        assert chunk_actions.shape == (K, 7) and np.all(np.isfinite(chunk_actions))
    from machine_pace import frame_latency_s
    _pace_to(frame_latency_s(reference, INSTRUCTION, UNNORM_KEY))   # AR: the slowest mode
    return folder, frames, expected


@pytest.fixture(scope='module')
def ros():
    from ros_probe import ros_graph
    with ros_graph(DOMAIN_ID, 'chunk_probe') as graph:
        yield graph


class ChunkProbe:
    """The probe of test_ros_node plus a ~/trajectory recorder."""

    def __init__(self, probe_node, target):
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from ros_probe import Probe, Recorder

        self.probe = Probe(probe_node, target)
        self.trajectories = Recorder(probe_node.get_clock())
        if HAS_TRAJECTORY:
            from trajectory_msgs.msg import MultiDOFJointTrajectory
            probe_node.create_subscription(
                MultiDOFJointTrajectory, f'/{target}/trajectory', self.trajectories,
                QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE))


def _node(ros, policy, name, **changes):
    from rclpy.parameter import Parameter

    from vla_spec_ros.ros.node import VLASpecNode

    context, executor, probe_node = ros
    overrides = {'enabled': True, 'instruction': INSTRUCTION, 'unnorm_key': UNNORM_KEY,
                 'control_period': CONTROL_PERIOD, 'max_linear_speed': 10.0,
                 'max_angular_speed': 20.0, 'max_action_age': MAX_AGE, 'frame_id': 'tool0',
                 'diagnostics_period': 0.2, **changes}
    node = VLASpecNode(policy, node_name=name, context=context, parameter_overrides=[
        Parameter(k, value=v) for k, v in overrides.items()])
    executor.add_node(node)
    return node, ChunkProbe(probe_node, name)


@pytest.fixture(scope='module')
def chunk_node(ros, chunked):
    from vla_spec_ros import VLAPolicy

    policy = VLAPolicy.from_pretrained(str(chunked[0]), restrict_to_action_tokens=True)
    node, probe = _node(ros, policy, 'vla_chunk')
    yield node, probe
    ros[1].remove_node(node)
    node.destroy_node()


def _image(probe, array, age_s=0.0):
    """A raw image stamped `age_s` before the probe's clock."""
    from rclpy.duration import Duration

    msg = probe.probe.raw_image(array)
    msg.header.stamp = (probe.probe.now() - Duration(nanoseconds=int(age_s * 1e9))).to_msg()
    return msg


def _run_of(probe, image, start):
    """(receipt time, step index, twist) of the steps published for `image`'s chunk, once its
    run-out zero has arrived; the zero's (time, message)."""
    from ros_probe import is_zero, wait_until

    t0 = _ns(image.header.stamp)
    period_ns = round(CONTROL_PERIOD * 1e9)

    def ran_out():
        items = probe.probe.twists.snapshot()[start:]
        ours = [i for i, (_, m) in enumerate(items)
                if not is_zero(m) and (_ns(m.header.stamp) - t0) % period_ns == 0
                and 0 <= (_ns(m.header.stamp) - t0) // period_ns < K]
        zeros = [i for i, (_, m) in enumerate(items) if is_zero(m) and ours and i > ours[-1]]
        return (ours, zeros[0], items) if zeros else None
    ours, zero, items = wait_until(ran_out, timeout=max(20.0, 10 * K * CONTROL_PERIOD),
                                   what='the chunk and its run-out')
    steps = [(items[i][0], (_ns(items[i][1].header.stamp) - t0) // period_ns, items[i][1])
             for i in ours]
    return steps, items[zero]


def _held_after_the_run_out(reason: str) -> bool:
    """The standing hold once a chunk ran out: its run-out, or, read after its image grew
    older than the chunk limit (a slow machine's test reads late), the watchdog's stale
    hold that replaces it: both hold the robot."""
    return reason.startswith('chunk ran out') or reason.startswith('stale observation')


@needs_ros
def test_steps_follow_the_control_clock_and_the_trajectory_is_the_chunk(chunk_node, chunked):
    from ros_probe import stamp_s, twist_values

    node, probe = chunk_node
    _, frames, expected = chunked
    assert node.serving.chunk_steps == K and node.serving.chunk_clock is not None
    before = node.stats_snapshot()
    start = len(probe.probe.twists.snapshot())
    traj_start = len(probe.trajectories.snapshot())
    image = _image(probe, frames[0])
    probe.probe.send(image, lambda: probe.trajectories.find(
        lambda m: m.header.stamp == image.header.stamp, traj_start))
    steps, (zero_time, zero) = _run_of(probe, image, start)
    t0 = stamp_s(image.header.stamp)
    indices = [i for _, i, _ in steps]
    # one twist per step from the first due one to the last, in stamp order, none repeated
    assert indices == list(range(indices[0], K)), indices
    for received, i, twist in steps:
        assert twist.header.frame_id == 'tool0'
        assert _ns(twist.header.stamp) == _ns(image.header.stamp) + round(i * CONTROL_PERIOD
                                                                          * 1e9)
        np.testing.assert_allclose(twist_values(twist), expected_twist(expected[0][i]),
                                   rtol=1e-9, atol=1e-12)
        # published inside its slot (received at most SLACK after it ended)
        assert t0 + i * CONTROL_PERIOD <= received < t0 + (i + 1) * CONTROL_PERIOD + SLACK
    # the steps the chunk clock published are one control period apart
    clocked = [t for t, _, _ in steps[1:]]
    for a, b in zip(clocked, clocked[1:]):
        assert abs((b - a) - CONTROL_PERIOD) < SLACK, (a, b)
    # run-out: a zero once the last slot ended, with its reason
    assert t0 + K * CONTROL_PERIOD - 0.01 <= zero_time < t0 + K * CONTROL_PERIOD + SLACK
    after = node.stats_snapshot()
    assert after['chunk_steps_published'] - before['chunk_steps_published'] == len(steps)
    assert after['chunk_steps_skipped'] - before['chunk_steps_skipped'] == indices[0]
    assert after['chunk_run_outs'] - before['chunk_run_outs'] == 1
    assert _held_after_the_run_out(after['hold_reason']), after['hold_reason']
    assert after['step_late_p99_ms'] < 1e3 * SLACK
    # the trajectory: every step's scaled twist, time_from_start i * control_period
    _, trajectory = probe.trajectories.find(lambda m: m.header.stamp == image.header.stamp,
                                            traj_start)
    assert trajectory.header.frame_id == 'tool0' and trajectory.joint_names == ['tool0']
    assert len(trajectory.points) == K
    for i, point in enumerate(trajectory.points):
        assert point.time_from_start.sec * 10**9 + point.time_from_start.nanosec == round(
            i * CONTROL_PERIOD * 1e9)
        v = point.velocities[0]
        np.testing.assert_allclose([v.linear.x, v.linear.y, v.linear.z, v.angular.x,
                                    v.angular.y, v.angular.z], expected_twist(expected[0][i]),
                                   rtol=1e-9, atol=1e-12)
    # The run-out also stops a trajectory controller, with a trajectory one would accept
    # (ROS 2's JTC rejects an empty one): one point, zero velocity, one period after the
    # hold's stamp, so that it does not end in the past when it arrives.
    received, stop = probe.trajectories.wait_for(
        lambda m: len(m.points) == 1 and m.header.stamp != image.header.stamp,
        start=traj_start, what='the stop trajectory at the run-out')
    assert stop.joint_names == ['tool0'] and stop.header.frame_id == 'tool0'
    (v,) = stop.points[0].velocities
    assert [v.linear.x, v.linear.y, v.linear.z, v.angular.x, v.angular.y, v.angular.z] == \
        [0.0] * 6
    assert _ns(stop.points[0].time_from_start) == round(CONTROL_PERIOD * 1e9)
    assert stamp_s(stop.header.stamp) >= t0 + K * CONTROL_PERIOD - 0.01    # the hold's time
    assert stamp_s(stop.header.stamp) + CONTROL_PERIOD >= received
    # the gripper and raw action follow each step
    probe.probe.actions.wait_for(
        lambda m: np.allclose(m.data, expected[0][K - 1], rtol=0, atol=1e-12),
        what='raw action of the last step')


def _moving_step_of(probe, image, start):
    """The index (in the probe's twists) of the first moving step of `image`'s chunk received
    from `start`, or None."""
    from ros_probe import is_zero

    t0, period_ns = _ns(image.header.stamp), round(CONTROL_PERIOD * 1e9)
    for i, (_, m) in enumerate(probe.probe.twists.snapshot()[start:], start=start):
        offset = _ns(m.header.stamp) - t0
        if not is_zero(m) and offset % period_ns == 0 and 0 <= offset // period_ns < K:
            return i
    return None


def _nothing_moves_after_a_zero(probe, start, image):
    """Waits for a zero twist after index `start`, then for the rest of `image`'s chunk: no
    moving twist follows that zero. Returns the zero's index."""
    from ros_probe import is_zero, stamp_s, wait_until

    zero_at, _ = wait_until(lambda: next(
        ((i, m) for i, (_, m) in enumerate(probe.probe.twists.snapshot()[start:], start=start)
         if is_zero(m)), None), what='a zero twist')
    end_s = stamp_s(image.header.stamp) + K * CONTROL_PERIOD
    wait_until(lambda: stamp_s(probe.probe.now().to_msg()) > end_s + SLACK,
               timeout=max(20.0, 3 * K * CONTROL_PERIOD), what="the chunk's last slot")
    moving = [m for _, m in probe.probe.twists.snapshot()[zero_at + 1:] if not is_zero(m)]
    assert moving == [], f'{len(moving)} moving twists after the zero'
    return zero_at


@needs_ros
def test_a_camera_clock_ahead_of_the_node_times_the_steps_from_the_arrival(chunk_node, chunked):
    """An image stamped 2 periods ahead of the node clock (accepted: max_action_age is 2.5
    periods) is timed and stamped from its arrival, as it is aged (command_rules.aged_from,
    command_stamp): step 0 goes out as soon as the chunk is decided, not when the node clock
    reaches the stamp; the steps are stamped arrival + i periods (never ahead of the node
    clock: MoveIt Servo counts its timeout from the stamp) and the run-out comes K periods
    after the arrival. (Timed from the stamp, step 0 waited 2 periods, and a camera sending
    faster than a chunk plays never moved the robot: each chunk was replaced before its
    first slot.)"""
    from rclpy.duration import Duration
    from ros_probe import is_zero, stamp_s, wait_until

    node, probe = chunk_node
    _, frames, _ = chunked
    ahead_s, period_ns = 2.0 * CONTROL_PERIOD, round(CONTROL_PERIOD * 1e9)
    wait_until(lambda: probe.probe.image_pub.get_subscription_count() > 0, what='the node')
    wait_until(lambda: node.stats_snapshot()['hold_reason'] != '', what='the node idle')

    def moving_after(start):
        return [(t, m) for t, m in probe.probe.twists.snapshot()[start:] if not is_zero(m)]
    for _ in range(3):           # a best-effort image may be lost: again, with a new stamp
        start = len(probe.probe.twists.snapshot())
        image = probe.probe.raw_image(frames[1])
        sent_s = stamp_s(probe.probe.now().to_msg())
        image.header.stamp = (probe.probe.now() + Duration(nanoseconds=int(ahead_s * 1e9))
                              ).to_msg()
        probe.probe.image_pub.publish(image)
        try:       # long enough that no answer to this image can come after the next one
            wait_until(lambda: moving_after(start), timeout=10.0)
            break
        except AssertionError:
            continue

    def ran_out():
        """(the moving steps, the first zero after them) once that zero has arrived."""
        items = probe.probe.twists.snapshot()[start:]
        moving = [i for i, (_, m) in enumerate(items) if not is_zero(m)]
        zeros = [i for i, (_, m) in enumerate(items) if is_zero(m) and moving
                 and i > moving[-1]]
        return ([items[i] for i in moving], items[zeros[0]]) if zeros else None
    steps, (zero_time, _) = wait_until(ran_out, timeout=max(20.0, 10 * K * CONTROL_PERIOD),
                                       what='the chunk and its run-out')
    t0, (received, first) = stamp_s(image.header.stamp), steps[0]
    arrival = stamp_s(first.header.stamp)          # step 0 is stamped with the arrival
    # published as soon as decided (a quarter period at the fixture's pace): before the
    # stamp's time, two periods later, where the first slot began when timed from the stamp
    assert sent_s <= arrival <= received < t0, (sent_s, arrival, received, t0)
    assert [(_ns(m.header.stamp) - _ns(first.header.stamp)) / period_ns for _, m in steps] \
        == list(range(K))
    for (a, _), (b, _) in zip(steps[1:], steps[2:]):
        assert abs((b - a) - CONTROL_PERIOD) < SLACK, (a, b)
    assert arrival + K * CONTROL_PERIOD - 0.01 <= zero_time < t0 + K * CONTROL_PERIOD - 0.1 * \
        CONTROL_PERIOD
    reason = node.stats_snapshot()['hold_reason']
    assert _held_after_the_run_out(reason), reason


@needs_ros
@pytest.mark.parametrize('instruction, reason', [
    ('', 'no instruction'), ('  \t ', 'no instruction'),   # whitespace is no task either
    ('open the drawer', "instruction changed: holding until the first action for "
                        "'open the drawer'")])
def test_a_new_or_cleared_instruction_stops_the_running_chunk(chunk_node, chunked, instruction,
                                                              reason):
    """Nothing decided under the old instruction goes out once it changed: the chunk being
    executed is dropped and a zero twist follows at once (not the chunk's later steps, not
    only at its run-out). An instruction of whitespace holds as none (before, every frame of
    it was refused as bad input, an ERROR at frame rate)."""
    node, probe = chunk_node
    _, frames, _ = chunked
    start = len(probe.probe.twists.snapshot())
    image = _image(probe, frames[0])
    probe.probe.send(image, lambda: _moving_step_of(probe, image, start) is not None)
    try:
        changed = len(probe.probe.twists.snapshot())
        assert probe.probe.set_param('instruction', instruction).successful
        _nothing_moves_after_a_zero(probe, changed, image)
        assert node.stats_snapshot()['hold_reason'] == reason
    finally:
        assert probe.probe.set_param('instruction', INSTRUCTION).successful


@needs_ros
def test_reset_during_a_chunk_stops_it_with_a_zero(chunk_node, chunked):
    """`~/reset` drops the chunk being executed: its reply counts it, and a zero twist goes
    out at once, so the last moving step does not stand until the watchdog finds the image
    stale."""
    from std_srvs.srv import Trigger

    node, probe = chunk_node
    _, frames, _ = chunked
    start = len(probe.probe.twists.snapshot())
    image = _image(probe, frames[1])
    probe.probe.send(image, lambda: _moving_step_of(probe, image, start) is not None)
    called = len(probe.probe.twists.snapshot())
    response = probe.probe.call(probe.probe.reset_client, Trigger.Request())
    assert response.success and 'and 1 running chunks' in response.message, response.message
    _nothing_moves_after_a_zero(probe, called, image)
    assert node.stats_snapshot()['hold_reason'] == 'reset: ~/reset called'


@needs_ros
def test_past_steps_are_skipped(chunk_node, chunked):
    from ros_probe import twist_values

    node, probe = chunk_node
    _, frames, expected = chunked
    before = node.stats_snapshot()
    start = len(probe.probe.twists.snapshot())
    # stamped 2.25 periods ago: slots 0 and 1 ended before the frame arrived
    image = _image(probe, frames[1], age_s=2.25 * CONTROL_PERIOD)
    probe.probe.send(image, lambda: node.stats_snapshot()['chunk_run_outs']
                     > before['chunk_run_outs'])
    steps, _ = _run_of(probe, image, start)
    indices = [i for _, i, _ in steps]
    assert indices[0] >= 2 and indices == list(range(indices[0], K)), indices
    for _, i, twist in steps:
        np.testing.assert_allclose(twist_values(twist), expected_twist(expected[1][i]),
                                   rtol=1e-9, atol=1e-12)
    after = node.stats_snapshot()
    assert after['chunk_steps_skipped'] - before['chunk_steps_skipped'] == indices[0]


@needs_ros
def test_a_frame_older_than_the_chunk_limit_gives_zero_twist(chunk_node, chunked):
    from ros_probe import is_zero, stamp_s, wait_until

    node, probe = chunk_node
    _, frames, _ = chunked
    before = node.stats_snapshot()
    start = len(probe.probe.twists.snapshot())
    traj_start = len(probe.trajectories.snapshot())
    # limit: max_action_age + (K - 1) * control_period = 2.5 + 3 = 5.5 periods
    limit = MAX_AGE + (K - 1) * CONTROL_PERIOD
    # The old image must still be the camera's newest (an image stamped before one already
    # received is dropped as out of order): wait until 6 periods ago is after every earlier
    # test's images.
    newest_before = stamp_s(probe.probe.now().to_msg())
    wait_until(lambda: stamp_s(probe.probe.now().to_msg()) - 6 * CONTROL_PERIOD > newest_before,
               timeout=max(20.0, 12 * CONTROL_PERIOD), what='six periods')
    image = _image(probe, frames[2], age_s=6 * CONTROL_PERIOD)
    probe.probe.send(image, lambda: node.stats_snapshot()['frames_stale']
                     > before['frames_stale'])
    wait_until(lambda: probe.probe.twists.find(is_zero, start), what='zero twist')
    time.sleep(2 * CONTROL_PERIOD)        # absence check: no step of it is ever published
    t0 = stamp_s(image.header.stamp)
    moving = [m for _, m in probe.probe.twists.snapshot()[start:] if not is_zero(m)]
    end = t0 + K * CONTROL_PERIOD
    assert not [m for m in moving if t0 - 1e-9 <= stamp_s(m.header.stamp) < end]
    assert probe.trajectories.find(lambda m: m.header.stamp == image.header.stamp,
                                   traj_start) is None
    assert node.stats_snapshot()['hold_reason'].startswith('stale observation')
    assert f'chunk limit {limit:.3f}' in node.stats_snapshot()['hold_reason']


@needs_ros
def test_a_step_late_in_its_slot_past_max_action_age_is_held(chunk_node, chunked):
    """control_period 5 P > max_action_age 1.5 P (P the tests' control period): the step due
    on arrival is too old (zero twist), the next one is published at its slot's start."""
    from ros_probe import is_zero, stamp_s

    node, probe = chunk_node
    _, frames, _ = chunked
    period, max_age = 5 * CONTROL_PERIOD, 1.5 * CONTROL_PERIOD
    assert probe.probe.set_param('control_period', period).successful
    assert probe.probe.set_param('max_action_age', max_age).successful
    try:
        before = node.stats_snapshot()
        start = len(probe.probe.twists.snapshot())
        # step 0's slot: [-1.75, 3.25) x P
        image = _image(probe, frames[0], age_s=1.75 * CONTROL_PERIOD)
        t0 = stamp_s(image.header.stamp)

        def moving():
            return [(t, m) for t, m in probe.probe.twists.snapshot()[start:]
                    if not is_zero(m) and stamp_s(m.header.stamp) >= t0 - 1e-9]
        probe.probe.send(image, moving, timeout=max(20.0, 4 * period))
        items = probe.probe.twists.snapshot()[start:]
        first_time, first = moving()[0]
        assert stamp_s(first.header.stamp) == pytest.approx(t0 + period)
        assert first_time >= t0 + period
        assert node.stats_snapshot()['chunk_steps_published'] > before['chunk_steps_published']
        assert any(is_zero(m) and t < first_time for t, m in items)     # the held step
    finally:
        assert probe.probe.set_param('control_period', CONTROL_PERIOD).successful
        assert probe.probe.set_param('max_action_age', MAX_AGE).successful


@needs_ros
def test_ensemble_blends_the_chunks_covering_each_step(chunk_node, chunked):
    """chunk_blend ensemble (default decay 0.5): chunk B (image P/2 after A's) publishes on
    its own slots the weighted mean of its step i and A's step i (whose slot holds B's slot
    start), B weighing 1 and A exp(-0.5)."""
    from builtin_interfaces.msg import Time
    from ros_probe import twist_values, wait_until
    from std_srvs.srv import Trigger

    node, probe = chunk_node
    _, frames, expected = chunked
    assert probe.probe.set_param('chunk_blend', 'ensemble').successful
    try:
        # ~/reset forgets the chunks of the earlier tests (they would join the blend)
        assert probe.probe.call(probe.probe.reset_client, Trigger.Request()).success
        assert len(node.serving.channels[0].chunk_execution.schedule) == 0
        before = node.stats_snapshot()
        traj_start = len(probe.trajectories.snapshot())
        a = _image(probe, frames[0])
        probe.probe.send(a, lambda: node.stats_snapshot()['actions_published']
                         > before['actions_published'])
        b = _image(probe, frames[1])
        t_b = _ns(a.header.stamp) + round(0.5 * CONTROL_PERIOD * 1e9)
        b.header.stamp = Time(sec=t_b // 10**9, nanosec=t_b % 10**9)
        wait_until(lambda: _ns(probe.probe.now().to_msg()) >= t_b, what='B\'s time')
        start = len(probe.probe.twists.snapshot())
        probe.probe.send(b, lambda: len(probe.trajectories.snapshot()) > traj_start + 1)
        steps, _ = _run_of(probe, b, start)
        w = np.exp(-0.5)
        clocked = [(i, twist) for _, i, twist in steps[1:]]
        assert clocked and [i for i, _ in clocked] == list(range(clocked[0][0], K))
        for i, twist in clocked:
            blend = (expected[1][i] + w * expected[0][i]) / (1 + w)
            np.testing.assert_allclose(twist_values(twist), expected_twist(blend),
                                       rtol=1e-9, atol=1e-12)
        assert node.stats_snapshot()['chunks_replaced'] > before['chunks_replaced']
    finally:
        assert probe.probe.set_param('chunk_blend', 'latest').successful


@needs_ros
@pytest.mark.parametrize('rule', ['continue', 'hold'])
def test_a_chunk_that_does_not_decode_leaves_the_running_chunk_or_holds(ros, chunked, rule):
    """invalid_chunk: chunk A runs; B (a newer image) does not decode. continue (the default):
    A's remaining steps go out as planned and the robot holds only at A's run-out; B counts in
    chunks_refused and errors. hold: A is dropped and a zero twist follows B at once."""
    from ros_probe import is_zero, twist_values, wait_until

    from vla_spec_ros import VLAPolicy

    folder, frames, expected = chunked
    policy = WrappedPolicy(VLAPolicy.from_pretrained(str(folder),
                                                     restrict_to_action_tokens=True), FaultEngine)
    changes = {} if rule == 'continue' else {'invalid_chunk': rule}
    node, probe = _node(ros, policy, f'vla_chunk_invalid_{rule}', **changes)
    try:
        assert node.serving.channels[0].settings.invalid_chunk == rule
        start = len(probe.probe.twists.snapshot())
        a = _image(probe, frames[0])
        probe.probe.send(a, lambda: node.stats_snapshot()['chunk_steps_published'] > 0)
        # A's first published step has arrived (step 0, or a later one when the chunk landed
        # after slot 0 on a slow machine; A is the only image sent): every zero twist of the
        # node's start (no image yet) is before it (one reliable publisher, in order).
        probe.probe.twists.wait_for(lambda m: not is_zero(m), start=start,
                                    what='A\'s first step')
        start_b = len(probe.probe.twists.snapshot())
        before = node.stats_snapshot()
        policy.engine.fault = 'invalid'
        b = _image(probe, frames[1])
        if rule == 'continue':
            probe.probe.send(b, lambda: node.stats_snapshot()['chunks_refused']
                             > before['chunks_refused'])
            steps, _ = _run_of(probe, a, start)
            assert [i for _, i, _ in steps][-1] == K - 1     # A ran to its last step
            for _, i, twist in steps:
                np.testing.assert_allclose(twist_values(twist), expected_twist(expected[0][i]),
                                           rtol=1e-9, atol=1e-12)
            wait_until(lambda: node.stats_snapshot()['chunk_run_outs']
                       > before['chunk_run_outs'], what='A\'s run-out')
            after = node.stats_snapshot()
            assert after['chunks_refused'] - before['chunks_refused'] == 1
            assert after['errors'] - before['errors'] == 1
            assert after['last_error'].startswith('invalid action: injected')
            assert after['holds'] - before['holds'] == 1           # the run-out's only
            assert after['hold_reason'].startswith('chunk ran out')
        else:
            probe.probe.send(b, lambda: node.stats_snapshot()['holds'] > before['holds'])
            _, zero = probe.probe.twists.wait_for(
                lambda m: is_zero(m), start=start_b, what='the zero twist after B')
            # A's chunk was dropped (it never ran out) and nothing after the zero is one of
            # A's steps.
            later = probe.probe.twists.snapshot()[start_b:]
            index = next(i for i, (_, m) in enumerate(later) if m is zero)
            assert not [m for _, m in later[index:] if not is_zero(m)]
            after = node.stats_snapshot()
            assert after['hold_reason'].startswith('invalid action: injected')
            assert after['chunks_refused'] == before['chunks_refused']
            assert after['chunk_run_outs'] == before['chunk_run_outs']
    finally:
        ros[1].remove_node(node)
        node.destroy_node()


@needs_ros
def test_without_trajectory_msgs_the_steps_still_flow(ros, chunked, chunk_node, monkeypatch):
    """No trajectory_msgs: no trajectory publisher, a warning, the steps on ~/twist as usual;
    the frames carry their control step (stamp / control_period)."""
    from ros_probe import wait_until

    from vla_spec_ros import VLAPolicy
    from vla_spec_ros.ros import twist_messages

    folder, frames, expected = chunked
    monkeypatch.setattr(twist_messages, 'MultiDOFJointTrajectory', None)
    policy = WrappedPolicy(VLAPolicy.from_pretrained(str(folder),
                                                     restrict_to_action_tokens=True),
                           RecordingEngine)
    node, probe = _node(ros, policy, 'vla_chunk_plain')
    try:
        assert all(c.twist_output.trajectory_pub is None for c in node.serving.channels)
        assert node.count_publishers('/vla_chunk_plain/trajectory') == 0
        image = _image(probe, frames[0])
        probe.probe.send(image, lambda: node.stats_snapshot()['chunk_steps_published'] > 0)
        wait_until(lambda: node.stats_snapshot()['chunk_run_outs'] > 0, what='run-out')
        submitted = [f for f in policy.engine.frames if f.stream_id == 'default']
        stamp = image.header.stamp.sec + 1e-9 * image.header.stamp.nanosec
        assert submitted[-1].control_step == round(stamp / CONTROL_PERIOD)
    finally:
        ros[1].remove_node(node)
        node.destroy_node()


@needs_ros
@pytest.mark.skipif(not HAS_TRAJECTORY, reason='needs trajectory_msgs')
def test_a_trajectory_topic_goes_out_only_while_subscribed(ros):
    """The chunk's trajectory is built and sent only to the topics someone listens to (the
    chunk's first twist waits for it); a listener that joins gets the next chunk."""
    from rclpy.node import Node
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from ros_probe import Recorder, wait_until
    from trajectory_msgs.msg import MultiDOFJointTrajectory

    from vla_spec_ros.ros.twist_output import TwistOutput

    context, _, probe_node = ros
    node = Node('lazy_trajectory', context=context)
    try:
        output = TwistOutput(node, '/lazy_trajectory/', is_chunked=True)
        decision = decide()
        chunk = chunks.Chunk(decision.actions, 0.0, 0.2, node.get_clock().now().to_msg())
        node_settings = settings(frame_id='tool0')
        output.publish_chunk(chunk, decision.commands, node_settings)
        assert not output._trajectory_live          # nobody listened: nothing to stop later

        received = Recorder(probe_node.get_clock())
        probe_node.create_subscription(MultiDOFJointTrajectory,
                                       '/lazy_trajectory/velocity_trajectory', received,
                                       QoSProfile(depth=10,
                                                  reliability=ReliabilityPolicy.RELIABLE))
        wait_until(lambda: output.trajectory_pub.get_subscription_count() > 0,
                   what='the listener to match')
        assert output.legacy_trajectory_pub.get_subscription_count() == 0
        output.publish_chunk(chunk, decision.commands, node_settings)
        assert output._trajectory_live
        _, msg = wait_until(lambda: received.snapshot()[:1], what='the chunk')[0]
        assert len(msg.points) == len(decision.commands)
        assert msg.header.stamp == chunk.stamp
    finally:
        node.destroy_node()


@pytest.mark.skipif(not HAS_TRAJECTORY, reason='needs trajectory_msgs')
def test_after_a_held_step_the_next_step_sends_the_rest_of_the_velocity_trajectory():
    """A step refused on its own (the chunk kept) stops the velocity trajectory; the next
    step that goes out sends its twist and the chunk's rest again (its due command first),
    stamped with that step's stamp; while the trajectory runs, a step sends only its twist.
    (A fake node: every topic counts as listened to.)"""
    from builtin_interfaces.msg import Time

    from fake_node import RecordingNode
    from vla_spec_ros.ros.message_time import stamp_at
    from vla_spec_ros.ros.twist_output import TwistOutput

    node = RecordingNode(100.0)
    output = TwistOutput(node, '~/', is_chunked=True)
    decision = decide()
    chunk = chunks.Chunk(decision.actions, 100.0, P, stamp_at(Time(), 100.0))
    s = settings(frame_id='tool0')

    def trajectories():
        return [m for topic, m in node.published if topic.endswith('velocity_trajectory')]

    output.publish_chunk(chunk, decision.commands, s)
    output.publish_step(chunk, 0, decision.commands[0], chunk.stamp, s)
    assert len(trajectories()) == 1
    output.hold(stamp_at(Time(), 100.1), s)                     # step 0 refused: a stop
    assert len(trajectories()) == 2
    step_stamp = stamp_at(Time(), 100.0 + P)
    output.publish_step(chunk, 1, decision.commands[1], step_stamp, s)
    rest = trajectories()[-1]
    assert len(trajectories()) == 3 and len(rest.points) == len(decision.commands) - 1
    assert rest.header.stamp == step_stamp
    output.publish_step(chunk, 2, decision.commands[2], stamp_at(Time(), 100.0 + 2 * P), s)
    assert len(trajectories()) == 3                             # running again


@needs_ros
def test_jittered_stamps_half_a_period_in_are_still_one_step_apart(ros, chunked):
    """Two images 1.03 periods apart, the first 0.49 of a period past a whole one: rounded from
    the clock's zero they would be 2 steps apart; the node counts 1 (ros/control_steps.py), so
    the drafter shifts the previous chunk by the step the robot really took."""
    from builtin_interfaces.msg import Time
    from ros_probe import wait_until

    from vla_spec_ros import VLAPolicy

    def stamped(array, time_s):
        msg = probe.probe.raw_image(array)
        msg.header.stamp = Time(sec=int(time_s), nanosec=int(round((time_s % 1) * 1e9)))
        return msg

    def submitted_at(msg):
        return [f for f in policy.engine.frames
                if f.user_data is not None and f.user_data.stamp == msg.header.stamp]

    folder, frames, _ = chunked
    policy = WrappedPolicy(VLAPolicy.from_pretrained(str(folder),
                                                     restrict_to_action_tokens=True),
                           RecordingEngine)
    node, probe = _node(ros, policy, 'vla_chunk_steps')
    try:
        # Matched first: the stamps below leave the first image about one period old, and
        # discovery on a loaded machine must not age it further before it is sent.
        wait_until(lambda: probe.probe.image_pub.get_subscription_count() > 0,
                   what='image subscriber')
        now_s = probe.probe.now().nanoseconds * 1e-9
        first_s = (math.floor(now_s / CONTROL_PERIOD) - 1 + 0.49) * CONTROL_PERIOD
        second_s = first_s + 1.03 * CONTROL_PERIOD
        assert round(second_s / CONTROL_PERIOD) - round(first_s / CONTROL_PERIOD) == 2
        first = stamped(frames[0], first_s)
        probe.probe.send(first, lambda: submitted_at(first))
        wait_until(lambda: probe.probe.now().nanoseconds * 1e-9 >= second_s,
                   what='the second image\'s time')
        second = stamped(frames[1], second_s)
        probe.probe.send(second, lambda: submitted_at(second))
        assert (submitted_at(second)[0].control_step
                - submitted_at(first)[0].control_step) == 1
    finally:
        ros[1].remove_node(node)
        node.destroy_node()
