"""The OpenVLA assembly: vision backbone (fused or one tower) -> projector -> Llama.

Sequence layout (docs/openvla.md, Architecture): ``[BOS] + projected patches + text tokens after
BOS``, logical positions 0..L-1. Attribute names match the checkpoint prefixes
(``vision_backbone.*``, ``projector.*``, ``language_model.*``).
"""
from __future__ import annotations

import torch
from torch import nn

from ..llama import LlamaForCausalLM
from .action_bins import ActionTokenizer
from .config import DEFAULT_DRAFT, VLAConfig
from .preprocess import preprocess_pixels
from .vision import VisionBackbone, make_projector


class OpenVLA(nn.Module):
    # The model protocol's facts (models/protocol.py): one camera, a causal prompt, no state.
    num_image_slots = 1
    prefix_attention = 'causal'
    uses_state = False
    default_draft = DEFAULT_DRAFT

    def __init__(self, cfg: VLAConfig):
        super().__init__()
        self.cfg = cfg
        self.vision_backbone = VisionBackbone(cfg)
        self.projector = make_projector(cfg)
        self.language_model = LlamaForCausalLM(cfg.llm)
        self.hidden_size = cfg.llm.hidden_size
        self.vocab_size = cfg.llm.vocab_size
        self.max_positions = cfg.llm.max_position_embeddings
        self.image_size = cfg.image_size

    def preprocess(self, image: torch.Tensor, *, center_crop: bool = False,
                   rotate_180: bool = False) -> torch.Tensor:
        """OpenVLA's preprocessing (preprocess.py here): (H, W, 3) uint8 -> (C, S, S) float64."""
        return preprocess_pixels(image, self.cfg, center_crop=center_crop,
                                 rotate_180=rotate_180)

    def prefix_len(self, num_prompt_ids: int, num_images: int = 1) -> int:
        """BOS, the patches, the text after BOS."""
        return num_prompt_ids + num_images * self.cfg.num_patches

    def action_codec(self):
        """OpenVLA's bins (action_bins.ActionTokenizer), ``action_chunk`` steps per frame."""
        cfg = self.cfg
        return ActionTokenizer(cfg.llm.vocab_size, cfg.pad_to_multiple_of, cfg.n_action_bins,
                               cfg.action_dim, cfg.action_chunk)

    def image_embeddings(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """(B, C, S, S) normalised pixels (C = ``cfg.pixel_channels``: 6 fused, 3 for one
        tower) -> (B, num_patches, hidden) projected patches."""
        return self.projector(self.vision_backbone(pixel_values))

    def prompt_embeddings(self, patches: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """patches (P, H), input_ids (T,) starting with BOS -> (1 + P + T - 1, H)."""
        text = self.language_model.token_embeddings(input_ids)
        return torch.cat([text[:1], patches, text[1:]], dim=0)

    def token_embeddings(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.language_model.token_embeddings(token_ids)

    def image_embeddings_for(self, device):
        """``image_embeddings`` as it runs fastest on ``device`` (the same values): on a GPU
        the two towers side by side (parallel_towers.py), on a CPU one after the other."""
        if torch.device(device).type == 'cuda':
            from .parallel_towers import ParallelTowers
            return ParallelTowers(self, device)
        return self.image_embeddings
