"""Pure-Python tests of the simulator bridge's command logic (no rclpy, torch or Meta-World).

The round trip goes through the VLA node's own conversion (ros/command_rules.py) so that the bridge
is tested against what the node really publishes, not against a copy of its formula.
"""
import dataclasses
import subprocess
import sys

import numpy as np
import pytest

from vla_spec_ros.ros import command_rules as cmd
from vla_spec_ros.ros.params import settings_from_parameters
from vla_spec_ros.sim.answer_pairing import AnswerPairs, FrameRegistry, next_stamp_ns
from vla_spec_ros.sim.bridge_settings import DESCRIPTIONS, BridgeSettings
from vla_spec_ros.sim.delayed_lockstep import DelayedLockstep
from vla_spec_ros.sim.lockstep_matching import LockstepMatcher
from vla_spec_ros.sim.realtime_clock import RealtimeCommand
from vla_spec_ros.sim.twist_to_action import action_from_twist, gripper_openness

SHARED = dict(control_period=0.1, linear_scale=2.0, angular_scale=0.5, max_linear_speed=1.0,
              max_angular_speed=2.0, gripper_open_position=0.04, gripper_closed_position=0.0)
# The bridge's pure-Python modules under vla_spec_ros/sim.
BRIDGE_LOGIC_MODULES = ('answer_pairing', 'bridge_settings', 'delayed_lockstep',
                        'episode_records', 'lockstep_matching', 'realtime_clock',
                        'twist_to_action')


def node_settings(**overrides):
    values = dict(SHARED, gripper_binarize=False)
    values.update(overrides)
    return settings_from_parameters(values)[1]


def test_modules_import_without_rclpy_torch_or_metaworld():
    imports = ', '.join(f'vla_spec_ros.sim.{name}' for name in BRIDGE_LOGIC_MODULES)
    code = (f'import sys, {imports}; '
            'print(sorted(m for m in ("rclpy", "torch", "metaworld", "mujoco") '
            'if m in sys.modules))')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == '[]'


def test_twist_inverts_the_node_command_exactly():
    bridge, node = BridgeSettings(**SHARED), node_settings()
    rng = np.random.default_rng(0)
    for _ in range(50):
        action = np.concatenate([rng.uniform(-0.02, 0.02, 6), rng.uniform(0.0, 1.0, 1)])
        command = cmd.command_from_action(action, node)
        recovered = action_from_twist(command.linear, command.angular, command.gripper, bridge)
        np.testing.assert_allclose(recovered, action, rtol=1e-12, atol=1e-15)


def test_binarized_gripper_comes_back_as_open_or_closed():
    bridge, node = BridgeSettings(**SHARED), node_settings(gripper_binarize=True)
    for value, expected in ((0.7, 1.0), (0.2, 0.0), (0.5, 1.0)):
        command = cmd.command_from_action(np.r_[np.zeros(6), value], node)
        assert action_from_twist(command.linear, command.angular, command.gripper,
                                 bridge)[6] == expected


def test_gripper_openness_clips_and_inverts_the_interpolation():
    s = BridgeSettings(gripper_open_position=-1.0, gripper_closed_position=1.0)
    assert gripper_openness(-1.0, s) == 1.0
    assert gripper_openness(1.0, s) == 0.0
    assert gripper_openness(0.0, s) == 0.5
    assert gripper_openness(5.0, s) == 0.0


def test_servo_limit_clamps_the_norm_and_keeps_the_direction():
    s = BridgeSettings(**SHARED)
    action = action_from_twist((3.0, 4.0, 0.0), (0.0, 0.0, -4.0), 0.04, s)
    # |v| = 5 m/s clamped to 1 m/s: (0.6, 0.8, 0) m/s * 0.1 s / scale 2
    np.testing.assert_allclose(action[:3], [0.03, 0.04, 0.0], rtol=1e-12)
    np.testing.assert_allclose(action[3:6], [0.0, 0.0, -2.0 * 0.1 / 0.5], rtol=1e-12)
    assert action[6] == 1.0


def test_non_finite_commands_are_refused():
    with pytest.raises(ValueError, match='non-finite'):
        action_from_twist((np.nan, 0, 0), (0, 0, 0), 0.0, BridgeSettings())
    with pytest.raises(ValueError, match='linear/angular'):
        action_from_twist((0, 0), (0, 0, 0), 0.0, BridgeSettings())


@pytest.mark.parametrize('changes, field', [
    ({'sim_mode': 'fast'}, 'sim_mode'),
    ({'linear_scale': 0.0}, 'linear_scale'),
    ({'control_period': -1.0}, 'control_period'),
    ({'gripper_open_position': 0.0}, 'gripper_open_position'),
    ({'max_steps': 0}, 'max_steps'),
    ({'image_size': 64.0}, 'image_size'),
    ({'command_timeout_s': float('inf')}, 'command_timeout_s'),
    ({'frame_id': ' '}, 'frame_id'),
    ({'max_republish': 1.5}, 'max_republish'),
])
def test_bad_settings_name_the_field(changes, field):
    with pytest.raises(ValueError, match=field):
        BridgeSettings(**changes)


def test_every_setting_has_a_parameter_description():
    assert set(DESCRIPTIONS) == {f.name for f in dataclasses.fields(BridgeSettings)}


def test_stamps_are_strictly_increasing():
    assert next_stamp_ns(100, None) == 100
    assert next_stamp_ns(100, 99) == 100
    assert next_stamp_ns(100, 100) == 101
    assert next_stamp_ns(50, 100) == 101        # clock stepped back


def test_registry_measures_the_first_answer_only_and_forgets_old_frames():
    registry = FrameRegistry(max_frames=2)
    registry.add(10, 1.0)
    with pytest.raises(ValueError, match='stamp_ns'):
        registry.add(10, 2.0)
    registry.add(20, 2.0)
    assert registry.first_answer_latency(10, 1.25) == 0.25
    assert registry.first_answer_latency(10, 1.5) is None       # a second answer
    assert registry.first_answer_latency(99, 1.5) is None       # not a published frame
    registry.add(30, 3.0)
    assert 10 not in registry and 20 in registry and 30 in registry


def registry_with(*stamps):
    registry = FrameRegistry()
    for i, stamp in enumerate(stamps):
        registry.add(stamp, float(i))
    return registry


def matcher_with(*stamps, max_republish=3):
    return LockstepMatcher(AnswerPairs(registry_with(*stamps)), max_republish)


def test_lockstep_needs_the_twist_of_this_frame_and_its_gripper():
    matcher = matcher_with(1, 2)
    matcher.begin_frame(2)
    matcher.on_gripper(0.04)
    assert matcher.take() is None                     # gripper alone is not a command
    assert matcher.on_twist(2, (1, 0, 0), (0, 0, 0))
    command = matcher.take()
    assert command.stamp_ns == 2 and command.linear == (1, 0, 0)
    assert command.gripper_position == 0.04
    assert matcher.take() is None                     # one command per frame


def test_lockstep_ignores_holds_and_pairs_grippers_in_publish_order():
    matcher = matcher_with(1, 2)
    matcher.begin_frame(2)
    # A zero-twist hold (node-clock stamp) carries no gripper message.
    assert not matcher.on_twist(12345, (0, 0, 0), (0, 0, 0))
    # A late duplicate answer to frame 1 (twist + gripper), then frame 2's answer.
    assert matcher.on_twist(1, (9, 9, 9), (0, 0, 0))
    assert matcher.on_twist(2, (1, 2, 3), (0, 0, 0))
    matcher.on_gripper(0.0)                            # frame 1's gripper
    assert matcher.take() is None                      # frame 2's gripper not here yet
    matcher.on_gripper(0.04)
    command = matcher.take()
    assert command.linear == (1, 2, 3) and command.gripper_position == 0.04
    assert matcher.num_other_answers == 1


def test_lockstep_gripper_arriving_after_the_next_frame_began_keeps_the_pairing():
    # Frame 1 was republished, so the node answered it twice. The duplicate twist arrives
    # before frame 1's gripper, its gripper only after frame 2 was published. Pairing inside a
    # per-frame window gave frame 2 the duplicate's gripper (0.9) and shifted every later pair.
    matcher = matcher_with(1, 2, 3)
    matcher.begin_frame(1)
    matcher.on_twist(1, (1, 0, 0), (0, 0, 0))
    matcher.on_twist(1, (1, 0, 0), (0, 0, 0))          # duplicate answer (republication)
    matcher.on_gripper(0.5)
    assert matcher.take().gripper_position == 0.5
    matcher.begin_frame(2)
    matcher.on_gripper(0.9)                            # the duplicate's gripper, late
    assert matcher.take() is None                      # frame 2's twist is not here yet
    matcher.on_twist(2, (0, 2, 0), (0, 0, 0))
    assert matcher.take() is None                      # ... nor its gripper
    matcher.on_gripper(0.2)
    command = matcher.take()
    assert (command.stamp_ns, command.linear, command.gripper_position) == (2, (0, 2, 0), 0.2)
    matcher.begin_frame(3)
    matcher.on_twist(3, (0, 0, 3), (0, 0, 0))
    matcher.on_gripper(0.7)
    assert matcher.take().gripper_position == 0.7      # later pairs stay aligned
    assert matcher.num_other_answers == 1


def test_lockstep_queues_survive_republication_frames_and_episodes():
    matcher = matcher_with(1, 2, 3)
    matcher.begin_episode()
    matcher.begin_frame(1)
    matcher.on_twist(1, (1, 0, 0), (0, 0, 0))          # republication: no begin_frame
    matcher.on_gripper(1.0)
    assert matcher.take().linear == (1, 0, 0)
    matcher.begin_frame(2)
    matcher.on_twist(2, (0, 1, 0), (0, 0, 0))          # frame 2's twist, gripper not yet here
    matcher.end()                                      # episode over (e.g. its timeout)
    assert matcher.take() is None
    matcher.begin_episode()                            # counts restart, the FIFOs do not
    assert matcher.num_other_answers == 0
    matcher.begin_frame(3)
    matcher.on_gripper(0.3)                            # frame 2's gripper: pairs with its twist
    matcher.on_twist(3, (0, 0, 1), (0, 0, 0))
    matcher.on_gripper(0.6)
    command = matcher.take()
    assert command.stamp_ns == 3 and command.gripper_position == 0.6
    assert matcher.num_other_answers == 1
    with pytest.raises(ValueError, match='stamp_ns'):
        matcher.begin_frame(4)


def test_lockstep_never_applies_a_non_finite_answer():
    matcher = matcher_with(1)
    matcher.begin_frame(1)
    matcher.on_twist(1, (float('nan'), 0, 0), (0, 0, 0))
    matcher.on_gripper(0.5)
    assert matcher.take() is None and matcher.num_other_answers == 1
    matcher.on_twist(1, (1, 0, 0), (0, 0, 0))
    matcher.on_gripper(float('nan'))                   # an unreadable gripper message
    assert matcher.take() is None and matcher.num_other_answers == 2
    matcher.on_twist(1, (1, 0, 0), (0, 0, 0))
    matcher.on_gripper(0.5)
    assert matcher.take().linear == (1.0, 0.0, 0.0)


def test_lockstep_republishes_a_frame_at_most_max_republish_times():
    matcher = matcher_with(1, 2, max_republish=2)
    matcher.begin_frame(1)
    assert [matcher.should_republish() for _ in range(4)] == [True, True, False, False]
    assert matcher.num_republished == 2
    matcher.begin_frame(2)                             # a new frame gets a new budget
    assert matcher.num_republished == 0 and matcher.should_republish()
    never = matcher_with(1, max_republish=0)
    never.begin_frame(1)
    assert not never.should_republish()
    with pytest.raises(ValueError, match='max_republish'):
        matcher_with(1, max_republish=-1)
    with pytest.raises(ValueError, match='max_republish'):
        BridgeSettings(max_republish=-1)
    assert BridgeSettings().max_republish == 3


def test_answer_pairs_are_bounded_and_pop_in_order():
    pairs = AnswerPairs(registry_with(1, 2), max_pending=2)
    for position in (0.1, 0.2, 0.3):                  # one gripper too many: oldest dropped
        pairs.on_gripper(position)
    pairs.on_twist(1, (1, 0, 0), (0, 0, 0))
    pairs.on_twist(2, (2, 0, 0), (0, 0, 0))
    assert [(p.stamp_ns, p.gripper_position) for p in pairs.pop()] == [(1, 0.2), (2, 0.3)]
    assert pairs.pop() == []
    with pytest.raises(ValueError, match='max_pending'):
        AnswerPairs(FrameRegistry(), max_pending=0)


def test_realtime_uses_fresh_commands_and_holds_the_gripper_when_stale():
    state = RealtimeCommand(AnswerPairs(registry_with(10, 20)), command_timeout_s=0.5,
                            initial_gripper_position=0.04)
    state.begin_episode(10, initial_gripper_position=0.04)
    linear, angular, gripper, is_fresh = state.command_at(0.0)
    assert (linear, angular, gripper, is_fresh) == ((0.0,) * 3, (0.0,) * 3, 0.04, False)
    state.on_twist(10, (1, 2, 3), (4, 5, 6), receipt_s=10.0)
    state.on_gripper(0.0)
    assert state.command_at(10.5) == ((1, 2, 3), (4, 5, 6), 0.0, True)
    assert state.command_at(10.6) == ((0.0,) * 3, (0.0,) * 3, 0.0, False)
    state.on_twist(999, (0, 0, 0), (0, 0, 0), receipt_s=11.0)   # a hold: taken, no gripper
    assert state.command_at(11.0) == ((0, 0, 0), (0, 0, 0), 0.0, True)
    with pytest.raises(ValueError, match='command_timeout_s'):
        RealtimeCommand(AnswerPairs(FrameRegistry()), 0.0, 0.0)


def test_realtime_ignores_answers_to_a_previous_episode_and_their_grippers():
    # Frames 10 and 20 belong to episode A, 30 and 40 to episode B (first frame 30).
    state = RealtimeCommand(AnswerPairs(registry_with(10, 20, 30, 40)), 0.5, 1.0)
    state.on_twist(10, (9, 9, 9), (0, 0, 0), receipt_s=0.0)     # before any episode: ignored
    state.on_gripper(0.1)
    assert state.command_at(0.0)[2:] == (1.0, False)
    state.begin_episode(30, initial_gripper_position=1.0)
    assert state.num_ignored_answers == 0
    state.on_twist(20, (5, 5, 5), (0, 0, 0), receipt_s=1.0)     # late answer to episode A
    assert state.command_at(1.0) == ((0.0,) * 3, (0.0,) * 3, 1.0, False)
    state.on_twist(30, (1, 0, 0), (0, 0, 0), receipt_s=1.1)     # episode B's first frame
    state.on_gripper(0.2)                                       # frame 20's gripper: ignored
    assert state.command_at(1.1) == ((1, 0, 0), (0, 0, 0), 1.0, True)
    state.on_gripper(0.3)                                       # frame 30's gripper
    assert state.command_at(1.2) == ((1, 0, 0), (0, 0, 0), 0.3, True)
    assert state.num_ignored_answers == 1


# ---- delayed lock-step ----------------------------------------------------------------------

def act(i, gripper=0.5):
    """A distinguishable action: x-delta i, gripper `gripper`."""
    return np.r_[float(i), np.zeros(5), gripper]


def schedule(delay, periods, answers=None):
    """[(period, applied x-delta, gripper, is_fresh, frame sent)] of `periods` periods; the
    policy answers frame t with act(t) (or answers[t])."""
    out = []
    for t in range(periods):
        sent = delay.wants_frame(t)
        if sent:
            delay.answer(t, act(t) if answers is None else answers[t])
        action, is_fresh = delay.action_at(t)
        out.append((t, action[0], action[6], is_fresh, sent))
    return out


def test_delay_zero_is_plain_lockstep():
    for frames in ('every', 'one_in_flight'):
        for hold in ('previous', 'zero'):
            delay = DelayedLockstep(0, hold, frames)
            assert schedule(delay, 5) == [(t, t, 0.5, True, True) for t in range(5)]
            assert delay.num_fresh == 5 and delay.num_held == 0


def test_delay_every_frame_lands_d_periods_later_holding_before():
    delay = DelayedLockstep(2, 'previous', 'every')
    got = schedule(delay, 6)
    # Periods 0 and 1 hold the initial command (no motion, gripper open), then frame k's
    # action is applied at k + 2; every frame is sent.
    assert got == [(0, 0.0, 1.0, False, True), (1, 0.0, 1.0, False, True),
                   (2, 0.0, 0.5, True, True), (3, 1.0, 0.5, True, True),
                   (4, 2.0, 0.5, True, True), (5, 3.0, 0.5, True, True)]
    assert (delay.num_fresh, delay.num_held) == (4, 2)


def test_delay_one_in_flight_sends_every_dth_frame_and_holds_previous_or_zero():
    previous = schedule(DelayedLockstep(3, 'previous', 'one_in_flight'), 8,
                        answers={t: act(t + 1, 0.2) for t in range(8)})
    assert [p[4] for p in previous] == [True, False, False, True, False, False, True, False]
    # Frame 0 (x 1) lands at 3 and holds through 5, frame 3 (x 4) lands at 6.
    assert [(p[1], p[3]) for p in previous] == [
        (0, False), (0, False), (0, False), (1, True), (1, False), (1, False), (4, True),
        (4, False)]
    zero = schedule(DelayedLockstep(3, 'zero', 'one_in_flight'), 8,
                    answers={t: act(t + 1, 0.2) for t in range(8)})
    assert [z[1] for z in zero] == [0, 0, 0, 1, 0, 0, 4, 0]
    # The gripper keeps its last value under either hold.
    assert [z[2] for z in zero] == [1.0, 1.0, 1.0, 0.2, 0.2, 0.2, 0.2, 0.2]


def test_delay_restarts_per_episode_and_checks_the_call_order():
    delay = DelayedLockstep(1)
    schedule(delay, 3)
    delay.begin_episode()
    assert schedule(delay, 2) == [(0, 0.0, 1.0, False, True), (1, 0.0, 0.5, True, True)]
    with pytest.raises(ValueError, match='period'):
        delay.action_at(5)                       # not the current period
    with pytest.raises(ValueError, match='period'):
        delay.action_at(2)                       # frame 2 is wanted and was not answered
    delay.answer(2, act(2))
    with pytest.raises(ValueError, match='period'):
        delay.answer(2, act(2))                  # answered twice
    skipping = DelayedLockstep(2, delay_frames='one_in_flight')
    skipping.answer(0, act(0))
    skipping.action_at(0)
    with pytest.raises(ValueError, match='period'):
        skipping.answer(1, act(1))               # frame 1 is not sent with one in flight
    with pytest.raises(ValueError, match='action'):
        DelayedLockstep(0).answer(0, np.r_[np.nan, np.zeros(6)])


@pytest.mark.parametrize('kwargs, field', [
    ({'action_delay': -1}, 'action_delay'), ({'action_delay': 1.0}, 'action_delay'),
    ({'action_delay': True}, 'action_delay'), ({'delay_hold': 'last'}, 'delay_hold'),
    ({'delay_frames': 'some'}, 'delay_frames')])
def test_bad_delay_settings_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        DelayedLockstep(**kwargs)
    with pytest.raises(ValueError, match=field):
        BridgeSettings(**kwargs)


def test_delay_is_lockstep_only():
    assert BridgeSettings(action_delay=3).action_delay == 3
    with pytest.raises(ValueError, match='action_delay'):
        BridgeSettings(sim_mode='realtime', action_delay=1)
