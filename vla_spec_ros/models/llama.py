"""Llama decoder (RMSNorm, RoPE, SwiGLU) over a slot-addressed static KV cache.

Module and parameter names mirror Hugging Face ``LlamaForCausalLM`` (``model.embed_tokens``,
``model.layers.{i}.self_attn.q_proj``, ``model.norm``, ``lm_head``) so OpenVLA's
``language_model.*`` checkpoint keys load without renaming (docs/openvla.md, Checkpoint layout).
"""
from __future__ import annotations

import torch
from torch import nn

from ..config import LlamaConfig
from .layers import KVCache, LlamaDecoderLayer, RMSNorm, RopeRows, RopeTables, StepBatch


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
        self._rope = RopeTables(cfg)

    def rope(self, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin tables, built once per (dtype, device) and kept on this module."""
        return self._rope.get(dtype, device)

    def new_kv_cache(self, num_slots: int) -> KVCache:
        return KVCache.for_config(self.cfg, num_slots, self.lm_head.weight)

    def forward_hidden(self, inputs_embeds: torch.Tensor, batch: StepBatch, cache: KVCache,
                       kernel=None, norm_kernel=None) -> torch.Tensor:
        """inputs_embeds: (T, H) packed tokens -> final-normed hidden states (T, H).
        ``kernel`` / ``norm_kernel``: the fused RoPE + KV write / RMSNorm (None = plain)."""
        rope = RopeRows.gather(self.rope(inputs_embeds.dtype, inputs_embeds.device),
                               batch.positions)
        x = inputs_embeds
        for i, layer in enumerate(self.model.layers):
            x = layer(x, batch, rope, cache.k[i], cache.v[i], kernel, norm_kernel)
        return self.model.norm.forward(x, norm_kernel)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
