"""The pi0-FAST assembly: SigLIP (models/pi0fast/siglip.py) -> linear projector -> Gemma
(models/llama.py with Gemma's options), implementing the model protocol (models/protocol.py).

A frame's prefill rows: the patches of its I images in slot order (I x P rows, image features
not scaled), then its prompt ids (BOS first, ``Task: ..., State: ...;\\n``, then a second BOS
in the LeRobot style; token embeddings scaled by sqrt(width)). The whole prefix attends
bidirectionally (``prefix_attention``); the generated tokens (``Action: ``, the FAST ids,
``|``, and EOS in the openpi style) attend causally. ``style`` (style.py) also picks the image
resize. Positions are 0 .. L-1 as in openpi and LeRobot (transformers' PaliGemma counts from
1: RoPE depends on position differences only, so the two agree up to rounding).

Attribute names follow transformers' ``PaliGemmaForConditionalGeneration`` (``vision_tower.*``
is its ``model.vision_tower.vision_model.*``, ``multi_modal_projector.linear`` its
``model.multi_modal_projector.linear``, ``language_model.model.*`` its
``model.language_model.*``; checkpoint.py maps the keys).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..llama import LlamaForCausalLM
from .config import Pi0FastConfig
from .siglip import SiglipVisionTower
from .style import DEFAULT_STYLE, OPENPI, check_style


class Projector(nn.Module):
    """PaliGemma's multi-modal projector: one linear layer, vision width -> decoder width."""

    def __init__(self, vision_dim: int, hidden: int):
        super().__init__()
        self.linear = nn.Linear(vision_dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def resize_with_pad(image: torch.Tensor, size: int, round_to_uint8: bool = True,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(H, W, 3) uint8 -> (3, size, size) float64 in [0, 1], aspect ratio kept, bilinear
    without corner alignment, centred on black. ``round_to_uint8`` (openpi): the resized image
    is rounded back to uint8, computed in float64. Otherwise (LeRobot's
    ``resize_with_pad_torch`` on its float32 [0, 1] images): ``x / 255``, resized and clamped
    to [0, 1], never rounded, computed in ``dtype`` (float32: LeRobot's arithmetic exactly) and
    returned as float64. A frame already size x size is only converted."""
    x = image.permute(2, 0, 1)
    h, w = x.shape[1:]
    if not round_to_uint8:
        x = x.to(dtype) / 255.0
    if (h, w) != (size, size):
        ratio = max(w / size, h / size)
        new_h, new_w = int(h / ratio), int(w / ratio)
        if round_to_uint8:
            x = F.interpolate(x[None].to(torch.float64), size=(new_h, new_w), mode='bilinear',
                              align_corners=False)[0].round().clamp(0, 255)
        else:
            x = F.interpolate(x[None], size=(new_h, new_w), mode='bilinear',
                              align_corners=False)[0].clamp(0.0, 1.0)
        top, left = (size - new_h) // 2, (size - new_w) // 2
        x = F.pad(x, (left, size - new_w - left, top, size - new_h - top))
    if not round_to_uint8:
        return x.to(torch.float64)
    return x.to(torch.float64) / 255.0


class Pi0Fast(nn.Module):
    """pi0-FAST as the engine sees it (models/protocol.VLAModel)."""

    prefix_attention = 'bidirectional'
    uses_state = True

    def __init__(self, cfg: Pi0FastConfig, codec=None, style: str = DEFAULT_STYLE):
        super().__init__()
        self.cfg = cfg
        self.style = check_style(style)     # the checkpoint's conventions (style.py)
        self.vision_tower = SiglipVisionTower(cfg.vision)
        self.multi_modal_projector = Projector(cfg.vision.embed_dim, cfg.llm.hidden_size)
        self.language_model = LlamaForCausalLM(cfg.llm)
        self.hidden_size = cfg.llm.hidden_size
        self.vocab_size = cfg.llm.vocab_size
        self.max_positions = cfg.llm.max_position_embeddings
        self.image_size = cfg.image_size
        self.num_image_slots = cfg.num_image_slots
        self.default_draft = cfg.default_draft
        # The FAST codec needs the checkpoint's tokenizer files: the loader attaches it.
        self._codec = codec

    def preprocess(self, image: torch.Tensor, *, center_crop: bool = False,
                   rotate_180: bool = False) -> torch.Tensor:
        """(H, W, 3) uint8 -> (3, S, S) float64 in [-1, 1]: resize with pad (rounded to uint8
        in the openpi style, kept float in the LeRobot style), then x * 2 - 1 (in the LeRobot
        style computed in float32 as there, or in float64 for a float64 model).
        ``center_crop`` is OpenVLA's evaluation rule: refused here."""
        if center_crop:
            raise ValueError('center_crop: not part of pi0-FAST\'s preprocessing')
        if rotate_180:
            image = image.flip(0, 1)
        if self.style == OPENPI:
            return resize_with_pad(image, self.cfg.image_size) * 2.0 - 1.0
        # LeRobot computes in float32 (its only precision for images); a float64 model gets
        # the same operations in float64.
        param = next(self.parameters(), None)
        dtype = torch.float64 if param is not None and param.dtype == torch.float64 \
            else torch.float32
        x = resize_with_pad(image, self.cfg.image_size, round_to_uint8=False, dtype=dtype)
        return (x.to(dtype) * 2.0 - 1.0).to(torch.float64)

    def image_embeddings(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """(B, 3, S, S) -> (B, P, H) projected patches (not scaled)."""
        return self.multi_modal_projector(self.vision_tower(pixel_values))

    def image_embeddings_for(self, device):
        return self.image_embeddings

    def prefix_len(self, num_prompt_ids: int, num_images: int = 1) -> int:
        return num_images * self.cfg.num_patches + num_prompt_ids

    def prompt_embeddings(self, patches: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """(I * P, H) patches, (T,) prompt ids (BOS first) -> (I * P + T, H)."""
        text = self.language_model.token_embeddings(input_ids)
        return torch.cat([patches.to(text.dtype), text], dim=0)

    def token_embeddings(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.language_model.token_embeddings(token_ids)

    def action_codec(self):
        if self._codec is None:
            raise ValueError('pi0-FAST: no FAST codec attached (load the checkpoint with '
                             'models.registry.load_family, or pass codec= to ModelRunner)')
        return self._codec

    def attach_codec(self, codec) -> None:
        self._codec = codec


def discretize_state(state, max_state_dim: int | None = None, num_bins: int = 256
                     ) -> np.ndarray:
    """A normalised state (D,) -> int bins, as openpi's and LeRobot's tokenizers compute them:
    ``digitize(x, linspace(-1, 1, num_bins + 1)[:-1]) - 1`` (not clipped: a value below -1
    gives -1, one at or above 1 - 2 / num_bins gives num_bins - 1, as there). openpi first
    zero-pads to ``max_state_dim`` (D <= max_state_dim); LeRobot (``max_state_dim`` None) writes
    the D values as they are. The values are compared in float64 (a float32 state, as
    LeRobot's, converts exactly)."""
    array = np.asarray(state, dtype=np.float64).reshape(-1)
    if max_state_dim is not None and array.shape[0] > max_state_dim:
        raise ValueError(f'state: {array.shape[0]} dimensions; the model reads at most '
                         f'{max_state_dim}')
    if not np.isfinite(array).all():
        raise ValueError(f'state: non-finite values {array.tolist()}')
    if max_state_dim is not None:
        padded = np.zeros(max_state_dim)
        padded[:array.shape[0]] = array
        array = padded
    return np.digitize(array, bins=np.linspace(-1, 1, num_bins + 1)[:-1]) - 1
