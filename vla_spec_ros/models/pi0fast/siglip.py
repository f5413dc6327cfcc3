"""PaliGemma's SigLIP vision tower, with the parameter names of transformers'
``SiglipVisionTransformer`` (``embeddings.patch_embedding``, ``encoder.layers.{i}.self_attn``,
``post_layernorm``): every block runs, then the post-layernorm (PaliGemma reads
``last_hidden_state``; OpenVLA's towers stop one block earlier, models/openvla/vision.py).

A block is pre-norm: ``x + attn(ln1(x))``, then ``x + fc2(gelu_tanh(fc1(ln2(x))))``; attention
is plain multi-head attention with biases, over all patches (no mask, no class token).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...config import VisionTowerConfig


class SiglipAttention(nn.Module):
    def __init__(self, width: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.q_proj = nn.Linear(width, width)
        self.k_proj = nn.Linear(width, width)
        self.v_proj = nn.Linear(width, width)
        self.out_proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, width = x.shape                                        # x: (B, N, W)
        shape = (b, n, self.num_heads, width // self.num_heads)
        q, k, v = (proj(x).view(shape).transpose(1, 2)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))  # (B, heads, N, d)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.out_proj(out.transpose(1, 2).reshape(b, n, width))


class SiglipMLP(nn.Module):
    def __init__(self, width: int, mlp_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(width, mlp_dim)
        self.fc2 = nn.Linear(mlp_dim, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate='tanh'))


class SiglipLayer(nn.Module):
    def __init__(self, cfg: VisionTowerConfig):
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(cfg.embed_dim, eps=cfg.norm_eps)
        self.self_attn = SiglipAttention(cfg.embed_dim, cfg.num_heads)
        self.layer_norm2 = nn.LayerNorm(cfg.embed_dim, eps=cfg.norm_eps)
        self.mlp = SiglipMLP(cfg.embed_dim, cfg.mlp_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class SiglipEmbeddings(nn.Module):
    def __init__(self, cfg: VisionTowerConfig):
        super().__init__()
        self.patch_embedding = nn.Conv2d(3, cfg.embed_dim, cfg.patch_size, cfg.patch_size)
        self.position_embedding = nn.Embedding(cfg.num_patches, cfg.embed_dim)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        patches = self.patch_embedding(pixels).flatten(2).transpose(1, 2)   # (B, P, W)
        return patches + self.position_embedding.weight


class SiglipEncoder(nn.Module):
    def __init__(self, cfg: VisionTowerConfig):
        super().__init__()
        self.layers = nn.ModuleList(SiglipLayer(cfg) for _ in range(cfg.depth))


class SiglipVisionTower(nn.Module):
    """(B, 3, S, S) pixels in [-1, 1] -> (B, P, W) post-layernormed patch features."""

    def __init__(self, cfg: VisionTowerConfig):
        super().__init__()
        self.embeddings = SiglipEmbeddings(cfg)
        self.encoder = SiglipEncoder(cfg)
        self.post_layernorm = nn.LayerNorm(cfg.embed_dim, eps=cfg.norm_eps)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.embeddings(pixels)
        for layer in self.encoder.layers:
            x = layer(x)
        return self.post_layernorm(x)
