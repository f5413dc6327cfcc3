"""Llama decoder (RMSNorm, RoPE, SwiGLU) over a slot-addressed static KV cache; with the
``LlamaConfig`` options, Gemma's (RMSNorm by 1 + w, GeGLU, scaled token embeddings, tied head).

Module and parameter names mirror Hugging Face ``LlamaForCausalLM`` (``model.embed_tokens``,
``model.layers.{i}.self_attn.q_proj``, ``model.norm``, ``lm_head``) so OpenVLA's
``language_model.*`` checkpoint keys load without renaming (docs/openvla.md, Checkpoint layout).
"""
from __future__ import annotations

import torch
from torch import nn

from ..config import LlamaConfig
from .attention import KVCache, StepBatch
from .layers import PLAIN, LayerKernels, LlamaDecoderLayer, RMSNorm
from .rope import RopeRows, RopeTables


class LlamaBackbone(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.norm_unit_offset)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.model = LlamaBackbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.tie_weights()
        self._embed_multiplier = cfg.embedding_multiplier
        self._rope = RopeTables(cfg)

    def tie_weights(self) -> None:
        """With ``tie_word_embeddings``, the head's weight IS the embedding table (one
        Parameter); call again after assigning a new table (``load_state_dict(assign=True)``)."""
        if self.cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def token_embeddings(self, token_ids: torch.Tensor) -> torch.Tensor:
        """(N,) ids -> (N, H) decoder inputs: the table's rows, times Gemma's sqrt(width) when
        the config says so (never applied to image features). Every token embedding the
        engine and the draft heads feed goes through here."""
        rows = self.model.embed_tokens.forward(token_ids)
        if self._embed_multiplier is None:
            return rows
        return rows * torch.tensor(self._embed_multiplier, dtype=rows.dtype)

    def rope(self, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin tables, built once per (dtype, device) and kept on this module."""
        return self._rope.get(dtype, device)

    def new_kv_cache(self, num_slots: int) -> KVCache:
        return KVCache.for_config(self.cfg, num_slots, self.lm_head.weight)

    def forward_hidden(self, inputs_embeds: torch.Tensor, batch: StepBatch, cache: KVCache,
                       kernels: LayerKernels = PLAIN) -> torch.Tensor:
        """inputs_embeds: (T, H) packed tokens -> final-normed hidden states (T, H).
        ``kernels``: the fused kernels to use (default none: plain torch). Each layer leaves
        its MLP's residual add to the next norm (``forward_deferred``)."""
        rope = RopeRows.gather(self.rope(inputs_embeds.dtype, inputs_embeds.device),
                               batch.positions)
        if batch.attn_mask is None:               # the masks' biases once, not per layer
            batch = batch.with_biases(inputs_embeds.dtype,
                                      segments=kernels.segment_attention is None)
        x, delta = inputs_embeds, None
        for i, layer in enumerate(self.model.layers):
            x, delta = layer.forward_deferred(x, delta, batch, rope, cache.k[i], cache.v[i],
                                              kernels)
        return self.model.norm.add_and_norm(x, delta, kernels.rms_norm)[1]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head.forward(hidden)
