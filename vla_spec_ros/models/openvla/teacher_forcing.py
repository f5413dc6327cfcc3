"""Batched teacher-forced forward of the OpenVLA model, for behaviour-cloning training
(demo_training.py here).

The engine runs one packed sequence over a slot-addressed KV cache (models/attention.py); training
wants (B, T) batches with autograd and no cache. This module runs the SAME modules and weights
(vision towers, projector, embeddings, each Llama layer through models/batched_forward.py) with
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

from ..batched_forward import layer_forward
from .config import VLAConfig
from .preprocess import normalize_per_tower
from .vla import OpenVLA


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
        x = layer_forward(layer, x, cos, sin)
    x = lm.model.norm(x)
    prefix_lens = text_lens + patches.shape[1]                              # (B,)
    offsets = torch.arange(num_actions, device=x.device)
    index = (prefix_lens[:, None] - 1 + offsets[None, :]).to(x.device)      # (B, A)
    hidden = torch.gather(x, 1, index[:, :, None].expand(-1, -1, x.shape[-1]))
    return lm.logits(hidden)
