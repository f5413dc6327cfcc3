"""The OpenVLA assembly: vision backbone (fused or one tower) -> projector -> Llama.

Sequence layout (docs/openvla.md, Architecture): ``[BOS] + projected patches + text tokens after
BOS``, logical positions 0..L-1. Attribute names match the checkpoint prefixes
(``vision_backbone.*``, ``projector.*``, ``language_model.*``).
"""
from __future__ import annotations

import torch
from torch import nn

from ...config import VLAConfig
from ..llama import LlamaForCausalLM
from .vision import VisionBackbone, make_projector


class OpenVLA(nn.Module):
    def __init__(self, cfg: VLAConfig):
        super().__init__()
        self.cfg = cfg
        self.vision_backbone = VisionBackbone(cfg)
        self.projector = make_projector(cfg)
        self.language_model = LlamaForCausalLM(cfg.llm)

    def image_embeddings(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """(B, C, S, S) normalised pixels (C = ``cfg.pixel_channels``: 6 fused, 3 for one
        tower) -> (B, num_patches, hidden) projected patches."""
        return self.projector(self.vision_backbone(pixel_values))

    def prompt_embeddings(self, patches: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """patches (P, H), input_ids (T,) starting with BOS -> (1 + P + T - 1, H)."""
        text = self.language_model.model.embed_tokens(input_ids)
        return torch.cat([text[:1], patches, text[1:]], dim=0)

    def token_embeddings(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.language_model.model.embed_tokens(token_ids)

    def image_embeddings_for(self, device):
        """``image_embeddings`` as it runs fastest on ``device`` (the same values): on a GPU
        the two towers side by side (parallel_towers.py), on a CPU one after the other."""
        if torch.device(device).type == 'cuda':
            from .parallel_towers import ParallelTowers
            return ParallelTowers(self, device)
        return self.image_embeddings
