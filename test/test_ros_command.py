"""Pure tests of the node's rules: action -> twist / gripper, safety decisions, parameter
mapping and classification, config/robot.yaml, and the diagnostics counters. No rclpy.

Expected values are computed by hand in the tests (numbers written out), not by calling the
code under test.
"""
import dataclasses
import math
import pathlib
from dataclasses import dataclass, field

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from vla_spec_ros.config import TUNABLE_ENGINE_FIELDS, EngineConfig, engine_option
from vla_spec_ros.ros import command_rules as cmd
from vla_spec_ros.ros import params
from vla_spec_ros.ros.diagnostics import (ERROR, FRAME_STAGES, OK, WARN, InferenceStats,
                                          frame_stages, level_for, percentile)

ROOT = pathlib.Path(__file__).resolve().parents[1]


def settings(**changes):
    return dataclasses.replace(params.default_node_settings(), **changes)


@dataclass(frozen=True)
class FakeResult:
    """Duck-typed ActionResult (this layer only reads these fields)."""

    action: np.ndarray
    is_valid: bool = True
    invalid_reason: str | None = None
    stats: dict = field(default_factory=dict)


ACTION = np.array([0.01, -0.02, 0.02, 0.1, 0.0, -0.05, 1.0])


# ---- twist ----------------------------------------------------------------------------------

def test_velocity_is_delta_over_period_times_scale():
    s = settings(control_period=0.2, linear_scale=2.0, angular_scale=0.5,
                 max_linear_speed=10.0, max_angular_speed=10.0)
    linear, angular = cmd.velocities_from_action(ACTION, s)
    # 0.01 / 0.2 * 2 = 0.1 ; -0.02 / 0.2 * 2 = -0.2 ; 0.02 / 0.2 * 2 = 0.2
    assert linear == pytest.approx((0.1, -0.2, 0.2))
    # The rotation Rz(-0.05) @ Rx(0.1) as a rotation vector (scipy's, an independent
    # implementation), / 0.2 * 0.5; about (0.25, -0.006, -0.125): not the angles themselves.
    rotation = Rotation.from_euler('xyz', ACTION[3:6]).as_rotvec()
    assert angular == pytest.approx(tuple(rotation / 0.2 * 0.5), rel=1e-12, abs=1e-15)
    assert abs(angular[1]) > 1e-3


def test_the_twist_turns_the_tool_by_the_actions_fixed_axis_rotation():
    """Servo integrates the angular velocity for one period: exp(w * period) must be the
    action's Rz(dyaw) @ Ry(dpitch) @ Rx(droll), at small and large steps alike."""
    s = settings(control_period=0.25, angular_scale=1.0, max_angular_speed=20.0)
    rng = np.random.default_rng(3)
    for size in (0.03, 0.3, 1.2):
        rpy = rng.uniform(-size, size, 3)
        _, angular = cmd.velocities_from_action(np.array([0, 0, 0, *rpy, 1.0]), s)
        turned = Rotation.from_rotvec(np.array(angular) * 0.25)
        wanted = Rotation.from_euler('xyz', rpy)
        assert (turned * wanted.inv()).magnitude() < 1e-12
        # Reading the angles as a rotation vector is off by second-order terms.
        naive = Rotation.from_rotvec(rpy)
        assert (naive * wanted.inv()).magnitude() > 1e-5


def test_clamp_keeps_direction_and_caps_the_norm():
    s = settings(control_period=0.1, linear_scale=1.0, max_linear_speed=0.15,
                 max_angular_speed=0.5)
    # A turn by 0.5 rad about (0, 0.6, 0.8), written as the fixed-axis angles it has.
    rpy = Rotation.from_rotvec([0.0, 0.3, 0.4]).as_euler('xyz')
    action = np.array([0.03, 0.04, 0.0, *rpy, 0.0])
    linear, angular = cmd.velocities_from_action(action, s)
    # unclamped linear (0.3, 0.4, 0) has norm 0.5 -> scaled to 0.15: (0.09, 0.12, 0)
    assert linear == pytest.approx((0.09, 0.12, 0.0))
    # unclamped angular (0, 3, 4) has norm 5 -> 0.5: (0, 0.3, 0.4)
    assert angular == pytest.approx((0.0, 0.3, 0.4))
    # under the limit nothing changes
    linear, _ = cmd.velocities_from_action(action * 0.1, s)
    assert linear == pytest.approx((0.03, 0.04, 0.0))


def test_zero_limit_gives_zero_velocity():
    s = settings(max_linear_speed=0.0, max_angular_speed=0.0)
    linear, angular = cmd.velocities_from_action(ACTION, s)
    assert linear == (0.0, 0.0, 0.0) and angular == (0.0, 0.0, 0.0)


# ---- gripper --------------------------------------------------------------------------------

@pytest.mark.parametrize('value, binarize, invert, expected', [
    (1.0, True, False, 0.08),      # open
    (0.0, True, False, 0.0),       # closed
    (0.5, True, False, 0.08),      # at the threshold counts as open
    (0.49, True, False, 0.0),
    (0.9, True, True, 0.0),        # inverted: 0.1 -> closed
    (0.25, False, False, 0.02),    # continuous: 0 + 0.25 * 0.08
    (1.7, False, False, 0.08),     # clipped to [0, 1]
    (-0.3, False, False, 0.0),
    (0.25, False, True, 0.06),     # inverted continuous: 0.75 * 0.08
])
def test_gripper_mapping(value, binarize, invert, expected):
    s = settings(gripper_binarize=binarize, gripper_invert=invert, gripper_threshold=0.5,
                 gripper_open_position=0.08, gripper_closed_position=0.0)
    assert cmd.gripper_position(value, s) == pytest.approx(expected)


def test_gripper_open_below_closed_position():
    s = settings(gripper_binarize=False, gripper_open_position=-1.0,
                 gripper_closed_position=1.0)
    assert cmd.gripper_position(0.25, s) == pytest.approx(0.5)   # 1 + 0.25 * (-2)


# ---- safety decisions -----------------------------------------------------------------------

def decide(result, **kwargs):
    args = dict(error=None, is_enabled=True, age_s=0.05, settings=settings())
    args.update(kwargs)
    return cmd.decide_command(result, **args)


def assert_hold(command, prefix):
    assert command.is_hold
    assert command.hold_reason.startswith(prefix)
    assert command.linear == (0.0, 0.0, 0.0) and command.angular == (0.0, 0.0, 0.0)
    assert command.gripper is None and command.action is None


def test_valid_fresh_action_is_published():
    s = settings(control_period=0.5, max_linear_speed=10.0, max_angular_speed=10.0,
                 gripper_open_position=0.04)
    command = decide(FakeResult(ACTION), settings=s)
    assert not command.is_hold
    assert command.linear == pytest.approx((0.02, -0.04, 0.04))
    rotation = Rotation.from_euler('xyz', ACTION[3:6]).as_rotvec()
    assert command.angular == pytest.approx(tuple(rotation / 0.5), rel=1e-12, abs=1e-15)
    assert command.gripper == pytest.approx(0.04)
    assert command.action == tuple(ACTION)


def test_disabled_wins_over_everything():
    assert_hold(decide(FakeResult(ACTION), is_enabled=False), 'disabled')
    assert_hold(decide(None, error='boom', is_enabled=False), 'disabled')


def test_engine_error():
    command = decide(None, error='RuntimeError: boom')
    assert_hold(command, 'engine error')
    assert 'boom' in command.hold_reason


def test_invalid_token_result():
    command = decide(FakeResult(np.full(7, np.nan), is_valid=False,
                                invalid_reason='generated non-action token(s) [5]'))
    assert_hold(command, 'invalid action')
    assert 'non-action' in command.hold_reason


@pytest.mark.parametrize('bad', [np.nan, np.inf, -np.inf])
def test_non_finite_action_claimed_valid_is_still_held(bad):
    action = ACTION.copy()
    action[2] = bad
    assert_hold(decide(FakeResult(action)), 'non-finite action')


def test_wrong_shape_is_invalid():
    assert_hold(decide(FakeResult(np.zeros(6))), 'invalid action')


def test_stale_and_future_observations():
    s = settings(max_action_age=0.5)
    assert not decide(FakeResult(ACTION), age_s=0.5, settings=s).is_hold   # boundary: fresh
    command = decide(FakeResult(ACTION), age_s=0.51, settings=s)
    assert_hold(command, 'stale observation')
    assert '0.510' in command.hold_reason
    assert_hold(decide(FakeResult(ACTION), age_s=-2.0, settings=s), 'observation from the future')
    assert not decide(FakeResult(ACTION), age_s=-0.1, settings=s).is_hold   # small skew is fine


def test_zero_command_needs_a_reason():
    with pytest.raises(ValueError, match='reason'):
        cmd.zero_command('')
    assert cmd.reason_kind('stale observation: age 1 s') == 'stale observation'


def test_observation_age_sources():
    header = settings(stamp_source='header')
    receipt = settings(stamp_source='receipt')
    assert cmd.observation_age(10.0, 9.7, 9.9, header) == pytest.approx(0.3)
    assert cmd.observation_age(10.0, 9.7, 9.9, receipt) == pytest.approx(0.1)
    assert cmd.observation_age(10.0, 0.0, 9.9, header) == pytest.approx(0.1)   # unstamped


def test_a_stamp_ahead_of_its_arrival_is_aged_from_the_arrival():
    """A camera clock 0.3 s ahead of the node's (accepted: less than max_action_age 0.5):
    once the camera stops, the image is stale 0.5 s after it arrived, not 0.8 s; a stamp more
    than max_action_age ahead keeps its negative age and is refused as from the future."""
    s = settings(stamp_source='header', max_action_age=0.5)
    receipt, stamp = 100.0, 100.3
    assert cmd.observation_age(receipt, stamp, receipt, s) == 0.0
    assert cmd.freshness_reason(cmd.observation_age(receipt, stamp, receipt, s), s) is None
    age = cmd.observation_age(receipt + 0.6, stamp, receipt, s)
    assert age == pytest.approx(0.6)
    assert cmd.freshness_reason(age, s).startswith('stale observation')
    far = cmd.observation_age(receipt, receipt + 2.0, receipt, s)
    assert far == pytest.approx(-2.0)
    assert cmd.freshness_reason(far, s).startswith('observation from the future')
    # A camera behind (transport latency) is aged by its stamp, as before.
    assert cmd.observation_age(receipt + 0.2, receipt - 0.1, receipt, s) == pytest.approx(0.3)


def test_commands_are_stamped_with_the_time_the_image_is_aged_from():
    """command_stamp: the image's own stamp object when the node ages by it (header, not ahead
    of its arrival) or the image was unstamped (its stamp is then the arrival); else the
    arrival (a stamp ahead of it, or any stamp with stamp_source: receipt): MoveIt Servo
    counts incoming_command_timeout from a command's stamp, so a stamp ahead would let a
    command stand past it if the node stopped."""
    from vla_spec_ros.ros.frame_slot import FrameInfo

    @dataclass(frozen=True)
    class Time:
        sec: int
        nanosec: int

    header = settings(stamp_source='header', max_action_age=0.5)
    receipt = settings(stamp_source='receipt', max_action_age=0.5)
    behind = FrameInfo(Time(99, 900_000_000), 99.9, 100.0, 0.0)
    assert cmd.command_stamp(behind, header) is behind.stamp
    assert cmd.command_stamp(behind, receipt) == Time(100, 0)
    ahead = FrameInfo(Time(100, 300_000_000), 100.3, 100.0, 0.0)
    assert cmd.command_stamp(ahead, header) == Time(100, 0)
    assert cmd.command_stamp(ahead, receipt) == Time(100, 0)
    far = FrameInfo(Time(130, 0), 130.0, 100.25, 0.0)           # 30 s ahead, receipt mode
    assert cmd.command_stamp(far, receipt) == Time(100, 250_000_000)
    unstamped = FrameInfo(Time(100, 1), 0.0, 100.000000001, 0.0)
    assert cmd.command_stamp(unstamped, header) is unstamped.stamp
    # Stamped and received in one nanosecond (one simulated clock tick), at an epoch where
    # the two float sums can differ: compared in whole nanoseconds, the image's own stamp.
    tick = Time(1796000000, 123456789)
    for stamp_s, receipt_s in ((1796000000 + 1e-9 * 123456789, 1796000000123456789 * 1e-9),
                               (1796000000123456789 * 1e-9, 1796000000 + 1e-9 * 123456789)):
        same = FrameInfo(tick, stamp_s, receipt_s, 0.0, receipt_stamp=Time(1796000000,
                                                                           123456789))
        assert cmd.command_stamp(same, header) is tick
    ahead = FrameInfo(Time(1796000000, 200), 1796000000.0000002, 1796000000.0000001, 0.0,
                      receipt_stamp=Time(1796000000, 100))
    assert cmd.command_stamp(ahead, header) is ahead.receipt_stamp     # the exact arrival


def test_watchdog_reasons():
    s = settings(max_action_age=0.5)
    assert cmd.hold_reason_now(False, 0.0, s) == 'disabled'
    assert cmd.hold_reason_now(True, None, s) == 'no image received'
    assert cmd.hold_reason_now(True, 0.6, s).startswith('stale observation')
    assert cmd.hold_reason_now(True, 0.4, s) is None


# ---- parameters -----------------------------------------------------------------------------

def test_every_engine_field_has_a_parameter_with_the_same_default():
    engine_defaults = EngineConfig()
    for f in dataclasses.fields(EngineConfig):
        if f.name in params.ENGINE_FIELDS_NOT_EXPOSED:
            assert f.name not in params.PARAMETERS_BY_NAME
            continue
        spec = params.PARAMETERS_BY_NAME[f.name]
        assert spec.target == 'engine'
        default = getattr(engine_defaults, f.name)
        assert spec.default == ('' if default is None else default), f.name


def test_engine_parameter_ranges_are_the_ones_engine_config_enforces():
    # One source: the ROS range and choices come from EngineConfig's own options, so a value
    # at the ROS bound is accepted by EngineConfig and one step past it is refused by both.
    for spec in params.PARAMETERS:
        if spec.target != 'engine':
            continue
        option = engine_option(spec.name)
        assert (spec.min_value, spec.max_value, spec.choices, spec.is_tunable,
                spec.description) == (option.minimum, option.maximum, option.choices,
                                      option.is_tunable, option.description), spec.name
        if spec.min_value is None:
            continue
        # relax_threshold's full range holds for a draft head; drafting the previous action
        # (the default drafter) bounds it further (test_spec.py).
        context = {'draft_path': 'random'} if spec.name == 'relax_threshold' else {}
        for value, is_valid in ((spec.min_value, True), (spec.max_value, True),
                                (spec.min_value - 1, False), (spec.max_value + 1, False)):
            if is_valid:
                EngineConfig(**context, **{spec.name: value})
                params.settings_from_parameters({**context, spec.name: value})
            else:
                with pytest.raises(ValueError, match=spec.name):
                    EngineConfig(**context, **{spec.name: value})
                with pytest.raises(ValueError, match=spec.name):
                    params.settings_from_parameters({**context, spec.name: value})


def test_node_settings_fields_are_exactly_the_node_parameters():
    node_specs = {s.name for s in params.PARAMETERS if s.target == 'node'}
    assert {f.name for f in dataclasses.fields(params.NodeSettings)} == node_specs


def test_classification_matches_the_issue():
    for name in TUNABLE_ENGINE_FIELDS + ('linear_scale', 'angular_scale', 'max_linear_speed',
                                         'max_angular_speed', 'control_period',
                                         'max_action_age', 'enabled'):
        assert name in params.TUNABLE_PARAMETERS, name
    for name in ('model_path', 'draft_path', 'device', 'dtype', 'mode'):
        assert name in params.LOAD_TIME_PARAMETERS, name
    assert 'load-time' in params.load_time_refusal('device')
    assert set(params.TUNABLE_PARAMETERS).isdisjoint(params.LOAD_TIME_PARAMETERS)


def test_every_parameter_is_described_and_numbers_have_ranges():
    for spec in params.PARAMETERS:
        assert len(spec.description) > 10, spec.name
        if isinstance(spec.default, (int, float)) and not isinstance(spec.default, bool):
            assert spec.min_value is not None and spec.max_value is not None, spec.name
            assert spec.min_value <= spec.default <= spec.max_value, spec.name


def test_mapping_splits_values_between_the_two_dataclasses():
    engine, node = params.settings_from_parameters({
        'mode': 'pipeline', 'draft_path': '/d', 'relax_threshold': 7, 'model_path': '/m',
        'control_period': 1, 'enabled': True})
    assert engine.mode == 'pipeline' and engine.draft_path == '/d'
    assert engine.relax_threshold == 7
    assert node.model_path == '/m' and node.enabled is True
    assert node.control_period == 1.0 and isinstance(node.control_period, float)
    engine, _ = params.settings_from_parameters({})
    assert engine.draft_path is None


@pytest.mark.parametrize('values, field_name', [
    ({'control_period': 0.0}, 'control_period'),
    ({'max_action_age': 100.0}, 'max_action_age'),
    ({'relax_threshold': 256}, 'relax_threshold'),
    ({'mode': 'fast'}, 'mode'),
    ({'frame_id': ''}, 'frame_id'),
    ({'enabled': 'yes'}, 'enabled'),
    ({'linear_scale': math.nan}, 'linear_scale'),
    ({'image_transport': 'theora'}, 'image_transport'),
    ({'linear_scal': 1.0}, 'unknown'),
])
def test_bad_values_raise_naming_the_parameter(values, field_name):
    with pytest.raises(ValueError, match=field_name):
        params.settings_from_parameters(values)


def test_tunable_engine_changes():
    old, _ = params.settings_from_parameters({})
    new, _ = params.settings_from_parameters({'relax_threshold': 3, 'tree_depth': 5})
    assert params.tunable_engine_changes(old, new) == {'relax_threshold': 3, 'tree_depth': 5}
    assert params.tunable_engine_changes(old, old) == {}


def test_robot_yaml_lists_every_parameter_with_its_default_and_a_comment():
    yaml = pytest.importorskip('yaml')
    path = ROOT / 'config' / 'robot.yaml'
    from vla_spec_ros.ros.recommended_settings import LEFT_TO_THE_CHECKPOINT

    data = yaml.safe_load(path.read_text())
    values = data['/**']['ros__parameters']
    defaults = params.default_values()
    # What a checkpoint may recommend is left unset (a params file's value is the user's), and
    # listed as a comment with its default.
    left = {name: defaults.pop(name) for name in LEFT_TO_THE_CHECKPOINT}
    assert values == defaults
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        key = line.strip().removeprefix('# ').split(':', 1)[0]
        if line.startswith('    ') and key in params.PARAMETERS_BY_NAME:
            assert '#' in line and lines[i - 1].strip().startswith('#'), key
    for name, default in left.items():
        commented = [line for line in lines if line.strip().startswith(f'# {name}: ')]
        assert len(commented) == 1, name
        assert yaml.safe_load(commented[0].strip()[2:]) == {name: default}, commented
    # Typed parameters: floats must be written as floats or rclpy refuses the file.
    for spec in params.PARAMETERS:
        if spec.name in values:
            assert type(values[spec.name]) is type(spec.default), spec.name


def test_the_node_reference_documents_every_parameter():
    # The README keeps the parameters that matter and links the full table in docs/node.md;
    # the cameras', state's and action spaces' parameters are in docs/ros_parameters.md.
    text = ''.join((ROOT / 'docs' / name).read_text()
                   for name in ('node.md', 'ros_parameters.md'))
    missing = [spec.name for spec in params.PARAMETERS if f'| `{spec.name}` |' not in text]
    assert not missing, f'docs/node.md and docs/ros_parameters.md do not document {missing}'
    assert '(docs/node.md)' in (ROOT / 'README.md').read_text()


# ---- diagnostics counters -------------------------------------------------------------------

def test_percentile_nearest_rank_brute_force():
    rng = np.random.default_rng(0)
    values = list(rng.random(37))
    ordered = sorted(values)
    for q in (1, 50, 99, 100):
        # nearest rank: the smallest value with at least q% of the values <= it
        expected = next(v for v in ordered
                        if sum(x <= v for x in values) >= q / 100 * len(values))
        assert percentile(values, q) == expected
    with pytest.raises(ValueError):
        percentile([], 50)


def test_stats_lifetime_acceptance_counters_outlive_the_window():
    stats = InferenceStats(window_s=10.0, max_samples=4)
    for i in range(10):
        stats.record_action(float(i), latency_s=0.01, accepted_lengths=[1, 6] if i < 5 else [7])
    snap = stats.snapshot(10.0)
    assert snap['acceptance_length'] == pytest.approx(7.0)      # window: the last 4 steps
    assert snap['verify_steps'] == 15 and snap['accepted_tokens'] == 70


def test_latency_acceptance_and_stages_are_read_over_the_window_only():
    """A robot that has held for an hour shows no latency, acceptance or stage times in
    /diagnostics, not the last ones it had (they fed the Servo timeout check too); the
    lifetime counters stay."""
    stats = InferenceStats(window_s=10.0)
    stats.record_action(0.0, latency_s=0.9, accepted_lengths=[3],
                        stages=dict.fromkeys(FRAME_STAGES, 0.1))
    stats.record_chunk_step(published=True, num_skipped=0, lateness_s=0.05)
    snap = stats.snapshot(5.0)
    assert snap['latency_p99_ms'] == pytest.approx(900.0)
    assert snap['acceptance_length'] == pytest.approx(3.0)
    assert snap['steps_p50_ms'] == pytest.approx(100.0)
    import time
    later = stats.snapshot(time.monotonic() + 3600.0)
    for key in ('latency_p50_ms', 'latency_p99_ms', 'acceptance_length', 'steps_p99_ms',
                'step_late_p99_ms'):
        assert math.isnan(later[key]), key
    assert later['actions_published'] == 1 and later['verify_steps'] == 1


def test_frame_stages_split_a_frames_latency_and_sum_to_it():
    # receipt 10.000, taken 10.004, converted 10.005; the engine: 30 ms from submit to
    # decided of which 24 ms from admission; published at 10.037.
    stages = frame_stages(10.0, 10.004, 10.005, 0.030, 0.024, 10.037)
    assert list(stages) == list(FRAME_STAGES)
    expected = {'queue': 0.004, 'convert': 0.001, 'wait': 0.006, 'steps': 0.024,
                'publish': 0.002}
    assert stages == pytest.approx(expected)
    assert sum(stages.values()) == pytest.approx(10.037 - 10.0)
    # Two clocks (the node's and the engine's) never give a negative stage.
    assert min(frame_stages(0.0, 0.0, 0.0, 0.01, 0.011, 0.009).values()) >= 0.0


def test_stats_report_each_stage_p50_and_p99():
    stats = InferenceStats(window_s=10.0)
    for i in range(100):
        stages = {stage: 0.001 * (i + 1) * (k + 1) for k, stage in enumerate(FRAME_STAGES)}
        stats.record_action(float(i) * 0.01, 0.02, [7], stages)
    stats.record_action(1.1, 0.02, [7])           # a frame without stages counts elsewhere
    snap = stats.snapshot(1.2)
    for k, stage in enumerate(FRAME_STAGES):
        assert snap[f'{stage}_p50_ms'] == pytest.approx(50.0 * (k + 1))
        assert snap[f'{stage}_p99_ms'] == pytest.approx(99.0 * (k + 1))
    assert math.isnan(InferenceStats().snapshot(0.0)['steps_p99_ms'])


def test_stats_rate_latency_and_levels():
    stats = InferenceStats(window_s=10.0)
    for i in range(5):                   # actions at t = 0, 0.5, ..., 2.0 -> 2 Hz
        stats.record_action(100.0 + 0.5 * i, latency_s=0.01 * (i + 1), accepted_lengths=[2, 4])
    stats.record_dropped(3)
    snap = stats.snapshot(102.0)
    assert snap['action_rate_hz'] == pytest.approx(2.0)
    assert snap['latency_p50_ms'] == pytest.approx(30.0)
    assert snap['latency_p99_ms'] == pytest.approx(50.0)
    assert snap['acceptance_length'] == pytest.approx(3.0)
    assert snap['frames_dropped'] == 3 and snap['actions_published'] == 5
    assert snap['verify_steps'] == 10 and snap['accepted_tokens'] == 30
    assert level_for(snap) == OK
    stats.record_hold('stale observation: age 1 s', is_stale_result=True)
    snap = stats.snapshot(102.0)
    assert snap['frames_stale'] == 1 and level_for(snap) == WARN and snap['last_error'] == ''
    stats.record_hold('engine error: RuntimeError: boom')
    snap = stats.snapshot(102.0)
    assert level_for(snap) == ERROR and 'boom' in snap['last_error'] and snap['errors'] == 1
    assert stats.snapshot(200.0)['action_rate_hz'] == 0.0     # window passed
