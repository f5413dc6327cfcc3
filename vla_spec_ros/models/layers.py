"""Llama building blocks shared by the verifier and the EAGLE draft head.

Every attention call goes through one primitive, ``attend_packed``: the new tokens of a packed
step (one or many requests, prefill / decode / draft tree) are written into a slot-addressed KV
buffer, then each query attends to the slots its boolean mask row allows. The same code therefore
serves AR decoding (slots = positions), the unified KV ring (slots anywhere in the ring, with
wrap-around) and tree verification (tree mask). Conventions follow Hugging Face Llama
(rotate-half RoPE with cos/sin tables computed in float32) so logits match
``transformers.LlamaForCausalLM`` on the same weights.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..config import LlamaConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Same arithmetic as HF: normalise in float32 (or higher), then scale in input dtype.
        dtype = x.dtype
        h = x.to(torch.float32) if dtype in (torch.float16, torch.bfloat16) else x
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


def rope_tables(head_dim: int, max_positions: int, theta: float, dtype: torch.dtype,
                device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables (max_positions, head_dim), computed in float32 as HF Llama does."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device)
                                .float() / head_dim))
    pos = torch.arange(max_positions, dtype=torch.int64, device=device).float()
    freqs = torch.outer(pos, inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (T, heads, D); cos/sin: (T, D) rows already gathered at each token's position."""
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


@dataclass
class StepBatch:
    """Per-step metadata of one packed forward, passed explicitly (never module-global).

    positions:    (T,) int64   logical position of each token inside its own request
    slot_mapping: (T,) int64   KV slot each token's K/V is written to
    attn_mask:    (T, S) bool  query t may attend slot s (S = slots in the KV buffer view)
    kv_limit:     attention reads slots [0, kv_limit) only; all allowed slots must lie there
    block_mask:   optional FlexAttention BlockMask of ``attn_mask`` (the GPU path: fully masked
                  blocks of the ring are skipped); with ``flex_fn`` (eager or compiled
                  ``flex_attention``, owned by the runner) it replaces SDPA
    """

    positions: torch.Tensor
    slot_mapping: torch.Tensor
    attn_mask: torch.Tensor
    kv_limit: int
    block_mask: Any = None
    flex_fn: Callable | None = None


class KVCache:
    """Slot-addressed K/V buffers, one (num_slots, kv_heads, head_dim) pair per layer."""

    def __init__(self, num_layers: int, num_slots: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device):
        shape = (num_slots, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.num_slots = num_slots

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """cache[dst[i]] = old cache[src[i]] for every layer (gather first: overlap-safe)."""
        for k, v in zip(self.k, self.v):
            k[dst] = k[src].clone()
            v[dst] = v[src].clone()


def write_kv_and_rope(q, k, v, batch: StepBatch, cos_table, sin_table, k_cache, v_cache,
                      kernel=None):
    """RoPE q/k at each token's logical position and write K/V to its slot.

    q: (T, Hq, D), k/v: (T, Hkv, D). Returns rotated q. ``kernel`` is an optional fused
    implementation with the same contract (kernels/rope_kv_write.py); None = plain torch.
    """
    if kernel is not None:
        return kernel(q, k, v, batch.positions, cos_table, sin_table, k_cache, v_cache,
                      batch.slot_mapping)
    cos = cos_table[batch.positions]
    sin = sin_table[batch.positions]
    q = apply_rope(q, cos, sin)
    k_cache[batch.slot_mapping] = apply_rope(k, cos, sin)
    v_cache[batch.slot_mapping] = v
    return q


def attend_packed(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  batch: StepBatch) -> torch.Tensor:
    """Masked attention of packed queries over the slot buffer (portable SDPA path).

    q: (T, Hq, D) already rotated; caches (S_total, Hkv, D). Returns (T, Hq, D).
    """
    n = batch.kv_limit
    keys = k_cache[:n].transpose(0, 1)      # (Hkv, S, D)
    values = v_cache[:n].transpose(0, 1)
    if batch.block_mask is not None:
        out = batch.flex_fn(q.transpose(0, 1)[None], keys[None], values[None],
                            block_mask=batch.block_mask,
                            enable_gqa=keys.shape[0] != q.shape[1])
        return out[0].transpose(0, 1)       # (T, Hq, D)
    rep = q.shape[1] // keys.shape[0]
    if rep > 1:  # grouped-query attention
        keys = keys.repeat_interleave(rep, dim=0)
        values = values.repeat_interleave(rep, dim=0)
    out = F.scaled_dot_product_attention(q.transpose(0, 1), keys, values,
                                         attn_mask=batch.attn_mask[:, :n])
    return out.transpose(0, 1)              # (T, Hq, D)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, d
        self.q_proj = nn.Linear(h, cfg.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * d, h, bias=False)

    def forward(self, x, batch: StepBatch, rope, k_cache, v_cache, kernel=None):
        t = x.shape[0]                                            # x: (T, H)
        q = self.q_proj(x).view(t, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
        q = write_kv_and_rope(q, k, v, batch, rope[0], rope[1], k_cache, v_cache, kernel)
        out = attend_packed(q, k_cache, v_cache, batch)
        return self.o_proj(out.reshape(t, -1))


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    """Pre-norm Llama block. ``has_input_norm=False`` gives EAGLE's first draft layer."""

    def __init__(self, cfg: LlamaConfig, has_input_norm: bool = True):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps) \
            if has_input_norm else None
        self.self_attn = LlamaAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x, batch: StepBatch, rope, k_cache, v_cache, kernel=None):
        h = self.input_layernorm(x) if self.input_layernorm is not None else x
        x = x + self.self_attn(h, batch, rope, k_cache, v_cache, kernel)
        return x + self.mlp(self.post_attention_layernorm(x))
