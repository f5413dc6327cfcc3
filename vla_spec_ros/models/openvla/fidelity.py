"""OpenVLA's stages for ``vla-spec fidelity`` (fidelity.py; models/family.py, FidelityHooks).

The reference pixels are OpenVLA's processor written out on its own: the frame (rotated,
cropped as its evaluation code does) handed to Pillow as an RGB image and resized to S x S
with BICUBIC. The vision stages are the towers' concatenated features and the projector's
output.
"""
from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from ..family import FidelityHooks
from .checkpoint import config_from_json
from .preprocess import crop_center


def image_size(raw: dict) -> int:
    return config_from_json(raw).image_size


def processor_pixels(image: np.ndarray, size: int, center_crop: bool = False,
                     rotate_180: bool = False) -> np.ndarray:
    """OpenVLA's pixels: the frame (rotated, cropped as its evaluation code does) handed to
    Pillow as an RGB image and resized to size x size with BICUBIC, as its processor does."""
    if rotate_180:
        image = image[::-1, ::-1]
    if center_crop:
        image = crop_center(image, size)
    pil = Image.fromarray(np.ascontiguousarray(image)).convert('RGB')
    return np.asarray(pil.resize((size, size), Image.BICUBIC))


def levels(pixels: torch.Tensor, cfg) -> np.ndarray:
    """(3 or 6, S, S) normalised pixels -> the uint8 levels (S, S, 3) behind the last tower's
    channels (SigLIP's in a fused model)."""
    tower = cfg.towers[-1]
    std = torch.tensor(tower.std, dtype=torch.float64)[:, None, None]
    mean = torch.tensor(tower.mean, dtype=torch.float64)[:, None, None]
    x = pixels[-3:].detach().to('cpu', torch.float64) * std + mean
    return np.rint(x.numpy() * 255.0).clip(0, 255).astype(np.uint8).transpose(1, 2, 0)


def stages(model, pixels: torch.Tensor) -> dict:
    """(1, C, S, S) normalised pixels -> the towers' features and the projected patches."""
    features = model.vision_backbone(pixels)
    return {'features': features, 'patches': model.projector(features)}


HOOKS = FidelityHooks(image_size=image_size, reference_pixels=processor_pixels, levels=levels,
                      stages=stages)

__all__ = ['HOOKS', 'processor_pixels', 'levels', 'stages', 'image_size']
