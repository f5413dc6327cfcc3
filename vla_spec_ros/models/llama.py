"""Llama decoder (RMSNorm, RoPE, SwiGLU) over a slot-addressed static KV cache.

Module and parameter names mirror Hugging Face ``LlamaForCausalLM`` (``model.embed_tokens``,
``model.layers.{i}.self_attn.q_proj``, ``model.norm``, ``lm_head``) so OpenVLA's
``language_model.*`` checkpoint keys load without renaming (reference/openvla.md §2).
"""
from __future__ import annotations

import torch
from torch import nn

from ..config import LlamaConfig
from .layers import KVCache, LlamaDecoderLayer, RMSNorm, RopeRows, StepBatch, rope_tables


class LlamaBackbone(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.model = LlamaBackbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self._rope = None

    def rope(self, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin tables, built once per (dtype, device) and kept on this module."""
        if self._rope is None or self._rope[0].dtype != dtype or self._rope[0].device != device:
            self._rope = rope_tables(self.cfg.head_dim, self.cfg.max_position_embeddings,
                                     self.cfg.rope_theta, dtype, device)
        return self._rope

    def new_kv_cache(self, num_slots: int) -> KVCache:
        p = self.lm_head.weight
        return KVCache(self.cfg.num_layers, num_slots, self.cfg.num_kv_heads, self.cfg.head_dim,
                       p.dtype, p.device)

    def forward_hidden(self, inputs_embeds: torch.Tensor, batch: StepBatch, cache: KVCache,
                       kernel=None) -> torch.Tensor:
        """inputs_embeds: (T, H) packed tokens -> final-normed hidden states (T, H)."""
        rope = RopeRows.gather(self.rope(inputs_embeds.dtype, inputs_embeds.device),
                               batch.positions)
        x = inputs_embeds
        for i, layer in enumerate(self.model.layers):
            x = layer(x, batch, rope, cache.k[i], cache.v[i], kernel)
        return self.model.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
