"""Packed attention over a slot-addressed KV buffer: the step's metadata (``StepBatch``), the
per-layer K/V buffers (``KVCache``), the RoPE + KV write and the two attention paths.

The new tokens of a packed step (one or many requests, prefill / decode / draft tree) are
written into their KV slots, then each query attends to the slots its mask allows: either
through a dense (T x slots) mask (``attend_packed``, the reference) or per segment over only
its own request's slots (``attend_segments``, the engine's work-proportional path). The same
code therefore serves AR decoding (slots = positions), the unified KV ring (slots anywhere in
the ring, with wrap-around) and tree verification (tree mask).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..config import LlamaConfig
from .rope import RopeRows


@dataclass
class StepBatch:
    """Per-step metadata of one packed forward, passed explicitly (never module-global).

    positions:    (T,) int64   logical position of each token inside its own request
    slot_mapping: (T,) int64   KV slot each token's K/V is written to

    Attention comes in one of two layouts:
    - dense (the reference): ``attn_mask`` (T, S) bool, query t may read slot s of the first
      ``kv_limit`` slots. Cost grows with every slot of the buffer.
    - segments (the engine's path, engine/device/step_inputs.py): rows 0 .. num_prefill-1 are fresh
      requests' prompts, one block per request of ``prefill_blocks`` rows each, each attending
      to its own rows only: causally, except that with ``prefill_prefix`` (num_blocks,) int64
      every row of block b also reads the block's first ``prefill_prefix[b]`` rows (a prefix-LM
      model's bidirectional prefix; None = causal everywhere). The rule is one line,
      ``prefill_allowed``: row i reads row j iff j <= i or j < prefix. Padding rows at a
      block's end lie past its prefix, so no real row reads them. The remaining rows form
      ``kv_index.shape[0]`` segments of ``seg_mask.shape[1]`` rows each; segment s reads only
      the slots ``kv_index[s]`` (S, K) under ``seg_mask`` (S, Q, K) bool.
      Cost grows with the work in flight.
    copy_src/copy_dst: optional (M,) KV compaction applied at the start of every layer
      (``cache[dst] = cache[src]``, gathered first), before the step's own writes.
    seg_bias/prefill_bias: the segments' and prefix blocks' masks as additive biases, made
      once per forward by ``with_biases`` (None: the layers use the boolean masks).
    """

    positions: torch.Tensor
    slot_mapping: torch.Tensor
    attn_mask: torch.Tensor | None = None
    kv_limit: int = 0
    prefill_blocks: tuple[int, ...] = ()
    kv_index: torch.Tensor | None = None
    seg_mask: torch.Tensor | None = None
    copy_src: torch.Tensor | None = None
    copy_dst: torch.Tensor | None = None
    prefill_prefix: torch.Tensor | None = None
    seg_bias: torch.Tensor | None = None
    prefill_bias: torch.Tensor | tuple[torch.Tensor, ...] | None = None

    @property
    def num_prefill(self) -> int:
        """Rows of all prefill blocks together."""
        return sum(self.prefill_blocks)

    def with_biases(self, dtype: torch.dtype, *, segments: bool = True) -> 'StepBatch':
        """This step with its segment and prefix masks also as additive biases in ``dtype``
        (0 where a row may read, -inf where it may not), for one forward: SDPA makes that bias
        from a boolean mask at every call, so once per layer otherwise (three launches each on
        a GPU, a few dispatches each on a CPU). The same bias SDPA would make, so the same
        results, a row that may read nothing included (its output is zeros either way). Call it
        per forward, not per step buffer: the masks change in place between steps.
        ``segments`` False: the segments' bias is not made (a kernel reads the boolean mask)."""
        seg_bias = None if self.seg_mask is None or not segments \
            else _additive(self.seg_mask[:, None], dtype)
        prefill_bias = None
        if self.prefill_prefix is not None and self.prefill_blocks:
            blocks, prefix = self.prefill_blocks, self.prefill_prefix
            if len(set(blocks)) == 1:
                prefill_bias = _additive(prefill_allowed(blocks[0], prefix)[:, None], dtype)
            else:
                prefill_bias = tuple(_additive(prefill_allowed(block, prefix[b:b + 1]), dtype)
                                     for b, block in enumerate(blocks))
        return dataclasses.replace(self, seg_bias=seg_bias, prefill_bias=prefill_bias)


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask as SDPA's additive bias: 0 where True, -inf where False."""
    return torch.where(allowed, 0.0, float('-inf')).to(dtype)     # one launch in float32


class KVCache:
    """Slot-addressed K/V buffers, one (num_slots, kv_heads, head_dim) pair per layer."""

    def __init__(self, num_layers: int, num_slots: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device):
        shape = (num_slots, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.num_slots = num_slots

    @classmethod
    def for_config(cls, cfg: LlamaConfig, num_slots: int, like: torch.Tensor) -> 'KVCache':
        """A cache for ``cfg``'s layers in the dtype and on the device of tensor ``like``."""
        return cls(cfg.num_layers, num_slots, cfg.num_kv_heads, cfg.head_dim, like.dtype,
                   like.device)


def prefill_allowed(block: int, prefix: torch.Tensor) -> torch.Tensor:
    """The prefill attention rule: (B, block, block) bool, row i of block b may read row j iff
    j <= i (causal) or j < prefix[b] (the bidirectional prefix). prefix: (B,) int64; zeros
    give plain causal blocks."""
    rows = torch.arange(block, device=prefix.device)
    causal = rows[None, :] <= rows[:, None]                                  # (block, block)
    return causal[None] | (rows[None, None, :] < prefix[:, None, None])


def write_kv_and_rope(q, k, v, batch: StepBatch, rope: RopeRows, k_cache, v_cache,
                      kernel=None):
    """RoPE q/k at each token's logical position and write K/V to its slot.

    q: (T, Hq, D), k/v: (T, Hkv, D). Returns (rotated q, rotated k or None): the fused
    ``kernel`` (kernels/rope_kv_write.py; None = plain torch) returns only q, its k lives in
    the cache.
    """
    if batch.copy_src is not None:
        k_cache[batch.copy_dst] = k_cache[batch.copy_src]
        v_cache[batch.copy_dst] = v_cache[batch.copy_src]
    if kernel is not None:
        return kernel(q, k, v, batch.positions, rope.cos_table, rope.sin_table, k_cache,
                      v_cache, batch.slot_mapping), None
    q = rope.apply(q)
    k = rope.apply(k)
    k_cache[batch.slot_mapping] = k
    v_cache[batch.slot_mapping] = v
    return q, k


def attend_packed(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  batch: StepBatch) -> torch.Tensor:
    """Masked attention of packed queries over the slot buffer (dense reference path).

    q: (T, Hq, D) already rotated; caches (S_total, Hkv, D). Returns (T, Hq, D).
    """
    n = batch.kv_limit
    keys = k_cache[:n].transpose(0, 1)[None]        # (1, Hkv, S, D)
    values = v_cache[:n].transpose(0, 1)[None]
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], keys, values,
                                         attn_mask=batch.attn_mask[:, :n],
                                         enable_gqa=keys.shape[1] != q.shape[1])
    return out[0].transpose(0, 1)                   # (T, Hq, D)


def attend_segments(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    batch: StepBatch, k: torch.Tensor | None = None,
                    v: torch.Tensor | None = None, kernel=None) -> torch.Tensor:
    """Work-proportional attention (segments layout of ``StepBatch``).

    Each prefill block attends to its own rows only (no history; its rotated ``k`` / ``v`` when
    given, else read back from the cache), causally or, with ``batch.prefill_prefix``, under
    ``prefill_allowed`` (bidirectional within the prefix); each segment gathers its own request's K
    slots and attends under its small mask, all segments in one batched call.
    q: (T, Hq, D) already rotated; caches (slots, Hkv, D). Returns (T, Hq, D).
    ``kernel`` (None = the gather + SDPA below): the segments in one launch reading the slots
    in place, with the contract of ``kernels/segment_attention.segment_attention_ref``.
    Every SDPA call is 4-D: on CPU the 3-D form takes a much slower kernel.
    """
    lp = batch.num_prefill
    num_heads, head_dim = q.shape[1], q.shape[2]
    gqa = k_cache.shape[1] != num_heads
    parts = []
    if lp:
        if k is None:
            slots = batch.slot_mapping[:lp]
            k, v = k_cache.index_select(0, slots), v_cache.index_select(0, slots)
        blocks = batch.prefill_blocks
        prefix = batch.prefill_prefix
        biases = batch.prefill_bias
        if len(set(blocks)) == 1:
            # Equal blocks (one prefill, or padded ones): one batched call, a block per batch.
            shape = (len(blocks), blocks[0], -1, head_dim)
            mask = None if prefix is None else (
                biases if biases is not None else prefill_allowed(blocks[0], prefix)[:, None])
            out = F.scaled_dot_product_attention(
                q[:lp].view(shape).transpose(1, 2), k[:lp].view(shape).transpose(1, 2),
                v[:lp].view(shape).transpose(1, 2), attn_mask=mask, is_causal=mask is None,
                enable_gqa=gqa)
            parts.append(out.transpose(1, 2).reshape(lp, num_heads, head_dim))
        else:
            start = 0
            for b, block in enumerate(blocks):
                rows = slice(start, start + block)
                mask = None if prefix is None else (
                    biases[b] if biases is not None else prefill_allowed(block, prefix[b:b + 1]))
                out = F.scaled_dot_product_attention(
                    q[rows].transpose(0, 1)[None], k[rows].transpose(0, 1)[None],
                    v[rows].transpose(0, 1)[None], attn_mask=mask, is_causal=mask is None,
                    enable_gqa=gqa)
                parts.append(out[0].transpose(0, 1))                          # (Lb, Hq, D)
                start += block
    has_segments = batch.kv_index is not None and batch.kv_index.shape[0] > 0
    if has_segments and kernel is not None:
        parts.append(kernel(q[lp:], k_cache, v_cache, batch.kv_index, batch.seg_mask))
    elif has_segments:
        num_segments, num_rows = batch.seg_mask.shape[:2]
        num_cols = batch.kv_index.shape[1]
        queries = q[lp:].view(num_segments, num_rows, num_heads, head_dim).transpose(1, 2)
        flat = batch.kv_index.view(-1)
        kv_shape = (num_segments, num_cols, k_cache.shape[1], head_dim)
        keys = k_cache.index_select(0, flat).view(kv_shape).transpose(1, 2)  # (S, Hkv, K, D)
        values = v_cache.index_select(0, flat).view(kv_shape).transpose(1, 2)
        mask = batch.seg_bias if batch.seg_bias is not None else batch.seg_mask[:, None]
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask,
                                             enable_gqa=gqa)                # (S, Hq, Q, D)
        parts.append(out.transpose(1, 2).reshape(num_segments * num_rows, num_heads,
                                                 head_dim))
    return torch.cat(parts) if len(parts) > 1 else parts[0]
