"""The robot state from a JointState (ros/state_input.py, docs/action_spaces.md "Robot state"):
a robot's /joint_states carries every joint, so the configured joints are selected by name in
the configured order and the others ignored; a configured joint missing, named twice or not
finite refuses the state with a reason naming it. Plain Python, no rclpy."""
import math

import pytest

from vla_spec_ros.ros.state_input import MAX_NAMES_SHOWN, state_from_joint_state

ARM = ['j1', 'j2', 'j3']


def test_extra_joints_in_another_order_are_ignored():
    names = ['base_x', 'j3', 'finger_left', 'j1', 'finger_right', 'j2', 'left_arm_j1']
    positions = [5.0, 3.0, 0.04, 1.0, 0.04, 2.0, -1.0]
    assert state_from_joint_state(names, positions, ARM).tolist() == [1.0, 2.0, 3.0]


def test_a_non_finite_joint_outside_the_configured_ones_does_not_refuse():
    # A wheel or a mimic finger with a NaN position says nothing about the arm's state.
    names = ['wheel', 'j1', 'j2', 'j3']
    vector = state_from_joint_state(names, [math.nan, 1.0, 2.0, 3.0], ARM)
    assert vector.tolist() == [1.0, 2.0, 3.0]


@pytest.mark.parametrize('names, positions, text', [
    (['j1', 'finger', 'j2'], [1.0, 0.0, 2.0], "missing joints ['j3']"),
    (['finger', 'j2', 'j3', 'j1'], [0.0, math.nan, 3.0, 1.0], "non-finite position of ['j2']"),
    (['j1', 'j2', 'j3', 'finger'], [1.0, 2.0, math.inf, 0.0], "non-finite position of ['j3']"),
    (['j1', 'j2', 'j3', 'j2'], [1.0, 2.0, 3.0, 2.5], "names joints ['j2'] more than once"),
    (['j1', 'j2', 'j3', 'finger'], [1.0, 2.0, 3.0], '4 names and 3 positions'),
])
def test_a_configured_joint_missing_repeated_or_not_finite_is_refused(names, positions, text):
    with pytest.raises(ValueError) as info:
        state_from_joint_state(names, positions, ARM)
    assert str(info.value).startswith('state: ') and text in str(info.value)


def test_a_missing_joint_reason_quotes_a_bounded_part_of_the_message():
    names = [f'joint_{i}' for i in range(40)]
    with pytest.raises(ValueError) as info:
        state_from_joint_state(names, [0.0] * 40, ARM)
    reason = str(info.value)
    assert "missing joints ['j1', 'j2', 'j3']" in reason
    assert f'joint_{MAX_NAMES_SHOWN - 1}' in reason and f'joint_{MAX_NAMES_SHOWN}\'' not in reason
