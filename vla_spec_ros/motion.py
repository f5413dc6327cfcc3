"""Command math shared by the node (action -> twist) and the simulator bridge (twist -> action).

Pure numpy, no rclpy: `ros/command.py` and `sim/twist_to_action.py` both use these, so the two
directions of the command path cannot drift apart.
"""
from __future__ import annotations

import numpy as np


def clamp_norm(vector: np.ndarray, max_norm: float) -> np.ndarray:
    """(3,) -> (3,) scaled down so that its Euclidean norm is <= max_norm (direction kept,
    as MoveIt Servo caps speed_units commands)."""
    norm = float(np.linalg.norm(vector))
    if norm <= max_norm or norm == 0.0:
        return vector
    return vector * (max_norm / norm)


__all__ = ['clamp_norm']
