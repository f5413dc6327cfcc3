"""Batched teacher-forced forward of a prefix-LM family (pi0-FAST), for behaviour cloning.

The engine decodes one packed sequence over a KV cache; training wants (B, L) batches with
autograd. This runs the SAME modules (SigLIP tower, projector, Gemma layers through
``models/batched_forward.layer_forward``) with one explicit mask per sample (model.py here):

    rows   [ I x P image patches | prompt ids (BOS first) | generated tokens[:-1] | pad ]
    keys   the prefix (patches + prompt) is seen by every row; a generated row also sees the
           generated rows up to itself (causal); pad keys are seen by no row.

The logits at rows ``prefix_len - 1 + j`` predict generated token ``j`` (``Action: ``, the FAST
ids, ``|``, EOS: openpi's loss covers exactly these). Positions are 0 .. L-1 as in the engine.
``test/test_train_demo_fast.py`` checks these logits against the engine's AR forward in
float64.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ..batched_forward import layer_forward


def pixel_values_pi0fast(images: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """(B, S, S, 3) uint8 at the model's size -> (B, 3, S, S) in [-1, 1]: ``Pi0Fast.preprocess``
    for frames already at the model size (no resize, no padding)."""
    if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[-1] != 3:
        raise ValueError(f'images: expected (B, S, S, 3) uint8, got {tuple(images.shape)} '
                         f'{images.dtype}')
    x = images.permute(0, 3, 1, 2).to(torch.float64) / 255.0
    return (x * 2.0 - 1.0).to(dtype)


def prefix_lm_batch(prompt_ids: Sequence[Sequence[int]], targets: Sequence[Sequence[int]],
                    num_patches: int, pad_id: int):
    """-> (ids (B, T) right-padded: prompt ids then targets[:-1]; prefix_lens (B,) = patches +
    prompt; lengths (B,) valid rows incl. patches; attn_mask (B, 1, L, L) bool, L = patches + T;
    target (B, G) right-padded with -100; the rows (B, G) whose logits predict them)."""
    if len(prompt_ids) != len(targets):
        raise ValueError(f'targets: {len(targets)} rows for {len(prompt_ids)} prompts')
    rows = [list(p) + list(t[:-1]) for p, t in zip(prompt_ids, targets)]
    width = max(len(r) for r in rows)
    num_targets = max(len(t) for t in targets)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    target = torch.full((len(rows), num_targets), -100, dtype=torch.long)
    for i, (r, t) in enumerate(zip(rows, targets)):
        ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        target[i, :len(t)] = torch.tensor(list(t), dtype=torch.long)
    prefix_lens = torch.tensor([num_patches + len(p) for p in prompt_ids])
    lengths = torch.tensor([num_patches + len(r) for r in rows])
    length = num_patches + width
    key = torch.arange(length)
    query = key[:, None]
    is_prefix_key = key[None, :] < prefix_lens[:, None]                      # (B, L)
    is_valid_key = key[None, :] < lengths[:, None]                           # (B, L)
    attn_mask = (is_prefix_key[:, None, :] | (key[None, None, :] <= query[None])) \
        & is_valid_key[:, None, :]                                           # (B, L, L)
    predict_rows = (prefix_lens[:, None] - 1 + torch.arange(num_targets)[None]) \
        .clamp(max=length - 1)                                               # (B, G)
    return ids, prefix_lens, attn_mask[:, None], target, predict_rows


def prefix_lm_logits(model, pixel_values: torch.Tensor, ids: torch.Tensor,
                     attn_mask: torch.Tensor, predict_rows: torch.Tensor) -> torch.Tensor:
    """pixel_values (B, 3, S, S); ids, attn_mask, predict_rows from ``prefix_lm_batch`` ->
    (B, G, vocab) logits at the rows that predict the generated tokens."""
    lm = model.language_model
    patches = model.image_embeddings(pixel_values)                          # (B, P, H)
    text = lm.token_embeddings(ids)                                         # (B, T, H) scaled
    x = torch.cat([patches.to(text.dtype), text], dim=1)                    # (B, L, H)
    b, length, _ = x.shape
    cos_table, sin_table = lm.rope(x.dtype, x.device)
    positions = torch.arange(length, device=x.device).repeat(b)             # (B * L,)
    cos, sin = cos_table[positions], sin_table[positions]
    for layer in lm.model.layers:
        x = layer_forward(layer, x, cos, sin, attn_mask)
    x = lm.model.norm(x)
    hidden = torch.gather(x, 1, predict_rows[:, :, None].expand(-1, -1, x.shape[-1]))
    return lm.logits(hidden)
