"""ECoT's image preprocessing before the tower's own: Prismatic's ``letterbox`` resize.

The released ECoT policy (``image_resize_strategy: letterbox``) pads the camera image to a
square with the tower's mean colour, then resizes it as torchvision's ``resize(size=S)`` does on
a PIL image (shorter side to S, the longer ``int(S * long / short)``, Pillow's bicubic), then
crops the centre S x S. The padding is ``int((max_side - side) / 2)`` on each side of the
shorter axis, so an odd difference leaves the padded image one pixel short of square: the
resize and crop then decide the last pixel, exactly as the reference does. A square frame
(Bridge's 256 x 256) is only resized. Pure numpy and Pillow on the host; the result is the
(S, S, 3) uint8 image the family's normalisation reads.
"""
from __future__ import annotations

import numpy as np
from PIL import Image


def pad_to_square(image: np.ndarray, fill: tuple[int, int, int]) -> np.ndarray:
    """(H, W, 3) uint8 -> padded with ``fill`` by int((max - side) / 2) on both sides of the
    shorter axis (Prismatic's LetterboxPad)."""
    h, w = image.shape[:2]
    side = max(h, w)
    pad_x, pad_y = int((side - w) / 2), int((side - h) / 2)
    if pad_x == 0 and pad_y == 0:
        return image
    out = np.empty((h + 2 * pad_y, w + 2 * pad_x, 3), np.uint8)
    out[...] = np.asarray(fill, np.uint8)
    out[pad_y:pad_y + h, pad_x:pad_x + w] = image
    return out


def resize_shorter_then_crop(image: np.ndarray, size: int) -> np.ndarray:
    """torchvision's resize(size) on a PIL image (shorter side to ``size``, bicubic), then its
    center_crop(size): (H, W, 3) uint8 -> (size, size, 3) uint8."""
    h, w = image.shape[:2]
    if (h, w) != (size, size):
        short, long = (h, w) if h <= w else (w, h)
        new_short, new_long = size, int(size * long / short)
        new_h, new_w = (new_short, new_long) if h <= w else (new_long, new_short)
        image = np.array(Image.fromarray(np.ascontiguousarray(image), 'RGB').resize(
            (new_w, new_h), Image.Resampling.BICUBIC))
    h, w = image.shape[:2]
    top, left = int(round((h - size) / 2.0)), int(round((w - size) / 2.0))
    return np.ascontiguousarray(image[top:top + size, left:left + size])


def letterbox(image: np.ndarray, size: int, fill: tuple[int, int, int]) -> np.ndarray:
    """(H, W, 3) uint8 -> (size, size, 3) uint8: pad, resize, crop (module docstring)."""
    return resize_shorter_then_crop(pad_to_square(image, fill), size)


def mean_fill(mean) -> tuple[int, int, int]:
    """The pad colour: the tower's mean as Prismatic computes it, int(mean * 255) per channel
    (SigLIP's 0.5 -> 127)."""
    return tuple(int(m * 255) for m in mean)


__all__ = ['letterbox', 'mean_fill', 'pad_to_square', 'resize_shorter_then_crop']
