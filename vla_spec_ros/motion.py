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


def quaternion_multiply(a, b) -> np.ndarray:
    """Hamilton product a * b of (x, y, z, w) quaternions: the rotation b, then a."""
    ax, ay, az, aw = a
    bx, by, bz, bw = b
    return np.array([aw * bx + ax * bw + ay * bz - az * by,
                     aw * by - ax * bz + ay * bw + az * bx,
                     aw * bz + ax * by - ay * bx + az * bw,
                     aw * bw - ax * bx - ay * by - az * bz])


def quaternion_from_rpy(roll: float, pitch: float, yaw: float) -> np.ndarray:
    """(x, y, z, w) of Rz(yaw) @ Ry(pitch) @ Rx(roll) (fixed axes X, Y, Z)."""
    half = 0.5 * np.array([roll, pitch, yaw], dtype=np.float64)
    qx = np.array([math.sin(half[0]), 0.0, 0.0, math.cos(half[0])])
    qy = np.array([0.0, math.sin(half[1]), 0.0, math.cos(half[1])])
    qz = np.array([0.0, 0.0, math.sin(half[2]), math.cos(half[2])])
    return quaternion_multiply(qz, quaternion_multiply(qy, qx))


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


def rotation_vector_from_quaternion(q) -> np.ndarray:
    """log: axis times angle (angle in [0, pi]) of the unit quaternion q."""
    q = np.asarray(q, dtype=np.float64)
    if q[3] < 0.0:
        q = -q                                 # the same rotation, angle <= pi
    sine = float(np.linalg.norm(q[:3]))        # sin(angle / 2)
    if sine < SMALL_ANGLE:
        return 2.0 * q[:3] / q[3]
    return q[:3] * (2.0 * math.atan2(sine, q[3]) / sine)


def rotation_vector_from_rpy(rpy) -> np.ndarray:
    """The (3,) rotation vector that turns the tool as the fixed-axis angles `rpy` do."""
    roll, pitch, yaw = (float(v) for v in rpy)
    return rotation_vector_from_quaternion(quaternion_from_rpy(roll, pitch, yaw))


def rpy_from_rotation_vector(vector) -> np.ndarray:
    """The inverse of `rotation_vector_from_rpy` (pitch within +-pi/2)."""
    return rpy_from_quaternion(quaternion_from_rotation_vector(vector))


__all__ = ['clamp_norm', 'quaternion_multiply', 'quaternion_from_rpy', 'rpy_from_quaternion',
           'quaternion_from_rotation_vector', 'rotation_vector_from_quaternion',
           'rotation_vector_from_rpy', 'rpy_from_rotation_vector']
