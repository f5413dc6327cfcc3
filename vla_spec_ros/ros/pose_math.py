"""Absolute tool targets from OpenVLA's end-effector deltas (pure numpy, no rclpy).

An action's first six values are the change of the tool pose over one control step: dx, dy,
dz (metres) and droll, dpitch, dyaw (radians). `apply_delta` turns the pose the tool had when
the image was taken into the pose it should reach; `integrate` chains a chunk's steps.
`apply_step` / `integrate_steps` do the same for a published command's motion over one period
(its velocities times control_period), whose rotation is a rotation vector, as MoveIt Servo
integrates a twist: the node's pose targets go through these, so a target is where the twist
of the same action takes the tool (vla_spec_ros/motion.py).

Rotation convention (docs/robot.md, "Rotations"):
  * droll, dpitch, dyaw are fixed-axis (extrinsic) X, then Y, then Z rotations, i.e. the
    rotation R_delta = Rz(dyaw) @ Ry(dpitch) @ Rx(droll) (ROS' rpy, tf2's setRPY); a step's
    rotation vector w turns the tool by exp(w), and the node makes exp(w) = R_delta.
  * frame 'base' (the default): the translation is along the base frame's axes and the
    rotation turns the tool about base-parallel axes through the tool point:
        p' = p + d,           R' = R_delta @ R
    Why: OpenVLA's training data computes its deltas this way (Bridge's WidowX
    controller and the ManiSkill/SimplerEnv controllers that replay it use base-aligned
    rotation about the end effector; LIBERO's robosuite OSC controller composes the delta
    rotation on the left in the base frame), and it is what the node's twist means to MoveIt
    Servo with `frame_id` the robot base: an angular velocity about the base axes.
  * frame 'tool': both are in the tool's own frame (a checkpoint trained on tool-frame
    deltas):  p' = p + R @ d,  R' = R @ R_delta.

Quaternions are (x, y, z, w), geometry_msgs' order, and unit length; results are renormalised
so that a long chain of steps does not drift off the unit sphere.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vla_spec_ros.motion import (quaternion_from_rotation_vector, quaternion_from_rpy,
                                 quaternion_multiply)

DELTA_FRAMES = ('base', 'tool')


@dataclass(frozen=True)
class Pose:
    """A tool pose: position (3,) metres and orientation (4,) unit quaternion (x, y, z, w)."""

    position: tuple
    orientation: tuple

    def __post_init__(self):
        position = np.asarray(self.position, dtype=np.float64)
        orientation = np.asarray(self.orientation, dtype=np.float64)
        if position.shape != (3,) or not np.all(np.isfinite(position)):
            raise ValueError(f'position: expected 3 finite values, got {self.position!r}')
        if orientation.shape != (4,) or not np.all(np.isfinite(orientation)):
            raise ValueError(f'orientation: expected 4 finite values (x, y, z, w), got '
                             f'{self.orientation!r}')
        norm = float(np.linalg.norm(orientation))
        if abs(norm - 1.0) > 1e-3:
            raise ValueError(f'orientation: not a unit quaternion (norm {norm:.6f})')
        object.__setattr__(self, 'position', tuple(float(v) for v in position))
        object.__setattr__(self, 'orientation', tuple(float(v) for v in orientation / norm))


def rotate(q, vector) -> np.ndarray:
    """(3,) vector rotated by the unit quaternion q."""
    v = np.array([vector[0], vector[1], vector[2], 0.0], dtype=np.float64)
    conjugate = np.array([-q[0], -q[1], -q[2], q[3]], dtype=np.float64)
    return quaternion_multiply(quaternion_multiply(q, v), conjugate)[:3]


def _unit(q) -> np.ndarray:
    q = np.asarray(q, dtype=np.float64)
    q = q / np.linalg.norm(q)
    return -q if q[3] < 0.0 else q      # one of the two equal quaternions: w >= 0


def apply_delta(pose: Pose, delta, frame: str = 'base') -> Pose:
    """The pose after one step's delta (dx, dy, dz, droll, dpitch, dyaw) applied in `frame`
    ('base' or 'tool', see the module docstring)."""
    delta = _checked(delta, 'delta')
    return _apply(pose, delta[0:3], quaternion_from_rpy(*delta[3:6]), frame)


def apply_step(pose: Pose, step, frame: str = 'base') -> Pose:
    """The pose after one command's motion (dx, dy, dz, rotation vector (3,)) in `frame`:
    where a twist of velocities step / period, held for one period, takes the tool."""
    step = _checked(step, 'step')
    return _apply(pose, step[0:3], quaternion_from_rotation_vector(step[3:6]), frame)


def integrate(pose: Pose, deltas, frame: str = 'base') -> list[Pose]:
    """The poses after each of `deltas` (K, 6), each applied to the previous target: the
    absolute targets of a chunk that starts at `pose`."""
    return _chain(pose, deltas, frame, apply_delta)


def integrate_steps(pose: Pose, steps, frame: str = 'base') -> list[Pose]:
    """`integrate` for commands' motions (rotation vectors, `apply_step`)."""
    return _chain(pose, steps, frame, apply_step)


def _checked(delta, name: str) -> np.ndarray:
    delta = np.asarray(delta, dtype=np.float64)
    if delta.shape != (6,) or not np.all(np.isfinite(delta)):
        raise ValueError(f'{name}: expected 6 finite values, got {delta!r}')
    return delta


def _apply(pose: Pose, translation, rotation, frame: str) -> Pose:
    if frame not in DELTA_FRAMES:
        raise ValueError(f'frame: {frame!r} not in {list(DELTA_FRAMES)}')
    position = np.asarray(pose.position)
    orientation = np.asarray(pose.orientation)
    if frame == 'base':
        position = position + translation
        orientation = quaternion_multiply(rotation, orientation)
    else:
        position = position + rotate(orientation, translation)
        orientation = quaternion_multiply(orientation, rotation)
    return Pose(tuple(position), tuple(_unit(orientation)))


def _chain(pose: Pose, deltas, frame: str, apply) -> list[Pose]:
    deltas = np.asarray(deltas, dtype=np.float64)
    if deltas.ndim != 2 or deltas.shape[1] != 6:
        raise ValueError(f'deltas: expected shape (K, 6), got {deltas.shape}')
    targets = []
    for delta in deltas:
        pose = apply(pose, delta, frame)
        targets.append(pose)
    return targets


def point_times(num_points: int, period_s: float) -> list[float]:
    """time_from_start of a chunk's absolute targets: the target after step i is due when
    step i's slot ends, (i + 1) * period_s. Strictly increasing and the first after 0, as a
    trajectory controller requires (a point at 0 would be a jump to it)."""
    if period_s <= 0.0:
        raise ValueError(f'period_s: must be > 0, got {period_s}')
    return [(i + 1) * period_s for i in range(int(num_points))]


class PoseHistory:
    """The tool poses read lately (stamp seconds, Pose), oldest first, for `at(stamp)`: the
    pose the tool had when an image was taken. Bounded by `max_poses`."""

    def __init__(self, max_poses: int = 256):
        if max_poses < 1:
            raise ValueError(f'max_poses: must be >= 1, got {max_poses}')
        self.max_poses = int(max_poses)
        self._items: list[tuple[float, Pose]] = []

    def add(self, stamp_s: float, pose: Pose) -> None:
        if self._items and stamp_s < self._items[-1][0]:
            self._items.clear()            # the clock stepped back (a new bag, sim reset)
        self._items.append((float(stamp_s), pose))
        del self._items[:-self.max_poses]

    def clear(self) -> None:
        self._items.clear()

    @property
    def newest(self) -> tuple[float, Pose] | None:
        return self._items[-1] if self._items else None

    def at(self, stamp_s: float, max_gap_s: float) -> tuple[Pose | None, str | None]:
        """(the pose read closest in time to `stamp_s`, None), or (None, why not) when no pose
        was read within `max_gap_s` of it."""
        if not self._items:
            return None, 'no tool pose received'
        stamp, pose = min(self._items, key=lambda item: abs(item[0] - stamp_s))
        gap = abs(stamp - stamp_s)
        if gap > max_gap_s:
            return None, (f'no tool pose within {max_gap_s:.3f} s of the image (closest '
                          f'{gap:.3f} s away)')
        return pose, None


__all__ = ['Pose', 'DELTA_FRAMES', 'quaternion_multiply', 'quaternion_from_rpy', 'rotate',
           'apply_delta', 'apply_step', 'integrate', 'integrate_steps', 'point_times',
           'PoseHistory']
