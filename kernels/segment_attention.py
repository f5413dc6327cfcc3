"""Segment attention: each segment's query rows attend to its own KV slots, read in place.

The "segments" layout of a packed step (``StepBatch``, ``models/attention.attend_segments``): the
step has ``S`` segments of ``Q`` query rows each (q rows ``s*Q .. s*Q + Q - 1`` belong to
segment s). Segment s may read only the ``K`` cache slots ``kv_index[s, :]``, under the boolean
mask ``seg_mask[s, row, col]`` (True = may attend). Segments may share slots (a request's
history is read by all of its segments). Per q head h (kv head ``h // (Hq // Hkv)``, GQA):

    out[s*Q + i, h] = sum_j softmax_j(scale * q[s*Q + i, h] . k_cache[kv_index[s, j], h_kv]
                                      over the j with seg_mask[s, i, j])
                      * v_cache[kv_index[s, j], h_kv]

``attend_segments`` computes this today by gathering K and V with ``index_select`` into
(S, K, Hkv, D) copies and calling SDPA with the mask. This kernel reads every K/V row straight
from the slot-addressed caches instead: no gathered copies (for each of K and V, one write and
one read of S*K*Hkv*D elements per layer saved), and one launch instead of two gathers + SDPA
+ the output copy.

Kernel (flash-attention style, online softmax): grid (S, Hq, cdiv(Q, BLOCK_M)); a program loads
its BLOCK_M query rows of one head, walks the K columns in blocks of BLOCK_N (slot indices, then
K rows at those slots, scores = q @ k^T * scale, the mask, a running max / sum / accumulator,
then V rows and acc += p @ v), and divides once at the end. All arithmetic runs in float64 for
float64 inputs and float32 otherwise; bf16/fp16 are rounded once, at the store. The two
products are ``tl.dot`` for every dtype but float64, where they are broadcast products summed
with ``tl.reduce`` (``use_dot``): some Triton versions cannot compile a float64 ``tl.dot`` for
CUDA (3.6 picks a dot-operand layout that its fp64 MMA lowering rejects, "Currently fp64 don't
support largeK MMA"), and float64 is a test and reference dtype whose speed does not matter.
``bench/kernels_compile_check.py`` compiles the kernel ahead of time for sm_80 / sm_90 at the
default launches (no GPU needed) and reports registers and spills.

Differences from the reference: the order of the sums (block by block with rescaling, and
inside tl.dot or tl.reduce), and on CUDA Triton's fast exp and, for bf16/fp16 inputs, TF32
tensor-core products (see ``dot_precision``: q @ k^T stays exact, the probabilities of p @ v
keep 10 mantissa bits, an error of at most ~2^-11 * max|v| per output, below one bf16 ulp of
values of order one). A query row whose mask row is all False has no defined softmax (SDPA
returns NaN); here and in the reference its output is zeros (the engine never builds one:
every row, padding rows included, attends to at least one slot, but the kernel must not emit
NaN).

Layout as in rope_kv_write.py: ``segment_attention_ref`` (plain torch, the oracle),
``segment_attention_triton`` (the launch, no checks) and ``segment_attention`` (the validating
wrapper).
"""
import math

import torch

from ._triton_util import (HAS_TRITON, INDEX_DTYPES, LazyJit, check_can_launch,
                           check_index_values, check_tensor, compute_dtype, is_interpret_mode,
                           next_power_of_2, tl, triton)

MIN_DOT_BLOCK = 16      # tl.dot needs every dimension >= 16
# float64 (no tl.dot): at most this many elements in a (BLOCK_M, BLOCK_D, BLOCK_N) product tile
FLOAT64_TILE = 4096


def segment_attention_ref(q, k_cache, v_cache, kv_index, seg_mask, scale=None):
    """Plain torch, explicit softmax (not SDPA, so that it is an independent oracle).

    q: (S*Q, Hq, D); k_cache, v_cache: (num_slots, Hkv, D); kv_index: (S, K) int64/int32;
    seg_mask: (S, Q, K) bool. Returns (S*Q, Hq, D) in q's dtype; ``scale`` defaults to
    1/sqrt(D). Arithmetic in float64 for float64 q, float32 otherwise, rounded once at the end.
    A row with no allowed column gives zeros.
    """
    work_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    num_segments, num_rows, num_cols = seg_mask.shape
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    group = num_q_heads // k_cache.shape[1]
    if num_cols == 0:       # every row reads nothing (and amax refuses an empty dim)
        return torch.zeros((num_segments * num_rows, num_q_heads, head_dim), dtype=q.dtype,
                           device=q.device)
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    queries = q.to(work_dtype).reshape(num_segments, num_rows, num_q_heads, head_dim)
    slots = kv_index.long()
    # (S, K, Hkv, D) -> (S, K, Hq, D): q head h reads kv head h // group
    keys = k_cache[slots].to(work_dtype).repeat_interleave(group, dim=2)
    values = v_cache[slots].to(work_dtype).repeat_interleave(group, dim=2)
    scores = torch.einsum('sqhd,skhd->shqk', queries, keys) * scale       # (S, Hq, Q, K)
    allowed = seg_mask[:, None]                                           # (S, 1, Q, K)
    scores = scores.masked_fill(~allowed, float('-inf'))
    row_max = scores.amax(-1, keepdim=True)
    row_max = torch.where(allowed.any(-1, keepdim=True), row_max, torch.zeros_like(row_max))
    weights = torch.exp(scores - row_max)                                 # masked -> exactly 0
    denom = weights.sum(-1, keepdim=True)
    probs = weights / torch.where(denom == 0, torch.ones_like(denom), denom)
    out = torch.einsum('shqk,skhd->sqhd', probs, values)                  # (S, Q, Hq, D)
    return out.reshape(num_segments * num_rows, num_q_heads, head_dim).to(q.dtype)


if HAS_TRITON:
    # Reductions through tl.reduce, not tl.max / tl.sum: Triton's library functions are jitted
    # for the mode in force when triton was imported, so calling them fails in the CPU
    # interpreter when TRITON_INTERPRET is switched on later (see rms_norm.py). The combine
    # functions are Triton's own (private) _elementwise_max / _sum_combine: the interpreter
    # recognises them and reduces with numpy (it never calls them), whereas with any other
    # combine it calls the Python function once per element, ~100x slower on a
    # (BLOCK_M, BLOCK_N) tile. Our own combines stand in if a Triton version drops the names.
    @triton.jit
    def _add(a, b):
        return a + b

    @triton.jit
    def _maximum(a, b):
        return tl.maximum(a, b)

    _max_combine = getattr(tl.standard, '_elementwise_max', None) or _maximum
    _sum_combine = getattr(tl.standard, '_sum_combine', None) or _add

    def _segment_attention_body(
            q_ptr, k_cache_ptr, v_cache_ptr, index_ptr, mask_ptr, out_ptr,
            stride_qt, stride_qh, stride_kcs, stride_kch, stride_vcs, stride_vch,
            stride_is, stride_ic, stride_ms, stride_mq, stride_mc, stride_ot, stride_oh,
            num_rows, num_cols,
            HEAD_DIM: tl.constexpr, GROUP: tl.constexpr, SCALE: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
            COMPUTE_DTYPE: tl.constexpr, USE_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr,
            CONST_NUM_COLS: tl.constexpr):
        # Program (s, h, m): query rows m*BLOCK_M .. of segment s, q head h. Only core tl
        # builtins (no tl.zeros / tl.max / tl.sum / tl.cdiv; see the note above _add).
        # The mask arrives as uint8 (a view of the bool tensor).
        seg = tl.program_id(0).to(tl.int64)
        head = tl.program_id(1)
        kv_head = (head // GROUP).to(tl.int64)
        rows = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)        # (BLOCK_M,)
        row_mask = rows < num_rows
        d = tl.arange(0, BLOCK_D)
        d_mask = d < HEAD_DIM
        q_rows = seg * num_rows + rows.to(tl.int64)
        q_ptrs = q_ptr + q_rows[:, None] * stride_qt + head * stride_qh + d[None, :]
        q_tile_mask = row_mask[:, None] & d_mask[None, :]
        q = tl.load(q_ptrs, mask=q_tile_mask, other=0).to(COMPUTE_DTYPE)  # (BLOCK_M, BLOCK_D)
        # A constexpr scale materialised in the compute dtype: a runtime float argument (and
        # a bare Python float in an expression) is float32, which would round the float64 path.
        scale = tl.full([], SCALE, COMPUTE_DTYPE)
        m_i = tl.full([BLOCK_M], float('-inf'), COMPUTE_DTYPE)           # running row max
        l_i = tl.full([BLOCK_M], 0.0, COMPUTE_DTYPE)                     # running row sum
        acc = tl.full([BLOCK_M, BLOCK_D], 0.0, COMPUTE_DTYPE)            # running p @ v
        mask_row_ptrs = mask_ptr + seg * stride_ms + rows.to(tl.int64)[:, None] * stride_mq
        # The loop bound: the runtime num_cols, or the same count as a constant when the launch
        # passes one (the CPU interpreter; see kernel_constants). Written inline: Triton 3.6's
        # interpreter turns every value assigned to a name into a tensor, the constant included.
        for start in range(0, num_cols if CONST_NUM_COLS is None else CONST_NUM_COLS, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)                         # (BLOCK_N,)
            col_mask = cols < num_cols
            slots = tl.load(index_ptr + seg * stride_is + cols.to(tl.int64) * stride_ic,
                            mask=col_mask, other=0).to(tl.int64)
            # K^T tile (BLOCK_D, BLOCK_N), loaded transposed by address, straight from the cache
            kt_ptrs = (k_cache_ptr + slots[None, :] * stride_kcs + kv_head * stride_kch
                       + d[:, None])
            kt = tl.load(kt_ptrs, mask=d_mask[:, None] & col_mask[None, :],
                         other=0).to(COMPUTE_DTYPE)
            if USE_DOT:
                scores = tl.dot(q, kt, input_precision=DOT_PRECISION, out_dtype=COMPUTE_DTYPE)
            else:   # (BLOCK_M, BLOCK_D, BLOCK_N) products summed over d
                scores = tl.reduce(q[:, :, None] * kt[None, :, :], 1, _sum_combine)
            scores = scores * scale
            allowed = tl.load(mask_row_ptrs + cols.to(tl.int64)[None, :] * stride_mc,
                              mask=row_mask[:, None] & col_mask[None, :], other=0) != 0
            scores = tl.where(allowed, scores, float('-inf'))            # (BLOCK_M, BLOCK_N)
            m_new = tl.maximum(m_i, tl.reduce(scores, 1, _max_combine))
            # A row with nothing allowed so far keeps max -inf: shift by 0 there, so that
            # exp(-inf - 0) = 0 instead of exp(-inf + inf) = NaN.
            m_shift = tl.where(m_new == float('-inf'), 0.0, m_new)
            alpha = tl.exp(m_i - m_shift)                                # 0 while m_i = -inf
            p = tl.exp(scores - m_shift[:, None])                        # masked -> 0
            l_i = l_i * alpha + tl.reduce(p, 1, _sum_combine)
            v_ptrs = (v_cache_ptr + slots[:, None] * stride_vcs + kv_head * stride_vch
                      + d[None, :])
            v = tl.load(v_ptrs, mask=col_mask[:, None] & d_mask[None, :],
                        other=0).to(COMPUTE_DTYPE)                       # (BLOCK_N, BLOCK_D)
            if USE_DOT:
                acc = tl.dot(p, v, acc * alpha[:, None], input_precision=DOT_PRECISION,
                             out_dtype=COMPUTE_DTYPE)
            else:   # (BLOCK_M, BLOCK_N, BLOCK_D) products summed over the columns
                acc = acc * alpha[:, None] + tl.reduce(p[:, :, None] * v[None, :, :], 1,
                                                       _sum_combine)
            m_i = m_new
        # Rows with no allowed column have l_i = 0 and acc = 0: divide by 1, giving zeros.
        out = acc / tl.where(l_i == 0, 1.0, l_i)[:, None]
        out_ptrs = out_ptr + q_rows[:, None] * stride_ot + head * stride_oh + d[None, :]
        tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=q_tile_mask)

    _segment_attention_kernel = LazyJit(_segment_attention_body)


def default_launch(num_rows: int, num_cols: int, head_dim: int,
                   dtype: torch.dtype) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_D, num_warps) for a step shape and dtype.

    Every block is a power of two. BLOCK_M follows Q (a decode segment of one row does not pay
    for 64), BLOCK_N follows K, BLOCK_D covers the whole head (lanes beyond D masked).

    bf16 / fp16 / float32 (``tl.dot``): every block >= 16. The caps bound a program's registers
    at D = 128: 16-bit inputs take up to 64x32 or 32x64, float32 16x32 (IEEE dots run on CUDA
    cores and hold their operands in registers); 8 warps once a tile holds more than 16 x 64
    16-bit or 16 x 32 float32 elements. Even so, at D = 128 ptxas reports 255 registers and
    180-750 bytes of spills for these tiles (sm_90, Triton 3.6 and 3.9; Triton 3.9's sm_80
    cubin of the 16x64 bf16 tile: 32 registers, ~5.5 KB of spills); see
    ``bench/kernels_compile_check.py``.

    float64 (no ``tl.dot``): the product tile (BLOCK_M, BLOCK_D, BLOCK_N) is held in registers,
    so it is capped at ``FLOAT64_TILE`` elements (BLOCK_M and BLOCK_N may be < 16; BLOCK_M
    first, up to 16 and leaving BLOCK_N >= 16 where the head allows): at D = 128 a decode row
    takes 1x32 and longer segments 2x16, at D = 16 16x16 or 1x64; 8 warps once the tile holds
    more than 2048 elements. Larger tiles spill (16x32 at D = 128: ~3 KB per thread).

    Throughput was not measured here: the tuning knobs of ``segment_attention_triton`` are
    there for a sweep.
    """
    block_d = max(MIN_DOT_BLOCK, next_power_of_2(head_dim))
    if dtype == torch.float64:
        block_m = min(16, next_power_of_2(num_rows),
                      max(1, FLOAT64_TILE // (block_d * MIN_DOT_BLOCK)))
        block_n = min(64, next_power_of_2(num_cols), max(1, FLOAT64_TILE // (block_d * block_m)))
        num_warps = 8 if block_m * block_n * block_d > FLOAT64_TILE // 2 else 4
        return block_m, block_n, block_d, num_warps
    is_16bit = dtype.itemsize == 2
    block_m = min(64 if is_16bit else 16, max(MIN_DOT_BLOCK, next_power_of_2(num_rows)))
    max_n = 64 if is_16bit and block_m <= 32 else 32
    block_n = min(max_n, max(MIN_DOT_BLOCK, next_power_of_2(num_cols)))
    num_warps = 4 if block_m == 16 and dtype.itemsize <= 4 else 8
    return block_m, block_n, block_d, num_warps


def use_dot(dtype: torch.dtype) -> bool:
    """Whether the kernel's two products are ``tl.dot``: every dtype but float64, whose products
    are summed with ``tl.reduce`` (see the module docstring)."""
    return dtype != torch.float64


def dot_precision(dtype: torch.dtype) -> str:
    """``tl.dot`` input precision: TF32 tensor cores for bf16/fp16 inputs, IEEE otherwise.

    bf16 and fp16 values are exact in TF32 (8-bit exponent, 10-bit mantissa), so q @ k^T on
    upcast 16-bit operands is exact products with float32 sums; only the probabilities of
    p @ v lose bits (kept to TF32's 10, where FlashAttention rounds them to bf16's 7). Float32
    inputs would lose 13 mantissa bits in TF32, so they take IEEE products (CUDA cores).
    float64 has no ``tl.dot`` (``use_dot``), so the setting does not apply to it. The CPU
    interpreter computes every dot in full precision.
    """
    return 'tf32' if dtype in (torch.bfloat16, torch.float16) else 'ieee'


def kernel_constants(dtype: torch.dtype, head_dim: int, group: int, scale: float, block_m: int,
                     block_n: int, block_d: int, const_num_cols: int | None = None) -> dict:
    """The kernel's compile-time arguments for a launch (and for an ahead-of-time compile).

    ``const_num_cols`` is the column count as a constant, for the CPU interpreter only: Triton
    3.6's interpreter holds a runtime int as a 1-element array and cannot use it as a ``range``
    bound (its ``__index__`` is ``int(array)``, which NumPy >= 2.4 refuses for arrays of
    ndim > 0), while a constant costs the interpreter no compilation. Compiled launches pass
    None and loop to the runtime ``num_cols`` (one compilation serves every K). A ``while``
    loop would serve both, but Triton software-pipelines only ``for`` loops, and the compiled
    float32 kernel prefetches its K/V tiles that way (sm_90, default ``num_stages``).
    """
    return dict(HEAD_DIM=head_dim, GROUP=group, SCALE=float(scale), BLOCK_M=block_m,
                BLOCK_N=block_n, BLOCK_D=block_d, COMPUTE_DTYPE=compute_dtype(dtype),
                USE_DOT=use_dot(dtype), DOT_PRECISION=dot_precision(dtype),
                CONST_NUM_COLS=const_num_cols)


def segment_attention_triton(q, k_cache, v_cache, kv_index, seg_mask, scale=None, *,
                             block_m=None, block_n=None, num_warps=None, num_stages=None):
    """Triton launch with the contract of ``segment_attention_ref``; inputs are NOT checked.

    Returns a new contiguous (S*Q, Hq, D) tensor. Needs last-dim stride 1 on q and the caches
    (rows and heads of q may be strided, e.g. q rows sliced out of a bigger step); kv_index and
    seg_mask may have any strides. Launches without touching device values (grid from shapes
    only, no sync), so it can be captured in a CUDA graph. ``scale``, D and the GQA group are
    compile-time constants (one compilation per model; Q and K are runtime values).
    ``block_m`` / ``block_n`` (powers of two; >= 16 except for float64), ``num_warps`` and
    ``num_stages`` are the tuning knobs (defaults: ``default_launch``).
    """
    num_segments, num_rows, num_cols = seg_mask.shape
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    group = num_q_heads // k_cache.shape[1]
    out = torch.empty((num_segments * num_rows, num_q_heads, head_dim), dtype=q.dtype,
                      device=q.device)
    if out.numel() == 0:
        return out
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    default_m, default_n, block_d, default_warps = default_launch(num_rows, num_cols, head_dim,
                                                                  q.dtype)
    block_m = block_m or default_m
    block_n = block_n or default_n
    num_warps = num_warps or default_warps
    mask_u8 = seg_mask.view(torch.uint8)     # same bytes and strides; Triton loads uint8 plainly
    grid = (num_segments, num_q_heads, -(-num_rows // block_m))
    extra = {} if num_stages is None else {'num_stages': num_stages}
    _segment_attention_kernel[grid](
        q, k_cache, v_cache, kv_index, mask_u8, out,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1), kv_index.stride(0), kv_index.stride(1),
        mask_u8.stride(0), mask_u8.stride(1), mask_u8.stride(2), out.stride(0), out.stride(1),
        num_rows, num_cols,
        **kernel_constants(q.dtype, head_dim, group, scale, block_m, block_n, block_d,
                           const_num_cols=num_cols if is_interpret_mode() else None),
        num_warps=num_warps, **extra)
    return out


def _check_args(q, k_cache, v_cache, kv_index, seg_mask, scale):
    args = dict(q=q, k_cache=k_cache, v_cache=v_cache, kv_index=kv_index, seg_mask=seg_mask)
    for name in ('q', 'k_cache', 'v_cache', 'seg_mask'):
        check_tensor(name, args[name], 3)
    check_tensor('kv_index', kv_index, 2)
    # dtypes: one floating dtype for q and the caches, int64/int32 indices, a bool mask
    if not q.dtype.is_floating_point:
        raise ValueError(f'q must be a floating tensor, got {q.dtype}')
    for name in ('k_cache', 'v_cache'):
        if args[name].dtype != q.dtype:
            raise ValueError(f'{name} dtype {args[name].dtype} differs from q dtype {q.dtype}')
    if kv_index.dtype not in INDEX_DTYPES:
        raise ValueError(f'kv_index must be int64 or int32, got {kv_index.dtype}')
    if seg_mask.dtype != torch.bool:
        raise ValueError(f'seg_mask must be a bool tensor, got {seg_mask.dtype}')
    for name, x in args.items():
        if x.device != q.device:
            raise ValueError(f'{name} is on {x.device} but q is on {q.device}')
    # shapes
    num_tokens, num_q_heads, head_dim = q.shape
    num_segments, num_cols = kv_index.shape
    if seg_mask.shape[0] != num_segments or seg_mask.shape[2] != num_cols:
        raise ValueError(f'seg_mask shape {tuple(seg_mask.shape)} must be (S={num_segments}, Q, '
                         f'K={num_cols}) to match kv_index shape {tuple(kv_index.shape)}')
    num_rows = seg_mask.shape[1]
    if num_tokens != num_segments * num_rows:
        raise ValueError(f'q has {num_tokens} rows but seg_mask shape {tuple(seg_mask.shape)} '
                         f'needs S*Q = {num_segments * num_rows}')
    if head_dim == 0:
        raise ValueError(f'q head_dim must be > 0, got shape {tuple(q.shape)}')
    num_kv_heads = k_cache.shape[1]
    if k_cache.shape[2] != head_dim or num_kv_heads == 0:
        raise ValueError(f'k_cache shape {tuple(k_cache.shape)} must be (num_slots, Hkv > 0, '
                         f'D={head_dim})')
    if num_q_heads % num_kv_heads:
        raise ValueError(f'q heads ({num_q_heads}) must be a multiple of the k_cache heads '
                         f'({num_kv_heads})')
    if v_cache.shape != k_cache.shape:
        raise ValueError(f'v_cache shape {tuple(v_cache.shape)} must equal k_cache shape '
                         f'{tuple(k_cache.shape)}')
    # strides: rows and heads are addressed by stride, the last dim as contiguous lanes
    for name in ('q', 'k_cache', 'v_cache'):
        if args[name].stride(-1) != 1:
            raise ValueError(f'{name} must have last-dim stride 1, got strides '
                             f'{args[name].stride()}')
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale)
                                  and scale > 0):
        raise ValueError(f'scale must be None or a finite number > 0, got {scale!r}')


def segment_attention(q, k_cache, v_cache, kv_index, seg_mask, scale=None, *, use_triton=True,
                      check_indices=True):
    """Validated segment attention; returns (S*Q, Hq, D). See ``segment_attention_ref``.

    Shapes, dtypes, devices, strides and ``scale`` are always checked (host-side metadata,
    free). ``check_indices`` also checks kv_index values in [0, num_slots) (repeats allowed:
    segments share slots); it reads the indices back (a device->host sync), so a CUDA-graph
    steady state whose indices come from already-validated host bookkeeping turns it off.
    ``use_triton`` selects the kernel (CUDA tensors, or any under TRITON_INTERPRET=1); else
    the reference.
    """
    _check_args(q, k_cache, v_cache, kv_index, seg_mask, scale)
    if check_indices:
        check_index_values('kv_index', kv_index, k_cache.shape[0], is_unique=False)
    if use_triton:
        check_can_launch(q.device)
        return segment_attention_triton(q, k_cache, v_cache, kv_index, seg_mask, scale)
    return segment_attention_ref(q, k_cache, v_cache, kv_index, seg_mask, scale)
