"""Joint action spaces without a node: the command's per-joint clamps (ros/command_rules.py), the
state vector from a JointState (ros/state_input.py) and the JointTrajectory's timing checked
against JointTrajectoryController's documented acceptance rules (ros/joint_outputs.py).

JTC's rules, as ros2_controllers documents and logs them ("Empty joint names on incoming
trajectory", "Empty trajectory received", "Mismatch between joint_names size ... and
positions", "Time between points ... is not strictly increasing", "Received trajectory with
non-zero start time ... that ends in the past"), are written out in `jtc_rejection` below.
"""
import importlib.util
import math

import numpy as np
import pytest

from vla_spec_ros.ros import command_rules as cmd
from vla_spec_ros.ros import params
from fake_node import RecordingNode
from vla_spec_ros.ros.state_input import joint_positions, state_from_array

JOINTS = ['j1', 'j2', 'j3']
HAS_TRAJECTORY_MSGS = importlib.util.find_spec('trajectory_msgs') is not None


def settings(**values):
    """Node settings of the joint spaces: velocity limits for joint_velocity (the default),
    none for joint_position unless given (there they need a state input)."""
    base = {'action_space': 'joint_velocity', 'joint_names': JOINTS,
            'joint_position_min': [-1.0, -2.0, 0.0], 'joint_position_max': [1.0, 2.0, 3.0]}
    base.update(values)
    if base['action_space'] == 'joint_velocity':
        base.setdefault('joint_max_velocity', [0.5, 1.0, 2.0])
    return params.settings_from_parameters(base)[1]


def test_joint_velocities_are_clamped_per_joint_and_the_extra_value_is_the_gripper():
    s = settings()
    command = cmd.command_from_action(np.array([0.9, -3.0, 0.1, 1.0]), s)
    assert command.joints == (0.5, -1.0, 0.1)            # each within +-its own limit
    assert command.gripper == s.gripper_open_position     # 1.0 >= threshold: open
    assert command.linear == command.angular == cmd.ZERO3


def test_joint_positions_are_clamped_to_their_range_and_no_gripper_without_its_value():
    s = settings(action_space='joint_position')
    command = cmd.command_from_action(np.array([5.0, -5.0, 1.5]), s)
    assert command.joints == (1.0, -2.0, 1.5)
    assert command.gripper is None


def test_non_finite_and_wrong_size_joint_actions_hold():
    s = settings()

    class Result:
        is_valid, invalid_reason = True, None

        def __init__(self, action):
            self.action = action

    nan = cmd.decide_command(Result(np.array([0.1, math.nan, 0.0, 1.0])), error=None,
                             is_enabled=True, age_s=0.0, settings=s, action_dim=4)
    assert cmd.reason_kind(nan.hold_reason) == cmd.REASON_NON_FINITE
    short = cmd.decide_command(Result(np.array([0.1, 0.2, 0.3])), error=None, is_enabled=True,
                               age_s=0.0, settings=s, action_dim=4)
    assert cmd.reason_kind(short.hold_reason) == cmd.REASON_INVALID


def test_the_checkpoints_action_dimension_must_fit_the_joints():
    s = settings()
    cmd.check_action_dim(3, s)
    cmd.check_action_dim(4, s)                    # + gripper
    with pytest.raises(ValueError, match='joint_names: 3 joints'):
        cmd.check_action_dim(7, s)
    with pytest.raises(ValueError, match='action_space: ee_delta'):
        cmd.check_action_dim(8, params.default_node_settings())


@pytest.mark.parametrize('values, field', [
    ({'joint_names': []}, 'joint_names'),
    ({'joint_max_velocity': [1.0]}, 'joint_max_velocity'),
    ({'joint_max_velocity': [1.0, 0.0, 1.0]}, 'joint_max_velocity'),
    ({'action_space': 'joint_position', 'joint_position_min': [0.0, 0.0, 5.0]},
     'joint_position_min'),
    ({'joint_names': ['a', 'a', 'b']}, 'joint_names'),
    ({'image_slots': ['base', 'wrist'], 'image_transports': ['raw']}, 'image_transports'),
    ({'servo_node': '/servo_node'}, 'servo_command_type'),
    ({'pose_targets': True}, 'pose_targets'),
])
def test_bad_joint_parameters_name_the_field(values, field):
    with pytest.raises(ValueError, match=field):
        settings(**values)


def test_crossed_joint_limits_say_how_to_move_the_pair():
    """`ros2 param load` sets the pair one at a time: moving the range past its other end is
    refused at the first half, and the reason says how to do it."""
    with pytest.raises(ValueError, match='j3 lower limit 4.0 not below its upper limit 3.0'
                       r'.*change that end first.*set_parameters_atomically'):
        settings(action_space='joint_position', joint_position_min=[-1.0, -2.0, 4.0])


def test_the_state_follows_the_parameter_order_not_the_message_order():
    out = joint_positions(['j3', 'j1', 'j2'], [3.0, 1.0, 2.0], JOINTS)
    assert [out[j][0] for j in JOINTS] == [1.0, 2.0, 3.0]


def test_bad_joint_states_are_refused_with_the_reason():
    out = joint_positions(['j1', 'j2', 'j3'], [1.0, float('nan'), 3.0], JOINTS)
    assert out['j2'] == (None, "state: non-finite position of 'j2'")
    with pytest.raises(ValueError, match='^state: JointState has 3 names and 2 positions'):
        joint_positions(['j1', 'j2', 'j3'], [1.0, 2.0], JOINTS)


def test_a_joint_state_without_positions_carries_no_state():
    """JointState allows empty arrays: another publisher's velocities or efforts only, on a
    shared /joint_states, are no positions (before: stored as errors, and a frame paired
    with one was refused as bad input)."""
    assert joint_positions(['j1', 'j2', 'j3'], [], JOINTS) == {}


def test_an_array_state_must_have_one_value_per_joint_and_be_finite():
    assert state_from_array([1.0, 2.0, 3.0], JOINTS).tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match='expected 3'):
        state_from_array([1.0], JOINTS)
    with pytest.raises(ValueError, match='non-finite'):
        state_from_array([1.0, math.inf, 0.0], JOINTS)


# ---- JointTrajectory timing against JTC's acceptance rules ------------------------------------

def seconds(t):
    return t.sec + 1e-9 * t.nanosec


def jtc_rejection(msg, controller_joints, now_s):
    """Why JTC's topic interface would reject `msg`, or None (the rules in the docstring)."""
    if not msg.joint_names:
        return 'empty joint names'
    if set(msg.joint_names) - set(controller_joints):
        return 'unknown joint'
    if not msg.points:
        return 'empty trajectory'
    previous = None
    for point in msg.points:
        if len(point.positions) != len(msg.joint_names):
            return 'positions size mismatch'
        t = seconds(point.time_from_start)
        if previous is not None and t <= previous:
            return 'time not strictly increasing'
        previous = t
    start = seconds(msg.header.stamp)
    if start != 0.0 and start + seconds(msg.points[-1].time_from_start) < now_s:
        return 'ends in the past'
    return None


@pytest.mark.skipif(not HAS_TRAJECTORY_MSGS, reason='needs trajectory_msgs')
def test_a_chunk_trajectory_is_one_jtc_accepts_with_its_first_point_one_period_ahead():
    from builtin_interfaces.msg import Time

    from vla_spec_ros.ros.joint_outputs import joint_trajectory_message

    period, now_s = 0.1, 1000.0
    targets = [(0.1 * k, -0.1 * k, 0.5) for k in range(5)]
    msg = joint_trajectory_message(JOINTS, targets, Time(sec=1000, nanosec=0), period)
    assert jtc_rejection(msg, JOINTS, now_s) is None
    times = [seconds(p.time_from_start) for p in msg.points]
    assert times[0] == pytest.approx(period)                   # one period ahead, not at 0
    assert np.allclose(np.diff(times), period)
    assert [tuple(p.positions) for p in msg.points] == targets
    # The same trajectory stamped a second earlier would end in the past: JTC rejects it,
    # which is why the node stamps it when it publishes it.
    late = joint_trajectory_message(JOINTS, targets, Time(sec=999, nanosec=0), period)
    assert jtc_rejection(late, JOINTS, now_s) == 'ends in the past'


# ---- the joint-position hold (JointTrajectoryOutput.hold) ------------------------------------

def _chunk_targets(num_steps):
    return [(0.1 * (k + 1), -0.1 * (k + 1), 0.0) for k in range(num_steps)]


@pytest.mark.skipif(not HAS_TRAJECTORY_MSGS, reason='needs trajectory_msgs')
@pytest.mark.parametrize('step', [0, 3, 7])
def test_a_hold_without_a_measured_state_stops_at_the_point_due_not_at_the_chunks_end(step):
    """A hold during step `step` of an 8-step chunk trajectory, with no fresh measured state:
    a one-point trajectory to the point being approached now, one period ahead (the robot is
    within one step of it, so it goes no faster than planned). Before, it went to the chunk's
    last target, several steps away, to be covered in one period."""
    from types import SimpleNamespace

    from vla_spec_ros.ros.joint_outputs import JointTrajectoryOutput

    period, start = 0.2, 1000.0
    settings = SimpleNamespace(joint_names=JOINTS, control_period=period,
                               joint_max_velocity=())
    node = RecordingNode(start)
    output = JointTrajectoryOutput(node, '~/', lambda s: None)
    commands = [SimpleNamespace(joints=t) for t in _chunk_targets(8)]
    chunk = SimpleNamespace(step_at=lambda now_s: 0)
    output.publish_chunk(chunk, commands, settings)
    node.clock.now_s = start + (step + 0.5) * period        # inside step `step`'s segment
    output.hold(None, settings)
    (_, stop) = node.sent[-1]
    assert len(node.sent) == 2 and len(stop.points) == 1
    assert tuple(stop.points[0].positions) == _chunk_targets(8)[step]
    assert seconds(stop.points[0].time_from_start) == pytest.approx(period)
    assert jtc_rejection(stop, JOINTS, node.clock.now_s) is None


# ---- the joint-position speed bound and the chunk after a step's hold ------------------------

def test_joint_max_velocity_bounds_each_targets_step_from_where_the_joints_are():
    """bounded_targets: each target within limit x period of the one before, the first of
    the start; each joint its own limit; without a bound or a start, as they are."""
    from vla_spec_ros.ros.joint_outputs import bounded_targets

    s = settings(action_space='joint_position', state_input='joint_state',
                 joint_max_velocity=[0.5, 1.0, 2.0], control_period=0.2)   # 0.1, 0.2, 0.4
    targets = [(3.0, -3.0, 0.05), (3.0, -3.0, 0.05)]
    bounded = bounded_targets(targets, (0.0, 0.0, 0.0), s)
    np.testing.assert_allclose(bounded, [(0.1, -0.2, 0.05), (0.2, -0.4, 0.05)])
    assert bounded_targets(targets, None, s) == targets
    unbounded = settings(action_space='joint_position')
    assert bounded_targets(targets, (0.0, 0.0, 0.0), unbounded) == targets


def test_joint_max_velocity_with_joint_position_needs_a_state_input():
    with pytest.raises(ValueError, match='joint_max_velocity: .*set state_input'):
        settings(action_space='joint_position', joint_max_velocity=[1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match='joint_max_velocity'):
        settings(action_space='joint_position', state_input='joint_state',
                 joint_max_velocity=[1.0, 0.0, 1.0])


@pytest.mark.skipif(not HAS_TRAJECTORY_MSGS, reason='needs trajectory_msgs')
def test_a_far_target_is_reached_no_faster_than_joint_max_velocity():
    """The reviewer's case: joints measured at 0, the model asks +3 rad (inside the position
    limits). Before: one point at +3 rad one period ahead (15 rad/s at 0.2 s). Now: the point
    is limit x period away; with nothing saying where the joints are, the robot holds."""
    from types import SimpleNamespace

    from vla_spec_ros.ros.joint_outputs import REASON_JOINTS_UNKNOWN, JointTrajectoryOutput

    s = settings(action_space='joint_position', state_input='joint_state',
                 joint_max_velocity=[0.5, 0.5, 0.5], control_period=0.2,
                 joint_position_min=[-4.0] * 3, joint_position_max=[4.0] * 3)
    node, measured = RecordingNode(1000.0), {'positions': None}
    output = JointTrajectoryOutput(node, '~/', lambda _: measured['positions'])
    prepared, why = output.prepare(1000.0, s)
    assert prepared is None and why.startswith(REASON_JOINTS_UNKNOWN)
    measured['positions'] = (0.0, 0.0, 0.0)
    prepared, why = output.prepare(1000.0, s)
    assert why is None
    output.publish_command(SimpleNamespace(joints=(3.0, 0.0, -3.0)), None, s, prepared)
    (_, msg) = node.sent[-1]
    np.testing.assert_allclose(msg.points[0].positions, (0.1, 0.0, -0.1))
    assert jtc_rejection(msg, JOINTS, 1000.0) is None


@pytest.mark.skipif(not HAS_TRAJECTORY_MSGS, reason='needs trajectory_msgs')
def test_targets_without_a_speed_bound_are_warned_about_once_and_shown_in_diagnostics():
    """JTC bounds no speed: the first targets sent without joint_max_velocity log a warning,
    later ones do not; setting a bound and removing it warns again; holds never warn; the
    robot's /diagnostics says which bound the last targets had."""
    from types import SimpleNamespace

    from diagnostic_msgs.msg import DiagnosticStatus

    from vla_spec_ros.ros.joint_outputs import UNBOUNDED_WARNING, JointTrajectoryOutput

    def speed_bound():
        status = DiagnosticStatus()
        output.add_to_status(status)
        return {kv.key: kv.value for kv in status.values}.get('joint_speed_bound')

    unbounded = settings(action_space='joint_position', state_input='joint_state',
                         control_period=0.2)
    bounded = settings(action_space='joint_position', state_input='joint_state',
                       control_period=0.2, joint_max_velocity=[0.5, 0.5, 0.5])
    node = RecordingNode(1000.0)
    output = JointTrajectoryOutput(node, '~/', lambda _: (0.0, 0.0, 0.0))
    command = SimpleNamespace(joints=(0.1, 0.0, -0.1))
    output.hold(None, unbounded)
    assert node.warnings == [] and speed_bound() is None        # a hold is no target
    output.publish_command(command, None, unbounded)
    output.publish_command(command, None, unbounded)
    assert node.warnings == [UNBOUNDED_WARNING]
    assert speed_bound().startswith('none')
    output.publish_command(command, None, bounded, (0.0, 0.0, 0.0))
    assert speed_bound() == 'joint_max_velocity' and len(node.warnings) == 1
    output.publish_command(command, None, unbounded)
    assert node.warnings == [UNBOUNDED_WARNING] * 2


@pytest.mark.skipif(not HAS_TRAJECTORY_MSGS, reason='needs trajectory_msgs')
def test_after_a_held_step_the_next_step_sends_the_rest_of_the_chunk_again():
    """A step held on its own (the chunk kept) sends "stay", which replaces the chunk's
    trajectory at JTC; the next step that goes out sends the chunk's rest from there (before:
    nothing, so the arm stood while the gripper and ~/action followed the chunk). While the
    chunk's own trajectory runs, a step sends nothing."""
    from types import SimpleNamespace

    from vla_spec_ros.ros.joint_outputs import JointTrajectoryOutput

    period, start = 0.2, 1000.0
    s = settings(action_space='joint_position', control_period=period)
    node = RecordingNode(start)
    output = JointTrajectoryOutput(node, '~/', lambda _: (0.0, 0.0, 0.0))
    targets = _chunk_targets(4)
    chunk = SimpleNamespace(step_at=lambda now_s: 0)
    output.publish_chunk(chunk, [SimpleNamespace(joints=t) for t in targets], s)
    output.publish_step(chunk, 0, SimpleNamespace(joints=targets[0]), None, s)
    assert len(node.sent) == 1                           # the trajectory runs: nothing more
    output.hold(None, s)                                  # step 0 held: "stay"
    assert len(node.sent) == 2
    node.clock.now_s = start + period
    output.publish_step(chunk, 1, SimpleNamespace(joints=targets[1]), None, s)
    (_, rest) = node.sent[-1]
    assert [tuple(p.positions) for p in rest.points] == targets[1:]
    assert jtc_rejection(rest, JOINTS, node.clock.now_s) is None
    output.publish_step(chunk, 2, SimpleNamespace(joints=targets[2]), None, s)
    assert len(node.sent) == 3                           # running again: nothing more
    other = SimpleNamespace(step_at=lambda now_s: 0)      # another chunk's step: not this one
    output.hold(None, s)
    output.publish_step(other, 3, SimpleNamespace(joints=targets[3]), None, s)
    assert len(node.sent) == 4


@pytest.mark.skipif(not HAS_TRAJECTORY_MSGS, reason='needs trajectory_msgs')
def test_a_hold_after_the_trajectory_ended_sends_nothing_without_a_measured_state():
    """Once the last trajectory sent has ended, JTC holds at its end by itself: a hold sends
    nothing (a target re-sent then would pull back a robot someone else moved since); with a
    fresh measured state it goes to the measured positions."""
    from types import SimpleNamespace

    from vla_spec_ros.ros.joint_outputs import JointTrajectoryOutput

    period, start = 0.2, 1000.0
    settings = SimpleNamespace(joint_names=JOINTS, control_period=period,
                               joint_max_velocity=())
    node, measured = RecordingNode(start), {'positions': None}
    output = JointTrajectoryOutput(node, '~/', lambda s: measured['positions'])
    output.hold(None, settings)
    assert node.sent == []                                  # nothing sent yet: nothing
    output.publish_command(SimpleNamespace(joints=(0.3, 0.2, 0.1)), None, settings)
    node.clock.now_s = start + 0.5 * period
    output.hold(None, settings)                             # still running: its point
    assert tuple(node.sent[-1][1].points[0].positions) == (0.3, 0.2, 0.1)
    node.clock.now_s = start + 0.5 * period + period        # the hold's own point reached
    output.hold(None, settings)
    assert len(node.sent) == 2
    measured['positions'] = (0.0, 0.5, 0.0)
    output.hold(None, settings)
    assert len(node.sent) == 3 and tuple(node.sent[-1][1].points[0].positions) == (0.0, 0.5,
                                                                                   0.0)


@pytest.mark.skipif(not HAS_TRAJECTORY_MSGS, reason='needs the ROS message wheels')
def test_the_measured_positions_must_be_within_max_state_age_either_side_and_a_jump_forgets():
    """current_positions (the joint-position hold's target): a state stamped further ahead
    of the node clock than max_state_age is of another clock, not fresh (before: any future
    stamp counted as fresh); a velocity-only message adds nothing; after the node clock went
    back (forget), nothing of the old time line is the robot's position."""
    from builtin_interfaces.msg import Time
    from sensor_msgs.msg import JointState

    from vla_spec_ros.ros.message_time import stamp_at
    from vla_spec_ros.ros.state_input import JointStateInput

    s = settings(action_space='joint_position', max_state_age=0.5)
    node = RecordingNode(1000.0)
    state = JointStateInput(node, '~/', lambda: s)

    def _joint_state(at_s, positions):
        msg = JointState(name=JOINTS, position=list(positions))
        msg.header.stamp = stamp_at(Time(), at_s)
        return msg

    node.on('joint_states')(_joint_state(1000.3, (0.1, 0.2, 0.3)))        # 0.3 s ahead: fine
    assert state.current_positions(s) == (0.1, 0.2, 0.3)
    node.on('joint_states')(_joint_state(1030.0, (0.4, 0.5, 0.6)))        # 30 s ahead: not fresh
    assert state.current_positions(s) is None
    node.on('joint_states')(_joint_state(1000.0, (0.7, 0.8, 0.9)))
    velocities_only = JointState(name=JOINTS, velocity=[1.0, 1.0, 1.0])
    velocities_only.header.stamp = stamp_at(Time(), 1000.1)
    node.on('joint_states')(velocities_only)
    assert state.current_positions(s) == (0.7, 0.8, 0.9)
    state.forget()
    assert state.current_positions(s) is None


@pytest.mark.skipif(not HAS_TRAJECTORY_MSGS, reason='needs the ROS message wheels')
def test_the_action_joints_are_measured_even_when_the_model_reads_fewer():
    """The review's case: the model's state reads one joint (state_joint_names [j1]) and the
    action moves three. Before, only j1 was kept, so the hold never had a measured target and
    joint_max_velocity held the robot for ever ("joint positions unknown") though every joint
    arrived. Now each joint of joint_names is kept by name too; the frame's state is still
    [j1] alone, and a bad value of a joint the model does not read refuses no frame (it only
    leaves the joints' position unknown)."""
    from builtin_interfaces.msg import Time
    from sensor_msgs.msg import JointState

    from vla_spec_ros.ros.joint_outputs import JointTrajectoryOutput
    from vla_spec_ros.ros.message_time import stamp_at
    from vla_spec_ros.ros.state_input import JointStateInput

    s = settings(action_space='joint_position', state_input='joint_state',
                 state_joint_names=['j1'], joint_max_velocity=[0.5, 0.5, 0.5],
                 control_period=0.2, max_state_age=0.5)
    node = RecordingNode(1000.0)
    state = JointStateInput(node, '~/', lambda: s)
    output = JointTrajectoryOutput(node, '~/', state.current_positions)

    def joint_state(positions):
        msg = JointState(name=['gripper', 'j3', 'j2', 'j1'], position=[0.9, *positions])
        msg.header.stamp = stamp_at(Time(), 1000.0)
        return msg

    node.on('joint_states')(joint_state((0.3, 0.2, 0.1)))
    assert state.current_positions(s) == (0.1, 0.2, 0.3)
    vector, problem = state.read_at(1000.0, s)
    assert problem is None and vector.tolist() == [0.1]
    prepared, why = output.prepare(1000.0, s)
    assert why is None and prepared == (0.1, 0.2, 0.3)
    node.on('joint_states')(joint_state((float('nan'), 0.2, 0.1)))
    assert state.current_positions(s) is None
    vector, problem = state.read_at(1000.0, s)
    assert problem is None and vector.tolist() == [0.1]


def test_joint_max_velocity_with_an_array_state_needs_every_action_joint_in_it():
    """An array carries only the state's joints: a speed bound that could never find where
    the other joints are is refused when set, not a robot held for ever."""
    with pytest.raises(ValueError, match=r"joint_max_velocity: .*not \['j2', 'j3'\]"):
        settings(action_space='joint_position', state_input='array', state_joint_names=['j1'],
                 joint_max_velocity=[0.5, 0.5, 0.5])
    settings(action_space='joint_position', state_input='array',
             state_joint_names=['x', *JOINTS], joint_max_velocity=[0.5, 0.5, 0.5])


def test_a_joint_state_stamped_below_zero_is_bad_input_not_taken_as_now():
    """A negative stamp (0 alone means unstamped) is bad input, as an image's is: before, it
    was given its receipt time and counted as a fresh state."""
    from builtin_interfaces.msg import Time
    from sensor_msgs.msg import JointState

    from vla_spec_ros.ros.state_input import JointStateInput

    s = settings(action_space='joint_position', state_input='joint_state', max_state_age=0.5)
    node = RecordingNode(1000.0)
    state = JointStateInput(node, '~/', lambda: s)
    msg = JointState(name=JOINTS, position=[0.1, 0.2, 0.3])
    msg.header.stamp = Time(sec=-5, nanosec=0)
    node.on('joint_states')(msg)
    assert state.current_positions(s) is None
    value, problem = state.read_at(1000.0, s)
    assert value is None and 'below zero' in problem[0] and problem[1] is True


def test_a_state_array_kept_under_other_state_joint_names_is_no_hold_target():
    """state_input array: a state kept before state_joint_names changed is in the old layout.
    Before, the joint-position hold read it through the new names: fewer names took a
    joint's target from another joint's value, more raised IndexError out of the watchdog
    (ending the node). Now such a state gives no target (and the node also forgets the kept
    states when the names change, Serving.apply)."""
    from std_msgs.msg import Float64MultiArray

    from vla_spec_ros.ros.state_input import ArrayStateInput

    s = settings(action_space='joint_position', state_input='array',
                 state_joint_names=['x', *JOINTS])
    node = RecordingNode(1000.0)
    state = ArrayStateInput(node, '~/', lambda: s)
    node.on('state')(Float64MultiArray(data=[9.0, 0.1, 0.2, 0.3]))
    assert state.current_positions(s) == (0.1, 0.2, 0.3)
    for names in (JOINTS, ['x', 'y', *JOINTS]):       # fewer names, more names
        changed = settings(action_space='joint_position', state_input='array',
                           state_joint_names=names)
        assert state.current_positions(changed) is None


@pytest.mark.skipif(not HAS_TRAJECTORY_MSGS, reason='needs trajectory_msgs')
def test_repeated_holds_do_not_stretch_the_stop_and_a_clock_jump_forgets_the_trajectory():
    """Holds come in bursts (the watchdog's halt messages, each refused frame): each goes to
    the first hold's point and none stretches its window, so one period after the first hold
    nothing more is sent (a robot moved since is left alone). After the node clock went back
    (a simulator reset), nothing of the old time line is a target: neither the trajectory sent
    before (its stamp now in the future) nor after `forget`."""
    from types import SimpleNamespace

    from vla_spec_ros.ros.joint_outputs import JointTrajectoryOutput

    period, start = 0.2, 1000.0
    settings = SimpleNamespace(joint_names=JOINTS, control_period=period,
                               joint_max_velocity=())
    node = RecordingNode(start)
    output = JointTrajectoryOutput(node, '~/', lambda s: None)
    output.publish_chunk(SimpleNamespace(step_at=lambda now_s: 0),
                         [SimpleNamespace(joints=t) for t in _chunk_targets(8)], settings)
    for now in (1000.1, 1000.2, 1000.25):                 # inside the first hold's period
        node.clock.now_s = now
        output.hold(None, settings)
        assert tuple(node.sent[-1][1].points[0].positions) == _chunk_targets(8)[0]
    assert len(node.sent) == 4
    node.clock.now_s = 1000.35                            # its period ended: left alone
    output.hold(None, settings)
    assert len(node.sent) == 4
    output.publish_chunk(SimpleNamespace(step_at=lambda now_s: 0),
                         [SimpleNamespace(joints=t) for t in _chunk_targets(8)], settings)
    node.clock.now_s = 10.0                               # the clock went back
    output.hold(None, settings)
    assert len(node.sent) == 5                            # the chunk, no hold
    node.clock.now_s = 1000.4
    output.forget()
    output.hold(None, settings)
    assert len(node.sent) == 5
