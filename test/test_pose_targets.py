"""Absolute targets from end-effector deltas (vla_spec_ros/ros/pose_math.py), pure Python.

The expected poses come from scipy's Rotation (an independent implementation): fixed-axis
'xyz' Euler angles are OpenVLA's droll, dpitch, dyaw; in the base frame the delta rotation is
composed on the left, in the tool frame on the right.
"""
import math

import numpy as np
import pytest

from vla_spec_ros.ros.pose_math import (Pose, PoseHistory, apply_delta, integrate, point_times,
                                        quaternion_from_rpy, quaternion_multiply, rotate)

Rotation = pytest.importorskip('scipy.spatial.transform').Rotation


def random_pose(rng):
    return Pose(tuple(rng.uniform(-0.5, 0.5, 3)), tuple(Rotation.random(random_state=rng)
                                                        .as_quat()))


def same_rotation(q, rotation, atol=1e-9):
    """q and the scipy rotation are the same rotation (q and -q both are)."""
    expected = rotation.as_quat()
    return np.allclose(q, expected, atol=atol) or np.allclose(q, -expected, atol=atol)


def test_rpy_is_fixed_axis_xyz():
    rng = np.random.default_rng(0)
    for _ in range(20):
        rpy = rng.uniform(-math.pi, math.pi, 3)
        assert same_rotation(quaternion_from_rpy(*rpy), Rotation.from_euler('xyz', rpy))
    # A yaw of +90 degrees turns the base x axis onto y (right-handed, about z).
    assert np.allclose(rotate(quaternion_from_rpy(0, 0, math.pi / 2), [1, 0, 0]), [0, 1, 0])


def test_quaternion_product_composes_rotations_right_first():
    rng = np.random.default_rng(1)
    for _ in range(20):
        a, b = Rotation.random(random_state=rng), Rotation.random(random_state=rng)
        assert same_rotation(quaternion_multiply(a.as_quat(), b.as_quat()), a * b)
        v = rng.normal(size=3)
        assert np.allclose(rotate((a * b).as_quat(), v), a.apply(b.apply(v)))


def test_base_frame_delta_translates_along_base_axes_and_rotates_on_the_left():
    rng = np.random.default_rng(2)
    for _ in range(20):
        pose = random_pose(rng)
        delta = np.concatenate([rng.uniform(-0.02, 0.02, 3), rng.uniform(-0.3, 0.3, 3)])
        target = apply_delta(pose, delta, 'base')
        assert np.allclose(target.position, np.array(pose.position) + delta[:3], atol=1e-12)
        expected = Rotation.from_euler('xyz', delta[3:]) * Rotation.from_quat(pose.orientation)
        assert same_rotation(target.orientation, expected)


def test_tool_frame_delta_translates_along_tool_axes_and_rotates_on_the_right():
    rng = np.random.default_rng(3)
    for _ in range(20):
        pose = random_pose(rng)
        delta = np.concatenate([rng.uniform(-0.02, 0.02, 3), rng.uniform(-0.3, 0.3, 3)])
        target = apply_delta(pose, delta, 'tool')
        current = Rotation.from_quat(pose.orientation)
        assert np.allclose(target.position, np.array(pose.position) + current.apply(delta[:3]))
        assert same_rotation(target.orientation,
                             current * Rotation.from_euler('xyz', delta[3:]))


def test_the_two_frames_agree_for_a_tool_aligned_with_the_base():
    pose = Pose((0.3, -0.1, 0.4), (0.0, 0.0, 0.0, 1.0))
    delta = [0.01, 0.02, -0.01, 0.1, 0.0, 0.0]
    base, tool = apply_delta(pose, delta, 'base'), apply_delta(pose, delta, 'tool')
    assert np.allclose(base.position, tool.position)
    assert np.allclose(base.orientation, tool.orientation)


def test_integrate_chains_each_step_on_the_previous_target():
    rng = np.random.default_rng(4)
    pose = random_pose(rng)
    deltas = np.concatenate([rng.uniform(-0.02, 0.02, (8, 3)), rng.uniform(-0.2, 0.2, (8, 3))],
                            axis=1)
    targets = integrate(pose, deltas)
    position = np.array(pose.position)
    rotation = Rotation.from_quat(pose.orientation)
    for target, delta in zip(targets, deltas):
        position = position + delta[:3]
        rotation = Rotation.from_euler('xyz', delta[3:]) * rotation
        assert np.allclose(target.position, position, atol=1e-12)
        assert same_rotation(target.orientation, rotation)
    assert len(targets) == 8


def test_a_long_chain_stays_a_unit_quaternion():
    pose = Pose((0, 0, 0), (0, 0, 0, 1))
    targets = integrate(pose, [[0.0, 0.0, 0.0, 0.01, 0.02, 0.03]] * 5000)
    assert abs(np.linalg.norm(targets[-1].orientation) - 1.0) < 1e-12


def test_bad_input_names_the_field():
    pose = Pose((0, 0, 0), (0, 0, 0, 1))
    with pytest.raises(ValueError, match='delta'):
        apply_delta(pose, [0.0] * 5)
    with pytest.raises(ValueError, match='delta'):
        apply_delta(pose, [math.nan] + [0.0] * 5)
    with pytest.raises(ValueError, match='frame'):
        apply_delta(pose, [0.0] * 6, 'camera')
    with pytest.raises(ValueError, match='orientation'):
        Pose((0, 0, 0), (0, 0, 0, 2))
    with pytest.raises(ValueError, match='position'):
        Pose((0, 0, math.inf), (0, 0, 0, 1))
    with pytest.raises(ValueError, match='deltas'):
        integrate(pose, [0.0] * 6)
    with pytest.raises(ValueError, match='period_s'):
        point_times(3, 0.0)


def test_point_times_follow_the_cartesian_controllers_rules():
    times = point_times(5, 0.2)
    assert times[0] > 0.0
    assert all(b > a for a, b in zip(times, times[1:]))
    assert times == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])


def test_pose_history_gives_the_pose_closest_to_the_image_time():
    history = PoseHistory(max_poses=3)
    poses = [Pose((i, 0, 0), (0, 0, 0, 1)) for i in range(5)]
    assert history.at(1.0, 0.5) == (None, 'no tool pose received')
    for i, pose in enumerate(poses):
        history.add(10.0 + 0.1 * i, pose)
    # Only the last three are kept (10.2, 10.3, 10.4).
    assert history.at(10.31, 0.05)[0] is poses[3]
    assert history.at(10.0, 0.25)[0] is poses[2]
    pose, reason = history.at(10.0, 0.1)
    assert pose is None and '0.200 s away' in reason
    # A clock that steps back starts the history again.
    history.add(1.0, poses[0])
    assert history.newest == (1.0, poses[0])
    assert history.at(10.4, 1.0)[0] is None
