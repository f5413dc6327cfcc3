"""Command math shared by the node (action -> twist, pose targets) and the simulator bridge
(twist -> action).

Pure numpy, no rclpy: `ros/command_rules.py`, `ros/pose_math.py` and `sim/twist_to_action.py`
all use these, so the directions of the command path cannot drift apart.

What a rotation delta means (docs/robot.md, "Rotations"): an action's droll, dpitch, dyaw are
fixed-axis X, then Y, then Z angles, the rotation R_delta = Rz(dyaw) @ Ry(dpitch) @ Rx(droll)
that turns the tool over one control step (the convention of the checkpoints' training data:
Bridge's euler deltas, which SimplerEnv converts with `euler2axangle` for its controller).
MoveIt Servo does not compose angles: it integrates the twist's angular velocity w over the
step, which turns the tool by exp(w * period). So the twist carries the *rotation vector* of
R_delta over the period (axis times angle), and both outputs, the twist and the pose target,
turn the tool by exactly R_delta. For small angles the two readings agree to first order; at
0.03 rad per axis per step they differ by about 0.02 degrees per step, growing with the square
of the step.

Quaternions are (x, y, z, w), geometry_msgs' order.
"""
from __future__ import annotations

import math

import numpy as np

# Below this angle (rad) the exact series of exp / log are replaced by their Taylor terms,
# which are exact to float64 rounding there.
SMALL_ANGLE = 1e-8


def clamp_norm(vector: np.ndarray, max_norm: float) -> np.ndarray:
    """(3,) -> (3,) scaled down so that its Euclidean norm is <= max_norm (direction kept,
    as MoveIt Servo caps speed_units commands)."""
    norm = float(np.linalg.norm(vector))
    if norm <= max_norm or norm == 0.0:
        return vector
    return vector * (max_norm / norm)


def _multiply(a, b) -> tuple:
    """quaternion_multiply on float 4-tuples (the command path calls this per step: plain
    floats are several times faster than numpy's small arrays, and give the same values)."""
    ax, ay, az, aw = a
    bx, by, bz, bw = b
    return (aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
            aw * bw - ax * bx - ay * by - az * bz)


def quaternion_multiply(a, b) -> np.ndarray:
    """Hamilton product a * b of (x, y, z, w) quaternions: the rotation b, then a."""
    return np.array(_multiply(tuple(float(v) for v in a), tuple(float(v) for v in b)))


def _quaternion_from_rpy(roll: float, pitch: float, yaw: float) -> tuple:
    hr, hp, hy = 0.5 * roll, 0.5 * pitch, 0.5 * yaw
    qx = (math.sin(hr), 0.0, 0.0, math.cos(hr))
    qy = (0.0, math.sin(hp), 0.0, math.cos(hp))
    qz = (0.0, 0.0, math.sin(hy), math.cos(hy))
    return _multiply(qz, _multiply(qy, qx))


def quaternion_from_rpy(roll: float, pitch: float, yaw: float) -> np.ndarray:
    """(x, y, z, w) of Rz(yaw) @ Ry(pitch) @ Rx(roll) (fixed axes X, Y, Z)."""
    return np.array(_quaternion_from_rpy(float(roll), float(pitch), float(yaw)))


def rpy_from_quaternion(q) -> np.ndarray:
    """(roll, pitch, yaw) with Rz(yaw) @ Ry(pitch) @ Rx(roll) = q; pitch in [-pi/2, pi/2]."""
    x, y, z, w = (float(v) for v in q)
    roll = math.atan2(2.0 * (w * x + y * z), 1.0 - 2.0 * (x * x + y * y))
    pitch = math.asin(min(1.0, max(-1.0, 2.0 * (w * y - z * x))))
    yaw = math.atan2(2.0 * (w * z + x * y), 1.0 - 2.0 * (y * y + z * z))
    return np.array([roll, pitch, yaw])


def quaternion_from_rotation_vector(vector) -> np.ndarray:
    """exp: the rotation by |vector| radians about vector's direction, as (x, y, z, w)."""
    vector = np.asarray(vector, dtype=np.float64)
    angle = float(np.linalg.norm(vector))
    # sin(angle / 2) / angle, with its series below SMALL_ANGLE (0.5 - angle^2 / 48).
    scale = 0.5 - angle * angle / 48.0 if angle < SMALL_ANGLE else math.sin(0.5 * angle) / angle
    return np.array([*(vector * scale), math.cos(0.5 * angle)])


def _rotation_vector_from_quaternion(x: float, y: float, z: float, w: float) -> tuple:
    if w < 0.0:
        x, y, z, w = -x, -y, -z, -w            # the same rotation, angle <= pi
    sine = math.sqrt(x * x + y * y + z * z)    # sin(angle / 2)
    if sine < SMALL_ANGLE:
        return (2.0 * x / w, 2.0 * y / w, 2.0 * z / w)
    scale = 2.0 * math.atan2(sine, w) / sine
    return (x * scale, y * scale, z * scale)


def rotation_vector_from_quaternion(q) -> np.ndarray:
    """log: axis times angle (angle in [0, pi]) of the unit quaternion q."""
    return np.array(_rotation_vector_from_quaternion(*(float(v) for v in q)))


def rotation_vector_from_rpy(rpy) -> np.ndarray:
    """The (3,) rotation vector that turns the tool as the fixed-axis angles `rpy` do."""
    roll, pitch, yaw = (float(v) for v in rpy)
    return np.array(_rotation_vector_from_quaternion(*_quaternion_from_rpy(roll, pitch, yaw)))


def rpy_from_rotation_vector(vector) -> np.ndarray:
    """The inverse of `rotation_vector_from_rpy` (pitch within +-pi/2)."""
    return rpy_from_quaternion(quaternion_from_rotation_vector(vector))


__all__ = ['clamp_norm', 'quaternion_multiply', 'quaternion_from_rpy', 'rpy_from_quaternion',
           'quaternion_from_rotation_vector', 'rotation_vector_from_quaternion',
           'rotation_vector_from_rpy', 'rpy_from_rotation_vector']
