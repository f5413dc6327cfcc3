"""Where a world point appears in the camera image: MuJoCo's pinhole camera as a 3 x 4 matrix.

A reasoning policy's text names pixel positions (the gripper's point, the objects' boxes), in
the image the policy sees. ``camera_matrix`` gives the matrix ``P`` with ``P @ (x, y, z, 1)``
= (u w, v w, w) for a world point, (u, v) in pixels of the upright ``image_size`` image (u to the
right, v down, (0, 0) the top-left corner of the top-left pixel), as ``MetaWorldTask.render``
returns it, the 180-degree turn of upside-down cameras included.

MuJoCo's camera looks along its -z axis, x to the right, y up, with vertical field of view
``cam_fovy`` (degrees) and square pixels. Plain numpy.
"""
from __future__ import annotations

import numpy as np


def camera_matrix(position, rotation, fovy_deg: float, image_size: int,
                  is_upside_down: bool) -> np.ndarray:
    """The 3 x 4 projection (module docstring) of a camera at ``position`` (3,) whose axes are
    the columns of ``rotation`` (3, 3; MuJoCo's ``cam_xmat``), for a square image."""
    rotation = np.asarray(rotation, dtype=np.float64).reshape(3, 3)
    position = np.asarray(position, dtype=np.float64).reshape(3)
    focal = 0.5 * image_size / np.tan(np.deg2rad(fovy_deg) / 2.0)
    half = image_size / 2.0
    # Camera coordinates (x right, y up, looking along -z) -> pixels: depth w = -z.
    sign = -1.0 if is_upside_down else 1.0
    intrinsic = np.array([[sign * focal, 0.0, -half],
                          [0.0, -sign * focal, -half],
                          [0.0, 0.0, -1.0]])
    extrinsic = np.hstack([rotation.T, -(rotation.T @ position)[:, None]])
    return intrinsic @ extrinsic


def project(matrix, points) -> np.ndarray:
    """World points (..., 3) -> pixel coordinates (..., 2) through ``camera_matrix``'s matrix."""
    points = np.asarray(points, dtype=np.float64)
    homogeneous = np.concatenate([points, np.ones(points.shape[:-1] + (1,))], axis=-1)
    image = homogeneous @ np.asarray(matrix, dtype=np.float64).T
    return image[..., :2] / image[..., 2:3]


__all__ = ['camera_matrix', 'project']
