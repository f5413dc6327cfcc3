"""Fused RoPE + KV ring write: rotate q and k at each token's logical position, store k and v.

One packed step holds tokens of several requests along one axis T (ActionFlow's cross-request
packing). Each token is rotated at its LOGICAL position inside its own request and its K/V go
to its PHYSICAL ring slot, so positions and slot_mapping are independent (T,) index vectors.
RoPE follows Hugging Face Llama (non-interleaved, ``rotate_half``):

    x_rot = x * cos_table[pos] + rotate_half(x) * sin_table[pos]
    rotate_half(x) = cat([-x[..., D/2:], x[..., :D/2]], -1)

Layout (llm.c ``dev/cuda`` style, one file per kernel): ``rope_kv_write_ref`` (plain torch, the
oracle), ``rope_kv_write_triton`` (the kernel launch, no checks) and ``rope_kv_write`` (the
validating wrapper that the engine calls). The store follows nano-vllm's ``store_kvcache``,
fused here with the rotation so that rotated k never round-trips through memory.
"""
import torch

from ._triton_util import (HAS_TRITON, INDEX_DTYPES, LazyJit, check_can_launch,
                           check_index_values, check_tensor, compute_dtype, next_power_of_2, tl)

FLOAT_ARGS = ('q', 'k', 'v', 'cos_table', 'sin_table', 'k_cache', 'v_cache')


def _rotate(x, cos, sin):
    # x: (T, H, D); cos, sin: (T, 1, D) broadcast over heads
    half = x.shape[-1] // 2
    rotated_half = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated_half * sin


def rope_kv_write_ref(q, k, v, positions, cos_table, sin_table, k_cache, v_cache, slot_mapping):
    """Plain-torch reference. Writes k_cache/v_cache in place and returns rotated q.

    q: (T, Hq, D); k, v: (T, Hkv, D); positions, slot_mapping: (T,) int; cos_table, sin_table:
    (max_pos, D); k_cache, v_cache: (S, Hkv, D). Arithmetic runs in float64 for float64 inputs
    and in float32 otherwise (one rounding to bf16/fp16 at the end, like the kernel).
    """
    work_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    pos = positions.long()
    cos = cos_table[pos].to(work_dtype)[:, None, :]  # (T, 1, D)
    sin = sin_table[pos].to(work_dtype)[:, None, :]  # (T, 1, D)
    q_rot = _rotate(q.to(work_dtype), cos, sin).to(q.dtype)  # (T, Hq, D)
    k_rot = _rotate(k.to(work_dtype), cos, sin)  # (T, Hkv, D)
    slots = slot_mapping.long()
    k_cache[slots] = k_rot.to(k_cache.dtype)
    v_cache[slots] = v.to(v_cache.dtype)
    return q_rot


if HAS_TRITON:
    def _rope_kv_write_body(
            q_ptr, k_ptr, v_ptr, pos_ptr, cos_ptr, sin_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
            q_out_ptr,
            stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
            stride_cos, stride_sin, stride_kcs, stride_kch, stride_vcs, stride_vch,
            stride_ot, stride_oh,
            num_q_heads, num_kv_heads, num_q_blocks,
            HALF_D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF_D: tl.constexpr,
            COMPUTE_DTYPE: tl.constexpr):
        # Grid (T, num_q_blocks + cdiv(Hkv, BLOCK_H)), num_q_blocks = cdiv(Hq, BLOCK_H): program
        # (t, g) handles one token and one group of BLOCK_H heads; groups below num_q_blocks are
        # q heads, the rest k/v heads. (Only core tl builtins are used: library functions such as
        # tl.cdiv are jitted when triton is imported, which breaks the interpreter when
        # TRITON_INTERPRET is switched on after that import.)
        # Each head row is processed as two halves [0, D/2) and [D/2, D), which is exactly the
        # pairing rotate_half makes, so no data moves across lanes.
        t = tl.program_id(0).to(tl.int64)
        group = tl.program_id(1)
        pos = tl.load(pos_ptr + t).to(tl.int64)
        d = tl.arange(0, BLOCK_HALF_D)
        d_mask = d < HALF_D
        # Whole table rows are read (not just the first half) so that the kernel matches the
        # reference formula for any table, not only ones with duplicated halves.
        cos_row = cos_ptr + pos * stride_cos
        sin_row = sin_ptr + pos * stride_sin
        cos_lo = tl.load(cos_row + d, mask=d_mask, other=0).to(COMPUTE_DTYPE)[None, :]
        cos_hi = tl.load(cos_row + HALF_D + d, mask=d_mask, other=0).to(COMPUTE_DTYPE)[None, :]
        sin_lo = tl.load(sin_row + d, mask=d_mask, other=0).to(COMPUTE_DTYPE)[None, :]
        sin_hi = tl.load(sin_row + HALF_D + d, mask=d_mask, other=0).to(COMPUTE_DTYPE)[None, :]
        if group < num_q_blocks:
            h = group * BLOCK_H + tl.arange(0, BLOCK_H)
            mask = (h < num_q_heads)[:, None] & d_mask[None, :]
            src = q_ptr + t * stride_qt + h[:, None] * stride_qh + d[None, :]
            x_lo = tl.load(src, mask=mask, other=0).to(COMPUTE_DTYPE)
            x_hi = tl.load(src + HALF_D, mask=mask, other=0).to(COMPUTE_DTYPE)
            dst = q_out_ptr + t * stride_ot + h[:, None] * stride_oh + d[None, :]
            out_ty = q_out_ptr.dtype.element_ty
            tl.store(dst, (x_lo * cos_lo - x_hi * sin_lo).to(out_ty), mask=mask)
            tl.store(dst + HALF_D, (x_hi * cos_hi + x_lo * sin_hi).to(out_ty), mask=mask)
        else:
            slot = tl.load(slot_ptr + t).to(tl.int64)
            h = (group - num_q_blocks) * BLOCK_H + tl.arange(0, BLOCK_H)
            mask = (h < num_kv_heads)[:, None] & d_mask[None, :]
            src = k_ptr + t * stride_kt + h[:, None] * stride_kh + d[None, :]
            x_lo = tl.load(src, mask=mask, other=0).to(COMPUTE_DTYPE)
            x_hi = tl.load(src + HALF_D, mask=mask, other=0).to(COMPUTE_DTYPE)
            dst = k_cache_ptr + slot * stride_kcs + h[:, None] * stride_kch + d[None, :]
            cache_ty = k_cache_ptr.dtype.element_ty
            tl.store(dst, (x_lo * cos_lo - x_hi * sin_lo).to(cache_ty), mask=mask)
            tl.store(dst + HALF_D, (x_hi * cos_hi + x_lo * sin_hi).to(cache_ty), mask=mask)
            # v is stored unrotated; same dtype in and out, so no conversion
            src = v_ptr + t * stride_vt + h[:, None] * stride_vh + d[None, :]
            dst = v_cache_ptr + slot * stride_vcs + h[:, None] * stride_vch + d[None, :]
            tl.store(dst, tl.load(src, mask=mask, other=0), mask=mask)
            tl.store(dst + HALF_D, tl.load(src + HALF_D, mask=mask, other=0), mask=mask)

    _rope_kv_write_kernel = LazyJit(_rope_kv_write_body)


def default_block_h(num_q_heads: int, num_kv_heads: int, head_dim: int) -> int:
    """Heads per program: enough to give a program ~1K elements, never more than the heads."""
    return min(next_power_of_2(max(num_q_heads, num_kv_heads)),
               max(1, 1024 // next_power_of_2(head_dim)))


def rope_kv_write_triton(q, k, v, positions, cos_table, sin_table, k_cache, v_cache,
                         slot_mapping, *, block_h=None, num_warps=4):
    """Triton launch with the contract of ``rope_kv_write_ref``; inputs are NOT checked.

    Requires last-dim stride 1 on every float tensor and contiguous index vectors (the wrapper
    ``rope_kv_write`` checks all of this). ``block_h`` (a power of two) and ``num_warps`` are the
    tuning knobs swept by bench/kernels_sweep.py.
    """
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    q_rot = torch.empty((num_tokens, num_q_heads, head_dim), dtype=q.dtype, device=q.device)
    if num_tokens == 0:
        return q_rot
    if block_h is None:
        block_h = default_block_h(num_q_heads, num_kv_heads, head_dim)
    half_d = head_dim // 2
    num_q_blocks = -(-num_q_heads // block_h)
    num_groups = num_q_blocks + -(-num_kv_heads // block_h)
    _rope_kv_write_kernel[(num_tokens, num_groups)](
        q, k, v, positions, cos_table, sin_table, k_cache, v_cache, slot_mapping, q_rot,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        cos_table.stride(0), sin_table.stride(0),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        q_rot.stride(0), q_rot.stride(1),
        num_q_heads, num_kv_heads, num_q_blocks,
        HALF_D=half_d, BLOCK_H=block_h, BLOCK_HALF_D=next_power_of_2(half_d),
        COMPUTE_DTYPE=compute_dtype(q.dtype), num_warps=num_warps)
    return q_rot


def _check_args(q, k, v, positions, cos_table, sin_table, k_cache, v_cache, slot_mapping):
    args = dict(q=q, k=k, v=v, positions=positions, cos_table=cos_table, sin_table=sin_table,
                k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    for name in ('q', 'k', 'v', 'k_cache', 'v_cache'):
        check_tensor(name, args[name], 3)
    for name in ('cos_table', 'sin_table'):
        check_tensor(name, args[name], 2)
    for name in ('positions', 'slot_mapping'):
        check_tensor(name, args[name], 1)
    # dtypes: one floating dtype for every float tensor, int64/int32 indices
    if not q.dtype.is_floating_point:
        raise ValueError(f'q must be a floating tensor, got {q.dtype}')
    for name in FLOAT_ARGS:
        if args[name].dtype != q.dtype:
            raise ValueError(f'{name} dtype {args[name].dtype} differs from q dtype {q.dtype}')
    for name in ('positions', 'slot_mapping'):
        if args[name].dtype not in INDEX_DTYPES:
            raise ValueError(f'{name} must be int64 or int32, got {args[name].dtype}')
    for name, x in args.items():
        if x.device != q.device:
            raise ValueError(f'{name} is on {x.device} but q is on {q.device}')
    # shapes
    num_tokens, _, head_dim = q.shape
    if head_dim == 0 or head_dim % 2:
        raise ValueError(f'q head_dim must be even and > 0 for rotate_half, got {head_dim}')
    if k.shape[0] != num_tokens or k.shape[2] != head_dim:
        raise ValueError(f'k shape {tuple(k.shape)} must be (T={num_tokens}, Hkv, D={head_dim})')
    if v.shape != k.shape:
        raise ValueError(f'v shape {tuple(v.shape)} must equal k shape {tuple(k.shape)}')
    for name in ('positions', 'slot_mapping'):
        if args[name].shape[0] != num_tokens:
            raise ValueError(f'{name} must have T={num_tokens} entries, got {args[name].shape[0]}')
    if cos_table.shape[1] != head_dim:
        raise ValueError(f'cos_table shape {tuple(cos_table.shape)} must be (max_pos, {head_dim})')
    if sin_table.shape != cos_table.shape:
        raise ValueError(f'sin_table shape {tuple(sin_table.shape)} must equal cos_table shape')
    if k_cache.shape[1:] != k.shape[1:]:
        raise ValueError(f'k_cache shape {tuple(k_cache.shape)} must be (S, {k.shape[1]}, '
                         f'{head_dim})')
    if v_cache.shape != k_cache.shape:
        raise ValueError(f'v_cache shape {tuple(v_cache.shape)} must equal k_cache shape')
    # strides: the kernel addresses rows by stride and the last dim as contiguous lanes
    for name in FLOAT_ARGS:
        if args[name].stride(-1) != 1:
            raise ValueError(f'{name} must have last-dim stride 1, got strides '
                             f'{args[name].stride()}')
    for name in ('positions', 'slot_mapping'):
        if not args[name].is_contiguous():
            raise ValueError(f'{name} must be contiguous')
    if k_cache.numel() and k_cache.data_ptr() == v_cache.data_ptr():
        raise ValueError('k_cache and v_cache must not share memory')


def rope_kv_write(q, k, v, positions, cos_table, sin_table, k_cache, v_cache, slot_mapping, *,
                  use_triton=False, check_indices=True):
    """Validated fused RoPE + KV write; returns rotated q (T, Hq, D), writes the caches.

    Shapes, dtypes, devices and strides are always checked (host-side metadata, free).
    ``check_indices`` also checks positions < max_pos and slot_mapping in [0, S) and unique; it
    reads the indices back (a device->host sync), so a CUDA-graph steady state whose indices
    come from already-validated host bookkeeping may turn it off. ``use_triton`` selects the
    Triton kernel (CUDA tensors, or any tensors under TRITON_INTERPRET=1); else the reference.
    """
    _check_args(q, k, v, positions, cos_table, sin_table, k_cache, v_cache, slot_mapping)
    if check_indices:
        check_index_values('positions', positions, cos_table.shape[0], is_unique=False)
        check_index_values('slot_mapping', slot_mapping, k_cache.shape[0], is_unique=True)
    if use_triton:
        check_can_launch(q.device)
        return rope_kv_write_triton(q, k, v, positions, cos_table, sin_table, k_cache, v_cache,
                                    slot_mapping)
    return rope_kv_write_ref(q, k, v, positions, cos_table, sin_table, k_cache, v_cache,
                             slot_mapping)
