"""A decoder layer on a batch, without a KV cache: the teacher-forced forward of behaviour-
cloning training (every family's demo training, models/<family>/teacher_forcing.py and the
like).

The engine runs one packed sequence over a slot-addressed KV cache (models/attention.py);
training wants (B, T) batches with autograd and no cache. ``layer_forward`` runs the SAME
layer modules and weights (the projections, norms and MLP of models/layers.py) with batched
attention: causal, or an explicit (B, 1, T, T) mask (a prefix-LM family's).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .rope import apply_rope


def layer_forward(layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
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


__all__ = ['layer_forward']
