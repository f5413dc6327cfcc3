"""Llama building blocks shared by the verifier and the EAGLE draft head.

The new tokens of a packed step (one or many requests, prefill / decode / draft tree) are
written into a slot-addressed KV buffer, then each query attends to the slots its mask allows:
either through a dense (T x slots) mask (``attend_packed``, the reference) or per segment over
only its own request's slots (``attend_segments``, the engine's work-proportional path). The
same code therefore serves AR decoding (slots = positions), the unified KV ring (slots anywhere
in the ring, with wrap-around) and tree verification (tree mask). Conventions follow Hugging
Face Llama (rotate-half RoPE with cos/sin tables computed in float32) so logits match
``transformers.LlamaForCausalLM`` on the same weights.

Inside a layer, sub-modules are called through ``forward`` and projections through
``F.linear`` on their weights: the same operations as ``module(x)`` without
``nn.Module.__call__`` (hook dispatch), which costs more than half of a small matrix product
on a CPU, where the engine's forwards on small models are bound by per-operation overhead (a
draft forward on the embedded model: about a tenth less time). Hooks on a layer's sub-modules
therefore do not run (the layer's own hooks do).
"""
from __future__ import annotations

from dataclasses import dataclass
import torch
import torch.nn.functional as F
from torch import nn

from ..config import LlamaConfig


class RMSNorm(nn.Module):
    """Llama's RMSNorm. ``kernel`` (None = plain torch): a fused implementation with the
    contract of ``kernels/rms_norm.rms_norm_ref``, passed per call by the runner that owns the
    choice (never stored on the module, so runners sharing a model cannot change each other's
    arithmetic); used for inference only (it has no backward): plain torch whenever gradients
    are enabled."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def add_and_norm(self, x: torch.Tensor, delta: torch.Tensor, kernel=None):
        """``(x + delta, norm(x + delta))``: the residual add and the next norm, one launch
        with the kernel."""
        if kernel is not None and not torch.is_grad_enabled():
            return kernel(x, self.weight, self.eps, delta)
        x = x + delta
        return x, self.forward(x)

    def forward(self, x: torch.Tensor, kernel=None) -> torch.Tensor:
        if kernel is not None and not torch.is_grad_enabled():
            return kernel(x, self.weight, self.eps)
        # Same arithmetic as HF: normalise in float32 (or higher), then scale in input dtype.
        dtype = x.dtype
        if dtype in (torch.float16, torch.bfloat16):
            h = x.to(torch.float32)
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
            return self.weight * h.to(dtype)
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


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

    Attention comes in one of two layouts:
    - dense (the reference): ``attn_mask`` (T, S) bool, query t may read slot s of the first
      ``kv_limit`` slots. Cost grows with every slot of the buffer.
    - segments (the engine's path, engine/step_inputs.py): rows 0 .. num_prefill-1 are fresh
      requests' causal prompts, one block per request of ``prefill_blocks`` rows each, each
      attending to its own rows only; the remaining rows form ``kv_index.shape[0]`` segments of
      ``seg_mask.shape[1]`` rows each; segment s reads only the slots ``kv_index[s]`` (S, K)
      under ``seg_mask`` (S, Q, K) bool. Cost grows with the work in flight.
    copy_src/copy_dst: optional (M,) KV compaction applied at the start of every layer
      (``cache[dst] = cache[src]``, gathered first), before the step's own writes.
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

    @property
    def num_prefill(self) -> int:
        """Rows of all prefill blocks together."""
        return sum(self.prefill_blocks)


def combined_rope_table(cos_table: torch.Tensor, sin_table: torch.Tensor) -> torch.Tensor:
    """(max_positions, 2D): each position's cos row, then its sin row with the first half
    negated (what ``RopeRows.apply`` multiplies ``roll(x)`` by): one gather per forward."""
    half = sin_table.shape[-1] // 2
    return torch.cat([cos_table, -sin_table[:, :half], sin_table[:, half:]], dim=-1)


class RopeTablePair(tuple):
    """``(cos_table, sin_table)``, plus ``combined`` (``combined_rope_table``), built with
    them once."""

    combined: torch.Tensor


class RopeTables:
    """cos/sin tables of one Llama config, built once per (dtype, device) and kept (the
    verifier and the draft head each own one)."""

    def __init__(self, cfg: LlamaConfig):
        self.head_dim, self.max_positions, self.theta = (cfg.head_dim,
                                                         cfg.max_position_embeddings,
                                                         cfg.rope_theta)
        self._tables: tuple[torch.Tensor, torch.Tensor] | None = None

    def get(self, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
        tables = self._tables
        if tables is None or tables[0].dtype != dtype or tables[0].device != torch.device(device):
            tables = RopeTablePair(rope_tables(self.head_dim, self.max_positions, self.theta,
                                               dtype, device))
            tables.combined = combined_rope_table(*tables)
            self._tables = tables
        return tables


@dataclass
class RopeRows:
    """cos/sin tables (max_positions, D) and their rows at the step's positions (T, D),
    gathered once per forward instead of once per layer."""

    cos_table: torch.Tensor
    sin_table: torch.Tensor
    cos: torch.Tensor           # (T, 1, D)
    sin_signed: torch.Tensor    # (T, 1, D): sin with its first half negated

    @classmethod
    def gather(cls, tables: tuple[torch.Tensor, torch.Tensor], positions: torch.Tensor):
        """One row gather of the combined table (``RopeTables.get``'s, else built here)."""
        cos_table, sin_table = tables
        combined = getattr(tables, 'combined', None)
        if combined is None:
            combined = combined_rope_table(cos_table, sin_table)
        rows = combined.index_select(0, positions)[:, None, :]        # (T, 1, 2D)
        dim = cos_table.shape[-1]
        return cls(cos_table, sin_table, rows[..., :dim], rows[..., dim:])

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """``apply_rope`` in four ops instead of six: rotate_half(x) * sin equals
        roll(x, D/2) * sin_signed bit for bit ((-a) * b and a * (-b) round alike)."""
        return x * self.cos + x.roll(x.shape[-1] // 2, dims=-1) * self.sin_signed


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
                    v: torch.Tensor | None = None) -> torch.Tensor:
    """Work-proportional attention (segments layout of ``StepBatch``).

    Each prefill block attends causally to its own rows only (no history; its rotated ``k`` /
    ``v`` when given, else read back from the cache); each segment gathers its own request's K
    slots and attends under its small mask, all segments in one batched call.
    q: (T, Hq, D) already rotated; caches (slots, Hkv, D). Returns (T, Hq, D).
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
        if len(set(blocks)) == 1:
            # Equal blocks (one prefill, or padded ones): one batched call, a block per batch.
            shape = (len(blocks), blocks[0], -1, head_dim)
            out = F.scaled_dot_product_attention(
                q[:lp].view(shape).transpose(1, 2), k[:lp].view(shape).transpose(1, 2),
                v[:lp].view(shape).transpose(1, 2), is_causal=True, enable_gqa=gqa)
            parts.append(out.transpose(1, 2).reshape(lp, num_heads, head_dim))
        else:
            start = 0
            for block in blocks:
                rows = slice(start, start + block)
                out = F.scaled_dot_product_attention(
                    q[rows].transpose(0, 1)[None], k[rows].transpose(0, 1)[None],
                    v[rows].transpose(0, 1)[None], is_causal=True, enable_gqa=gqa)
                parts.append(out[0].transpose(0, 1))                          # (Lb, Hq, D)
                start += block
    if batch.kv_index is not None and batch.kv_index.shape[0]:
        num_segments, num_rows = batch.seg_mask.shape[:2]
        num_cols = batch.kv_index.shape[1]
        queries = q[lp:].view(num_segments, num_rows, num_heads, head_dim).transpose(1, 2)
        flat = batch.kv_index.view(-1)
        kv_shape = (num_segments, num_cols, k_cache.shape[1], head_dim)
        keys = k_cache.index_select(0, flat).view(kv_shape).transpose(1, 2)  # (S, Hkv, K, D)
        values = v_cache.index_select(0, flat).view(kv_shape).transpose(1, 2)
        out = F.scaled_dot_product_attention(queries, keys, values,
                                             attn_mask=batch.seg_mask[:, None],
                                             enable_gqa=gqa)                # (S, Hq, Q, D)
        parts.append(out.transpose(1, 2).reshape(num_segments * num_rows, num_heads,
                                                 head_dim))
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def _linear(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``linear(x)`` without ``nn.Module.__call__`` (the same ``F.linear``)."""
    return F.linear(x, linear.weight, linear.bias)


class FusedLinears:
    """Several bias-free ``nn.Linear`` of one input as one matrix product (inference only).

    ``fuse`` copies the weights into one (sum of out, in) tensor and re-points each linear's
    weight at its rows (views: parameter names, ``state_dict`` and in-place updates keep
    working, and no memory is duplicated). ``__call__`` returns the per-linear outputs, or None
    when the fusion no longer holds (gradients enabled, or a weight was replaced, e.g. moved
    or re-assigned) so the caller runs the separate linears: a stale copy is never used.
    Pays on a GPU (fewer launches, wider products); on a CPU the split outputs cost as much
    as they save, so ``ModelRunner`` fuses on CUDA only.
    """

    def __init__(self, linears: list[nn.Linear]):
        self.linears = linears
        self.weight = torch.cat([lin.weight.detach() for lin in linears], dim=0)
        self.sizes = [lin.weight.shape[0] for lin in linears]
        start = 0
        for lin, size in zip(linears, self.sizes):
            lin.weight = nn.Parameter(self.weight[start:start + size],
                                      requires_grad=lin.weight.requires_grad)
            start += size

    def __call__(self, x: torch.Tensor):
        if torch.is_grad_enabled():
            return None
        start = 0
        for lin, size in zip(self.linears, self.sizes):
            if lin.weight.data_ptr() != self.weight[start:].data_ptr():
                return None
            start += size
        return F.linear(x, self.weight).split(self.sizes, dim=-1)


def fuse_projections(module: nn.Module) -> None:
    """Fuse q/k/v and gate/up projections of every Llama layer in ``module`` (inference)."""
    for sub in module.modules():
        if isinstance(sub, LlamaAttention):
            sub.fused = FusedLinears([sub.q_proj, sub.k_proj, sub.v_proj])
        elif isinstance(sub, SwiGLU):
            sub.fused = FusedLinears([sub.gate_proj, sub.up_proj])


class LlamaAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, d
        self.q_proj = nn.Linear(h, cfg.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * d, h, bias=False)
        self.fused: FusedLinears | None = None

    def forward(self, x, batch: StepBatch, rope, k_cache, v_cache, kernel=None):
        t = x.shape[0]                                            # x: (T, H)
        qkv = self.fused(x) if self.fused is not None else None
        q, k, v = qkv if qkv is not None else (
            _linear(self.q_proj, x), _linear(self.k_proj, x), _linear(self.v_proj, x))
        q = q.reshape(t, self.num_heads, self.head_dim)
        k = k.reshape(t, self.num_kv_heads, self.head_dim)
        v = v.reshape(t, self.num_kv_heads, self.head_dim)
        q, k = write_kv_and_rope(q, k, v, batch, rope, k_cache, v_cache, kernel)
        if batch.attn_mask is not None:
            out = attend_packed(q, k_cache, v_cache, batch)
        else:
            out = attend_segments(q, k_cache, v_cache, batch, k, v if k is not None else None)
        return _linear(self.o_proj, out.reshape(t, -1))


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.fused: FusedLinears | None = None

    def forward(self, x):
        gate_up = self.fused(x) if self.fused is not None else None
        gate, up = gate_up if gate_up is not None else (_linear(self.gate_proj, x),
                                                        _linear(self.up_proj, x))
        return _linear(self.down_proj, F.silu(gate) * up)


class LlamaDecoderLayer(nn.Module):
    """Pre-norm Llama block. ``has_input_norm=False`` gives EAGLE's first draft layer."""

    def __init__(self, cfg: LlamaConfig, has_input_norm: bool = True):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps) \
            if has_input_norm else None
        self.self_attn = LlamaAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x, batch: StepBatch, rope, k_cache, v_cache, kernel=None,
                norm_kernel=None):
        """``kernel``: the fused RoPE + KV write, ``norm_kernel``: the fused (residual add +)
        RMSNorm (None = plain torch each)."""
        # Sub-modules through ``forward``: see the module docstring.
        h = self.input_layernorm.forward(x, norm_kernel) \
            if self.input_layernorm is not None else x
        x, h = self.post_attention_layernorm.add_and_norm(
            x, self.self_attn.forward(h, batch, rope, k_cache, v_cache, kernel), norm_kernel)
        return x + self.mlp.forward(h)
