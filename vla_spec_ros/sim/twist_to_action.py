"""Simulator side of the command path: twist + gripper in, a 7-dim action out (pure Python: no
rclpy, no torch).

The `vla_spec` node turns an action into commands (vla_spec_ros/ros/command_rules.py):

    linear  = clamp_norm(d[0:3] / control_period * linear_scale,  max_linear_speed)
    angular = clamp_norm(rotation_vector(d[3:6]) / control_period * angular_scale,
                         max_angular_speed)
    gripper = closed + openness * (open - closed)        (openness in [0, 1], 1 = open)

`action_from_twist` inverts it: the bridge clamps the velocity norms like a servo controller,
then d = velocity * control_period / scale (the angular part turned back from a rotation
vector into fixed-axis angles, motion.py) and openness = (gripper - closed) / (open - closed)
clipped to [0, 1]. The inversion is exact (up to float rounding) when the bridge's
control_period, scales, speed limits and gripper positions equal the VLA node's and the node did
not clamp; a clamped velocity stays clamped (the direction is kept, the length is not).
`bridge_settings.matched_command_parameters` gives both nodes such parameters. `ACTION_DIM` is
the action's length (deltas per step for the 6 arm axes, then the absolute gripper).
"""
from __future__ import annotations

import math

import numpy as np

from vla_spec_ros.motion import clamp_norm, rpy_from_rotation_vector
from vla_spec_ros.sim.bridge_settings import BridgeSettings

ACTION_DIM = 7


def gripper_openness(position: float, settings: BridgeSettings) -> float:
    """Controller position -> absolute gripper in [0, 1] (1 = open), the inverse of the
    node's interpolation closed -> open."""
    closed, opened = settings.gripper_closed_position, settings.gripper_open_position
    openness = (float(position) - closed) / (opened - closed)
    return min(max(openness, 0.0), 1.0)


def action_from_twist(linear, angular, gripper_position: float,
                      settings: BridgeSettings) -> np.ndarray:
    """(3,) m/s, (3,) rad/s, controller position -> (7,) float64 action (deltas per step)."""
    linear = np.asarray(linear, dtype=np.float64)
    angular = np.asarray(angular, dtype=np.float64)
    if linear.shape != (3,) or angular.shape != (3,):
        raise ValueError(f'linear/angular: expected (3,) each, got {linear.shape}, '
                         f'{angular.shape}')
    if not (np.all(np.isfinite(linear)) and np.all(np.isfinite(angular))
            and math.isfinite(gripper_position)):
        raise ValueError('linear/angular/gripper_position: non-finite command')
    linear = clamp_norm(linear, settings.max_linear_speed)
    angular = clamp_norm(angular, settings.max_angular_speed)
    action = np.empty(ACTION_DIM, dtype=np.float64)
    action[0:3] = linear * settings.control_period / settings.linear_scale
    action[3:6] = rpy_from_rotation_vector(angular * settings.control_period
                                           / settings.angular_scale)
    action[6] = gripper_openness(gripper_position, settings)
    return action


__all__ = ['ACTION_DIM', 'gripper_openness', 'action_from_twist']
