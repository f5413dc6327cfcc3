"""OpenVLA's image preprocessing (docs/openvla.md, Image preprocessing).

RGB uint8 (H, W, 3) -> optional 180° rotation (LIBERO agent view) -> optional centre crop
(90 % of the area, sampled bilinearly to S x S and converted back to uint8 with the arithmetic
of OpenVLA's evaluation code, for checkpoints trained with crop augmentation) -> resize to
S x S with Pillow's bicubic filter, exactly as OpenVLA's Hugging Face processor does
("resize-naive": aspect ratio not kept; a frame already S x S is not resampled) -> scaled to
[0, 1] and normalised with each tower's mean/std -> (C, S, S) float tensor: C = 6 for the fused
backbone (DINOv2's channels first, then SigLIP's), C = 3 for a single tower (its own mean/std).

Everything up to the uint8 S x S image (``model_pixels``) runs on the host, in numpy and
Pillow, and is bit for bit what OpenVLA feeds its towers. Only the normalisation runs on the
tensor's device.
"""
from __future__ import annotations

import functools

import numpy as np
import torch
from PIL import Image

from ...image_check import check_image
from .config import VLAConfig

CROP_AREA = 0.9


def resize_bicubic(image: np.ndarray, size: int) -> np.ndarray:
    """(H, W, 3) uint8 -> (size, size, 3) uint8 by Pillow's ``Image.resize(..., BICUBIC)``: the
    call OpenVLA's processor makes (two separable passes with fixed-point weights, rounded
    and clipped to uint8 between them). A frame already at the size is returned as is, as
    Pillow returns a copy of it."""
    if image.shape[:2] == (size, size):
        return image
    resized = Image.fromarray(np.ascontiguousarray(image), 'RGB').resize(
        (size, size), Image.Resampling.BICUBIC)
    return np.array(resized)           # writable, for torch.from_numpy


def crop_center(image: np.ndarray, size: int, area: float = CROP_AREA) -> np.ndarray:
    """(H, W, 3) uint8 -> (size, size, 3) uint8: the central box covering ``area`` of the
    image (sides sqrt(area) of the frame's), as OpenVLA's evaluation code computes it.

    That code converts the frame to float32 in [0, 1] (``v * float32(1 / 255)``), samples the
    box bilinearly at size x size points spread corner to corner over it (TensorFlow's
    ``crop_and_resize``: no antialiasing), and converts back to uint8 by truncating
    ``x * 255.5`` after clipping to [0, 1]. This replays those float32 operations in the same
    order, so the pixels are the same bit for bit.
    """
    h, w = image.shape[:2]
    side = np.clip(np.sqrt(np.float32(area)), np.float32(0), np.float32(1))
    start = (np.float32(1) - side) / np.float32(2)
    end = start + side
    x = image.astype(np.float32) * np.float32(1.0 / 255.0)
    rows, row_lerp, row_valid = _sample_points(start, end, h, size)
    cols, col_lerp, col_valid = _sample_points(start, end, w, size)
    top, bottom = x[rows[0]], x[rows[1]]                        # (size, W, 3)
    col_lerp = col_lerp[None, :, None]
    top = top[:, cols[0]] + (top[:, cols[1]] - top[:, cols[0]]) * col_lerp
    bottom = bottom[:, cols[0]] + (bottom[:, cols[1]] - bottom[:, cols[0]]) * col_lerp
    out = top + (bottom - top) * row_lerp[:, None, None]
    out[~row_valid] = 0                                         # outside the frame: black
    out[:, ~col_valid] = 0
    out = np.clip(out, np.float32(0), np.float32(1)) * np.float32(255.5)
    return np.clip(out, 0, 255).astype(np.uint8)                # truncates, as a C cast does


def _sample_points(start: np.float32, end: np.float32, length: int, size: int):
    """Source coordinates of ``size`` samples over [start, end] (fractions of a side of
    ``length`` pixels), as float32: (floor, ceil) indices, the interpolation weight, and
    whether the point lies inside the frame."""
    last = np.float32(length - 1)
    if size > 1:
        scale = (end - start) * last / np.float32(size - 1)
        points = start * last + np.arange(size, dtype=np.float32) * scale
    else:
        points = np.full(1, 0.5 * float(start + end) * (length - 1), np.float32)
    valid = (points >= 0) & (points <= last)
    safe = np.where(valid, points, np.float32(0))
    low = np.floor(safe).astype(np.int64)
    high = np.ceil(safe).astype(np.int64)
    return (low, high), (safe - low.astype(np.float32)).astype(np.float32), valid


def model_pixels(image: np.ndarray, size: int, *, center_crop: bool = False,
                 rotate_180: bool = False) -> np.ndarray:
    """(H, W, 3) uint8 -> (size, size, 3) uint8: the pixels OpenVLA's processor turns into
    tensors (before the scaling to [0, 1] and the normalisation)."""
    if rotate_180:
        image = image[::-1, ::-1]
    if center_crop:
        image = crop_center(image, size)
    return resize_bicubic(image, size)


def preprocess_image(image: np.ndarray, cfg: VLAConfig, *, center_crop: bool = False,
                     rotate_180: bool = False, dtype=torch.float32, device='cpu'
                     ) -> torch.Tensor:
    """(H, W, 3) uint8 RGB -> (C, S, S) pixel values in ``dtype`` (C = ``cfg.pixel_channels``),
    computed on the CPU."""
    image = check_image(image)
    x = preprocess_pixels(torch.from_numpy(np.ascontiguousarray(image)), cfg,
                          center_crop=center_crop, rotate_180=rotate_180)
    return x.to(device=device, dtype=dtype)


def preprocess_pixels(image: torch.Tensor, cfg: VLAConfig, *, center_crop: bool = False,
                      rotate_180: bool = False) -> torch.Tensor:
    """(H, W, 3) uint8 tensor -> (C, S, S) float64 (C = ``cfg.pixel_channels``), on the
    tensor's own device.

    A frame already S x S without a centre crop is only rotated, scaled and normalised, on
    its device: the engine uploads the camera's uint8 frame and this costs no host time. Any
    other frame is resized on the host (``model_pixels``, Pillow) and its S x S result is put
    on the device: from the host frame a ``FrameUploader`` upload carries (``host_source``,
    no copy back, the small result uploaded through the same uploader), else from the
    tensor's own memory (on the CPU, none copied). Either way CPU and device get the same
    uint8 pixels; the normalisation (float64 on every device) may differ in the last bit.
    """
    size = cfg.image_size
    if center_crop or tuple(image.shape[:2]) != (size, size):
        source = getattr(image, 'host_source', None)
        host = source.image if source is not None else image.cpu().numpy()
        resized = model_pixels(host, size, center_crop=center_crop, rotate_180=rotate_180)
        if source is not None:
            image = source.upload(resized)
        elif image.device.type == 'cpu':
            image = torch.from_numpy(np.ascontiguousarray(resized))
        else:
            image = torch.from_numpy(np.ascontiguousarray(resized)).to(image.device)
    elif rotate_180:
        image = image.flip(0, 1)
    x = image.permute(2, 0, 1).to(torch.float64) / 255.0
    return normalize_per_tower(x, cfg)


def normalize_per_tower(x: torch.Tensor, cfg: VLAConfig) -> torch.Tensor:
    """x (..., 3, S, S) float64 in [0, 1] -> (..., C, S, S), each tower's mean/std on its
    three channels in ``cfg.towers`` order: fused, DINOv2's on 0-2 and SigLIP's on 3-5
    (C = 6); a single tower, its own on 0-2 (C = 3)."""
    towers = []
    for tower in cfg.towers:
        mean, std = _tower_constants(tuple(tower.mean), tuple(tower.std), x.dtype, x.device)
        towers.append((x - mean) / std)
    return towers[0] if len(towers) == 1 else torch.cat(towers, dim=-3)


@functools.lru_cache(maxsize=16)
def _tower_constants(mean: tuple, std: tuple, dtype, device) -> tuple[torch.Tensor, ...]:
    """(3, 1, 1) mean and std on ``device``, made once: building them from Python lists on
    every frame would be two blocking host -> device copies per tower on a GPU."""
    with torch.inference_mode(False):      # plain tensors, usable in and out of inference
        return tuple(torch.tensor(v, dtype=dtype).to(device)[:, None, None]
                     for v in (mean, std))
