"""Plain-torch ViT towers compatible with OpenVLA's timm checkpoints (no timm dependency).

OpenVLA's fused backbone (docs/openvla.md, Architecture): DINOv2-L/14 with 4 registers and SigLIP
So400m/14 each return the output of their SECOND-TO-LAST block, without the final LayerNorm,
with DINOv2's CLS and register tokens dropped; the patch features are concatenated along the
feature axis. A single-tower backbone (``use_fused_vision_backbone`` false: SigLIP or DINOv2
alone) returns its one tower's features. Only the blocks that run are built: the last block,
``norm`` and SigLIP's ``attn_pool`` exist in checkpoints but are unused (see
``unused_vision_keys``).

The projector follows the Hugging Face port (``PrismaticProjector``): three Linear layers with
a 4x first expansion for a fused backbone, two for a single tower.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...config import VisionTowerConfig
from .config import VLAConfig


class LayerScale(nn.Module):
    # OpenVLA renames timm's ``gamma`` to ``scale_factor`` in its checkpoints.
    def __init__(self, dim: int):
        super().__init__()
        self.scale_factor = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * self.scale_factor


class ViTAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=True)
        self.proj = nn.Linear(dim, dim, bias=True)

    def forward(self, x):                                   # x: (B, N, D)
        b, n, d = x.shape
        qkv = self.qkv(x).view(b, n, 3, self.num_heads, d // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)                # each (B, heads, N, hd)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(b, n, d))


class GeluMLP(nn.Module):
    """fc1 (in -> hidden) -> exact (erf) GELU -> fc2 (hidden -> out): a ViT block's MLP (timm)
    and Prismatic's single-tower ``gelu-mlp`` projector (D -> llm -> llm) alike."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(in_dim, hidden)
        self.fc2 = nn.Linear(hidden, out_dim)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class ViTBlock(nn.Module):
    def __init__(self, cfg: VisionTowerConfig):
        super().__init__()
        d = cfg.embed_dim
        self.norm1 = nn.LayerNorm(d, eps=cfg.norm_eps)
        self.attn = ViTAttention(d, cfg.num_heads)
        self.norm2 = nn.LayerNorm(d, eps=cfg.norm_eps)
        self.mlp = GeluMLP(d, cfg.mlp_dim, d)
        has_scale = cfg.kind == 'dinov2'
        self.ls1 = LayerScale(d) if has_scale else nn.Identity()
        self.ls2 = LayerScale(d) if has_scale else nn.Identity()

    def forward(self, x):
        x = x + self.ls1(self.attn(self.norm1(x)))
        return x + self.ls2(self.mlp(self.norm2(x)))


class PatchEmbed(nn.Module):
    """The patch projection: a convolution whose stride is its kernel (timm's weights and
    names, ``proj``), computed as one matrix product over the image cut into patches. That
    is the convolution's arithmetic (pixels beyond the last whole patch are dropped, as the
    convolution drops them) without its layout reorders, which on a CPU cost about twice the
    product at the embedded model's size."""

    def __init__(self, cfg: VisionTowerConfig):
        super().__init__()
        self.proj = nn.Conv2d(3, cfg.embed_dim, cfg.patch_size, stride=cfg.patch_size)

    def forward(self, x):                                   # (B, 3, H, W) -> (B, P, D)
        b, c, h, w = x.shape
        p = self.proj.kernel_size[0]
        rows, cols = h // p, w // p
        patches = x[:, :, :rows * p, :cols * p].reshape(b, c, rows, p, cols, p) \
            .permute(0, 2, 4, 1, 3, 5).reshape(b, rows * cols, c * p * p)  # (B, P, 3 p p)
        return F.linear(patches, self.proj.weight.reshape(self.proj.out_channels, -1),
                        self.proj.bias)


class ViTTower(nn.Module):
    """Returns the patch features after block ``depth - 2`` (0-based), prefix tokens dropped."""

    def __init__(self, cfg: VisionTowerConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.embed_dim
        self.patch_embed = PatchEmbed(cfg)
        # Position embeddings cover the patches only; CLS/registers are prepended afterwards.
        self.pos_embed = nn.Parameter(torch.zeros(1, cfg.num_patches, d))
        if cfg.kind == 'dinov2':
            self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
            self.reg_token = nn.Parameter(torch.zeros(1, cfg.num_register_tokens, d)) \
                if cfg.num_register_tokens else None
        self.blocks = nn.ModuleList(ViTBlock(cfg) for _ in range(cfg.depth - 1))

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:  # (B, 3, S, S) -> (B, P, D)
        x = self.patch_embed(pixels) + self.pos_embed
        prefix = []
        if self.cfg.kind == 'dinov2':
            b = x.shape[0]
            prefix.append(self.cls_token.expand(b, -1, -1))
            if self.reg_token is not None:
                prefix.append(self.reg_token.expand(b, -1, -1))
            x = torch.cat(prefix + [x], dim=1)
        for block in self.blocks:
            x = block(x)
        return x[:, self.cfg.num_prefix_tokens:]


class VisionBackbone(nn.Module):
    """One tower (``featurizer``) or OpenVLA's fused pair (``featurizer`` DINOv2 +
    ``fused_featurizer`` SigLIP); attribute names are the checkpoint's."""

    def __init__(self, cfg: VLAConfig):
        super().__init__()
        self.is_fused = cfg.is_fused
        self.featurizer = ViTTower(cfg.featurizer)
        if cfg.is_fused:
            self.fused_featurizer = ViTTower(cfg.fused_featurizer)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Fused: (B, 6, S, S), channels 0-2 DINOv2, 3-5 SigLIP -> (B, P, D1 + D2).
        One tower: (B, 3, S, S) -> (B, P, D)."""
        if not self.is_fused:
            return self.featurizer(pixel_values)
        a = self.featurizer(pixel_values[:, :3])
        b = self.fused_featurizer(pixel_values[:, 3:])
        return torch.cat([a, b], dim=-1)


class FusedGeluMLPProjector(nn.Module):
    """OpenVLA's ``no-align+fused-gelu-mlp``: fc1 (D -> 4D) -> GELU -> fc2 -> GELU -> fc3."""

    def __init__(self, vision_dim: int, llm_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(vision_dim, 4 * vision_dim)
        self.fc2 = nn.Linear(4 * vision_dim, llm_dim)
        self.fc3 = nn.Linear(llm_dim, llm_dim)

    def forward(self, x):
        return self.fc3(F.gelu(self.fc2(F.gelu(self.fc1(x)))))


def make_projector(cfg: VLAConfig) -> nn.Module:
    """The projector ``cfg``'s backbone calls for (the Hugging Face port switches on
    ``use_fused_vision_backbone`` the same way)."""
    if cfg.is_fused:
        return FusedGeluMLPProjector(cfg.vision_dim, cfg.llm.hidden_size)
    # Prismatic's single-tower ``gelu-mlp``: fc1 (D -> llm) -> GELU -> fc2 (llm -> llm).
    return GeluMLP(cfg.vision_dim, cfg.llm.hidden_size, cfg.llm.hidden_size)


TOWER_PREFIXES = ('vision_backbone.featurizer.', 'vision_backbone.fused_featurizer.')


def unused_vision_keys(cfg: VLAConfig) -> dict[str, tuple[int, ...]]:
    """Checkpoint keys OpenVLA stores but never uses, with their shapes (for writing/checks)."""
    keys: dict[str, tuple[int, ...]] = {}
    for prefix, tower in zip(TOWER_PREFIXES, cfg.towers):
        d, m, last = tower.embed_dim, tower.mlp_dim, f'blocks.{tower.depth - 1}.'
        block = {
            'norm1.weight': (d,), 'norm1.bias': (d,),
            'attn.qkv.weight': (3 * d, d), 'attn.qkv.bias': (3 * d,),
            'attn.proj.weight': (d, d), 'attn.proj.bias': (d,),
            'norm2.weight': (d,), 'norm2.bias': (d,),
            'mlp.fc1.weight': (m, d), 'mlp.fc1.bias': (m,),
            'mlp.fc2.weight': (d, m), 'mlp.fc2.bias': (d,),
        }
        if tower.kind == 'dinov2':
            block.update({'ls1.scale_factor': (d,), 'ls2.scale_factor': (d,)})
        for name, shape in block.items():
            keys[prefix + last + name] = shape
        keys[prefix + 'norm.weight'] = (d,)
        keys[prefix + 'norm.bias'] = (d,)
        if tower.kind == 'siglip':
            pool = {
                'latent': (1, 1, d), 'q.weight': (d, d), 'q.bias': (d,),
                'kv.weight': (2 * d, d), 'kv.bias': (2 * d,),
                'proj.weight': (d, d), 'proj.bias': (d,),
                'norm.weight': (d,), 'norm.bias': (d,),
                'mlp.fc1.weight': (m, d), 'mlp.fc1.bias': (m,),
                'mlp.fc2.weight': (d, m), 'mlp.fc2.bias': (d,),
            }
            for name, shape in pool.items():
                keys[prefix + 'attn_pool.' + name] = shape
    return keys
