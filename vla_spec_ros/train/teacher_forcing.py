"""Batched teacher-forced forward of the OpenVLA model, for behaviour-cloning training.

The engine runs one packed sequence over a slot-addressed KV cache (models/attention.py); training
wants (B, T) batches with autograd and no cache. This module runs the SAME modules and weights
(vision towers, projector, embeddings, each Llama layer's projections, norms and MLP) with
batched causal attention. Sequences are right-padded: with causal attention a pad token after a
sequence's end never influences that sequence's logits, so no padding mask is needed.

Layout per sample (docs/openvla.md, Architecture and Action tokens): ``[BOS] + patches + prompt ids
after BOS + 7 action tokens``; the logits at position ``prefix_len - 1 + j`` predict action token
``j`` (OpenVLA's loss covers exactly the action tokens). ``test/test_train_demo_vla.py`` checks
these logits against the engine's AR forward in float64.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ..config import VLAConfig
from ..models.rope import apply_rope
from ..models.openvla.vla import OpenVLA
from ..preprocess import normalize_per_tower


def pixel_values_batch(images: torch.Tensor, cfg: VLAConfig, dtype=torch.float32
                       ) -> torch.Tensor:
    """images (B, S, S, 3) uint8 at the model's size -> (B, 6, S, S) in ``dtype``.

    Equal to ``preprocess.preprocess_image`` for images already at the model size (no resize,
    no crop, no rotation): scale to [0, 1], normalise per tower (in float64, as there),
    DINOv2 channels first.
    """
    if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[-1] != 3:
        raise ValueError(f'images: expected (B, S, S, 3) uint8, got {tuple(images.shape)} '
                         f'{images.dtype}')
    if tuple(images.shape[1:3]) != (cfg.image_size, cfg.image_size):
        raise ValueError(f'images: expected {cfg.image_size} x {cfg.image_size} pixels, got '
                         f'{tuple(images.shape[1:3])}')
    x = images.permute(0, 3, 1, 2).to(torch.float64) / 255.0
    return normalize_per_tower(x, cfg).to(dtype)


def random_shift(images: torch.Tensor, max_shift: int, generator: torch.Generator
                 ) -> torch.Tensor:
    """Shift each image (B, S, S, 3) uint8 by up to ``max_shift`` pixels in x and y, filling
    with edge pixels (DrQ-style augmentation: the camera is fixed, objects move)."""
    if max_shift <= 0:
        return images
    b, s = images.shape[0], images.shape[1]
    padded = F.pad(images.permute(0, 3, 1, 2).float(), [max_shift] * 4, mode='replicate')
    offsets = torch.randint(0, 2 * max_shift + 1, (b, 2), generator=generator)
    out = torch.empty_like(images)
    for i in range(b):
        top, left = int(offsets[i, 0]), int(offsets[i, 1])
        out[i] = padded[i, :, top:top + s, left:left + s].permute(1, 2, 0).to(torch.uint8)
    return out


def build_sequences(prompt_ids: list[list[int]], action_tokens: np.ndarray, pad_id: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample prompt ids (BOS first) + (B, A) action tokens -> (ids (B, T) right-padded
    with ``pad_id`` = prompt ids after BOS followed by the action tokens, text_lens (B,))."""
    action_tokens = np.asarray(action_tokens, dtype=np.int64)
    if action_tokens.ndim != 2 or action_tokens.shape[0] != len(prompt_ids):
        raise ValueError(f'action_tokens: expected ({len(prompt_ids)}, A), got '
                         f'{action_tokens.shape}')
    rows = [list(ids) + [int(t) for t in acts] for ids, acts in zip(prompt_ids, action_tokens)]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
    text_lens = torch.tensor([len(p) for p in prompt_ids], dtype=torch.long)
    return ids, text_lens


def _layer_forward(layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   attn_mask: torch.Tensor | None = None) -> torch.Tensor:
    """One Llama decoder layer on (B, T, H) (no KV cache): causal attention, or ``attn_mask``
    (B, 1, T, T) bool, True where a query may see a key, when given."""
    b, t, _ = x.shape
    attn = layer.self_attn
    h = layer.input_layernorm(x) if layer.input_layernorm is not None else x
    q = attn.q_proj(h).view(b * t, attn.num_heads, attn.head_dim)
    k = attn.k_proj(h).view(b * t, attn.num_kv_heads, attn.head_dim)
    v = attn.v_proj(h).view(b, t, attn.num_kv_heads, attn.head_dim)
    q = apply_rope(q, cos, sin).view(b, t, attn.num_heads, attn.head_dim)
    k = apply_rope(k, cos, sin).view(b, t, attn.num_kv_heads, attn.head_dim)
    q, k, v = (z.transpose(1, 2) for z in (q, k, v))            # (B, heads, T, D)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                         is_causal=attn_mask is None,
                                         enable_gqa=attn.num_kv_heads != attn.num_heads)
    x = x + attn.o_proj(out.transpose(1, 2).reshape(b, t, -1))
    return x + layer.mlp(layer.post_attention_layernorm(x))


def action_logits(model: OpenVLA, pixel_values: torch.Tensor, ids: torch.Tensor,
                  text_lens: torch.Tensor, num_actions: int) -> torch.Tensor:
    """Teacher-forced logits at the positions that predict the action tokens.

    pixel_values (B, 6, S, S); ids (B, T) from ``build_sequences`` (ids[:, 0] is BOS);
    text_lens (B,) prompt lengths incl. BOS. Returns (B, num_actions, vocab).
    """
    lm = model.language_model
    patches = model.image_embeddings(pixel_values)                          # (B, P, H)
    text = lm.model.embed_tokens(ids)                                       # (B, T, H)
    x = torch.cat([text[:, :1], patches, text[:, 1:]], dim=1)               # (B, L, H)
    b, length, _ = x.shape
    cos_table, sin_table = lm.rope(x.dtype, x.device)
    positions = torch.arange(length, device=x.device).repeat(b)             # (B * L,)
    cos, sin = cos_table[positions], sin_table[positions]
    for layer in lm.model.layers:
        x = _layer_forward(layer, x, cos, sin)
    x = lm.model.norm(x)
    prefix_lens = text_lens + patches.shape[1]                              # (B,)
    offsets = torch.arange(num_actions, device=x.device)
    index = (prefix_lens[:, None] - 1 + offsets[None, :]).to(x.device)      # (B, A)
    hidden = torch.gather(x, 1, index[:, :, None].expand(-1, -1, x.shape[-1]))
    return lm.logits(hidden)
