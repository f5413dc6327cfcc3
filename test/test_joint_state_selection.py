"""The robot state's positions from a JointState (ros/state_input.py, docs/action_spaces.md
"Robot state"): the configured joints a message carries are selected by name, whatever the
message's order and whatever else it carries (a whole robot's /joint_states, or one of several
publishers'); a configured joint named twice or not finite gets its reason, and a message whose
counts differ is refused whole. Plain Python, no rclpy."""
import math

import pytest

from vla_spec_ros.ros.state_input import joint_positions

ARM = ['j1', 'j2', 'j3']


def test_extra_joints_in_another_order_are_ignored():
    names = ['base_x', 'j3', 'finger_left', 'j1', 'finger_right', 'j2', 'left_arm_j1']
    positions = [5.0, 3.0, 0.04, 1.0, 0.04, 2.0, -1.0]
    assert joint_positions(names, positions, ARM) == {
        'j1': (1.0, None), 'j2': (2.0, None), 'j3': (3.0, None)}


def test_a_non_finite_joint_outside_the_configured_ones_does_not_refuse():
    # A wheel or a mimic finger with a NaN position says nothing about the arm's state.
    out = joint_positions(['wheel', 'j1', 'j2', 'j3'], [math.nan, 1.0, 2.0, 3.0], ARM)
    assert [out[j][0] for j in ARM] == [1.0, 2.0, 3.0]


def test_a_message_carries_only_the_joints_it_names():
    # One of several publishers: the gripper's joints, or part of the arm's.
    assert joint_positions(['finger'], [0.04], ARM) == {}
    assert joint_positions(['j2', 'finger'], [2.0, 0.04], ARM) == {'j2': (2.0, None)}


@pytest.mark.parametrize('names, positions, joint, text', [
    (['finger', 'j2', 'j3', 'j1'], [0.0, math.nan, 3.0, 1.0], 'j2', "non-finite position of 'j2'"),
    (['j1', 'j2', 'j3', 'finger'], [1.0, 2.0, math.inf, 0.0], 'j3', "non-finite position of 'j3'"),
    (['j1', 'j2', 'j3', 'j2'], [1.0, 2.0, 3.0, 2.5], 'j2', "names joint 'j2' more than once"),
])
def test_a_configured_joint_repeated_or_not_finite_gets_its_reason(names, positions, joint, text):
    out = joint_positions(names, positions, ARM)
    value, reason = out[joint]
    assert value is None and reason.startswith('state: ') and text in reason
    assert all(out[j][1] is None for j in ARM if j != joint)     # the others stand


def test_a_message_whose_counts_differ_is_refused_whole():
    with pytest.raises(ValueError, match='^state: JointState has 4 names and 3 positions'):
        joint_positions(['j1', 'j2', 'j3', 'finger'], [1.0, 2.0, 3.0], ARM)
