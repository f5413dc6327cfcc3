"""Image checks and OpenVLA preprocessing (docs/openvla.md, Image preprocessing).

RGB uint8 (H, W, 3) -> optional 180° rotation (LIBERO agent view) -> optional center crop
(90% of the area, resized back bilinearly, for checkpoints trained with crop augmentation) ->
per tower: bicubic antialiased resize to the model size ("resize-naive": aspect ratio not kept),
rounded to uint8 as PIL does, scaled to [0, 1] and normalised with the tower's mean/std ->
(6, S, S) float tensor, DINOv2 channels first.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import torch
import torch.nn.functional as F

from .config import VLAConfig

CROP_AREA = 0.9
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


def _resize_uint8(x: torch.Tensor, size: int, mode: str) -> torch.Tensor:
    """x (3, H, W) float in [0, 255] -> (3, size, size), rounded and clipped like PIL."""
    if x.shape[-2:] != (size, size):
        x = F.interpolate(x[None], size=(size, size), mode=mode, antialias=True,
                          align_corners=False)[0]
    return x.round().clamp(0, 255)


def preprocess_image(image: np.ndarray, cfg: VLAConfig, *, center_crop: bool = False,
                     rotate_180: bool = False, dtype=torch.float32, device='cpu'
                     ) -> torch.Tensor:
    """(H, W, 3) uint8 RGB -> (6, S, S) pixel values in ``dtype``, computed on the CPU."""
    image = check_image(image)
    x = preprocess_pixels(torch.from_numpy(np.ascontiguousarray(image)), cfg,
                          center_crop=center_crop, rotate_180=rotate_180)
    return x.to(device=device, dtype=dtype)


def preprocess_pixels(image: torch.Tensor, cfg: VLAConfig, *, center_crop: bool = False,
                      rotate_180: bool = False) -> torch.Tensor:
    """(H, W, 3) uint8 tensor -> (6, S, S) float64, on the tensor's own device.

    The engine uploads the camera's uint8 frame and runs this on the GPU, so preprocessing
    costs no host time and needs no synchronisation. The arithmetic is float64 on every
    device; without a resize (frames at the model size) CPU and CUDA agree bit for bit, with
    one the resampling may differ in the last bits, which moves a pixel by one uint8 level
    only when it lands on a rounding tie.
    """
    if rotate_180:
        image = image.flip(0, 1)
    x = image.permute(2, 0, 1).to(torch.float64)
    size = cfg.image_size
    if center_crop:
        h, w = x.shape[1:]
        side = math.sqrt(CROP_AREA)
        ch, cw = max(1, round(h * side)), max(1, round(w * side))
        top, left = (h - ch) // 2, (w - cw) // 2
        x = _resize_uint8(x[:, top:top + ch, left:left + cw], size, 'bilinear')
    x = _resize_uint8(x, size, 'bicubic') / 255.0
    return normalize_per_tower(x, cfg)


def normalize_per_tower(x: torch.Tensor, cfg: VLAConfig) -> torch.Tensor:
    """x (..., 3, S, S) float64 in [0, 1] -> (..., 6, S, S): DINOv2's mean/std on channels
    0-2, SigLIP's on 3-5 (the fused backbone's input layout)."""
    towers = []
    for tower in (cfg.featurizer, cfg.fused_featurizer):
        mean, std = _tower_constants(tuple(tower.mean), tuple(tower.std), x.dtype, x.device)
        towers.append((x - mean) / std)
    return torch.cat(towers, dim=-3)


@functools.lru_cache(maxsize=16)
def _tower_constants(mean: tuple, std: tuple, dtype, device) -> tuple[torch.Tensor, ...]:
    """(3, 1, 1) mean and std on ``device``, made once: building them from Python lists on
    every frame would be two blocking host -> device copies per tower on a GPU."""
    with torch.inference_mode(False):      # plain tensors, usable in and out of inference
        return tuple(torch.tensor(v, dtype=dtype).to(device)[:, None, None]
                     for v in (mean, std))
