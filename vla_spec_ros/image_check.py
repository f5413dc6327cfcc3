"""The check every frame's image passes before any family preprocesses it: a uint8 RGB array
(H, W, 3) with sides in [2, MAX_IMAGE_SIDE]; anything else is an ``ImageError`` (a
``ValueError``, reported as bad input). The engine applies it to every image it is handed, and
the ROS image conversion to what it decodes.
"""
from __future__ import annotations

import numpy as np

MAX_IMAGE_SIDE = 8192


class ImageError(ValueError):
    """An image the model cannot use (wrong dtype, shape, size)."""


def check_image(image) -> np.ndarray:
    if not isinstance(image, np.ndarray):
        raise ImageError(f'image must be a numpy array, got {type(image).__name__}')
    if image.dtype != np.uint8:
        raise ImageError(f'image must be uint8 RGB, got dtype {image.dtype}')
    if image.ndim != 3 or image.shape[2] != 3:
        raise ImageError(f'image must have shape (H, W, 3), got {image.shape}')
    h, w = image.shape[:2]
    if min(h, w) < 2 or max(h, w) > MAX_IMAGE_SIDE:
        raise ImageError(f'image size {w}x{h} outside [2, {MAX_IMAGE_SIDE}] pixels per side')
    return image


__all__ = ['ImageError', 'check_image', 'MAX_IMAGE_SIDE']
