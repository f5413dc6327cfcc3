"""Fused (residual add +) RMSNorm: one launch per norm instead of about eight.

The Llama norm, as Hugging Face computes it (and ``models/layers.RMSNorm``):

    bf16 / fp16 input x:  h = float32(x); h = h * rsqrt(mean(h^2) + eps); y = w * x_dtype(h)
    float32 / float64 x:  y = w * (x * rsqrt(mean(x^2) + eps))          (in x's dtype)

In eager PyTorch that is a cast, a square, a mean (a reduction launch), an add, an rsqrt, two
multiplies and a cast back, each reading and writing the whole row, and the residual add before
the post-attention norm is one more. On a 7B decode step (a few rows of 4,096) these are ~65
norms of tiny launches per forward: launch-bound. The kernel does one program per row: load,
(add the residual, rounded to x's dtype exactly as ``a + b`` rounds, and store the sum), reduce,
scale, store.

Differences from the reference: the order of the row's sum of squares (a tree inside the
kernel, torch's own order outside), and on CUDA Triton's fast float32 square root and division
where torch calls rsqrt; a few units in the last place of the float32 intermediate, so for
bf16 inputs at most one bf16 ulp. Tests compare with a dtype-aware tolerance (bf16 and float32
on CUDA, every dtype under the interpreter), and tokens in float64
(test/test_engine_kernels.py).

With FP8 projections the residual may come unscaled (``residual_scales``): the tensor-wise FP8
product's ``acc`` and its per-row and per-column scales, which the kernel applies as
kernels/fp8_epilogue.py does (``(acc * x_scale) * w_scale`` in float32, rounded to x's dtype)
before the add: the same bits as the epilogue's launch followed by this one, one launch fewer.

Layout as in rope_kv_write.py: ``rms_norm_ref`` (plain torch, the oracle), ``rms_norm_triton``
(the launch, no checks), ``rms_norm`` (the validating wrapper).
"""
import torch

from ._triton_util import (HAS_TRITON, LazyJit, as_rows, check_can_launch, compute_dtype,
                           next_power_of_2, tl, triton)
from .fp8_epilogue import scale_product_ref

LOW_PRECISION = (torch.float16, torch.bfloat16)


def rms_norm_ref(x, weight, eps: float, residual=None, residual_scales=None):
    """Plain torch. x: (..., H); weight: (H,); residual: None or like x; residual_scales:
    None, or ``(x_scale (N, 1), w_scale (H,))`` float32 of an unscaled residual (N rows),
    applied first as ``scale_product_ref`` does.

    Returns ``y`` when ``residual`` is None, else ``(x + residual, y of x + residual)``."""
    if residual is not None:
        if residual_scales is not None:
            rows = scale_product_ref(residual.reshape(-1, residual.shape[-1]), *residual_scales)
            residual = rows.view(residual.shape)
        x = x + residual
    if x.dtype in LOW_PRECISION:
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        y = weight * h.to(x.dtype)
    else:
        y = weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
    return y if residual is None else (x, y)


if HAS_TRITON:
    @triton.jit
    def _add(a, b):
        return a + b

    def unscaled_row(acc, xs_ptr, ws_ptr, row, cols, mask, io_ty: tl.constexpr):
        """A row of the tensor-wise FP8 product's ``acc`` scaled as kernels/fp8_epilogue.py
        scales it: ``(acc * x_scale[row]) * w_scale[cols]`` in float32, rounded to ``io_ty``
        (a device function, bound into the kernels that take unscaled inputs)."""
        x_scale = tl.load(xs_ptr + row)
        w_scale = tl.load(ws_ptr + cols, mask=mask, other=0.0)
        return (acc.to(tl.float32) * x_scale * w_scale).to(io_ty)

    def norm_row(x_ptr, res_ptr, w_ptr, sum_ptr, xs_ptr, ws_ptr, row, cols, mask, stride_x,
                 stride_r, stride_s, num_cols, eps, io_ty: tl.constexpr,
                 HAS_RESIDUAL: tl.constexpr, SCALED_RESIDUAL: tl.constexpr,
                 ROUND_BEFORE_SCALE: tl.constexpr, COMPUTE_DTYPE: tl.constexpr):
        """One row's norm (after the residual add, whose sum it stores), rounded to ``io_ty``:
        the value this file's kernel stores, and what kernels/fp8_producers.py quantises (a
        device function shared by both, so their norms are one computation)."""
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0)
        if HAS_RESIDUAL:
            r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0)
            if SCALED_RESIDUAL:
                r = unscaled_row(r, xs_ptr, ws_ptr, row, cols, mask, io_ty)
            # torch adds two bf16/fp16 tensors in float32 and rounds once: the same here.
            x = (x.to(COMPUTE_DTYPE) + r.to(COMPUTE_DTYPE)).to(io_ty)
            tl.store(sum_ptr + row * stride_s + cols, x, mask=mask)
        h = x.to(COMPUTE_DTYPE)
        # tl.reduce with our own combine, not tl.sum: Triton's library functions are jitted
        # for the mode in force when triton was imported, so tl.sum fails in the CPU
        # interpreter when it is switched on later (a test on a GPU machine); a reduce reads
        # the combine's Python function there.
        mean_sq = tl.reduce(h * h, 0, _add) / num_cols
        h = h * (1.0 / tl.sqrt(mean_sq + eps))
        if ROUND_BEFORE_SCALE:          # HF: normalised value rounded to x's dtype first
            h = h.to(io_ty).to(COMPUTE_DTYPE)
        w = tl.load(w_ptr + cols, mask=mask, other=0).to(COMPUTE_DTYPE)
        return (w * h).to(io_ty)

    NORM_HELPERS = (norm_row, unscaled_row)

    def _rms_norm_body(x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr, xs_ptr, ws_ptr,
                       stride_x, stride_r, stride_o, stride_s, num_cols, eps,
                       HAS_RESIDUAL: tl.constexpr, ROUND_BEFORE_SCALE: tl.constexpr,
                       BLOCK: tl.constexpr, COMPUTE_DTYPE: tl.constexpr,
                       SCALED_RESIDUAL: tl.constexpr):
        # One program per row; the whole row fits one block (BLOCK >= num_cols).
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < num_cols
        y = norm_row(x_ptr, res_ptr, w_ptr, sum_ptr, xs_ptr, ws_ptr, row, cols, mask,
                     stride_x, stride_r, stride_s, num_cols, eps, out_ptr.dtype.element_ty,
                     HAS_RESIDUAL, SCALED_RESIDUAL, ROUND_BEFORE_SCALE, COMPUTE_DTYPE)
        tl.store(out_ptr + row * stride_o + cols, y, mask=mask)

    _rms_norm_kernel = LazyJit(_rms_norm_body, helpers=NORM_HELPERS)


def rms_norm_triton(x, weight, eps: float, residual=None, *, residual_scales=None,
                    num_warps=None):
    """Triton launch with the contract of ``rms_norm_ref``; inputs are NOT checked
    (``residual_scales``: contiguous float32 ``(x_scale (N, 1), w_scale (H,))``, not for
    float64)."""
    shape = x.shape
    x2 = as_rows(x)
    num_rows, num_cols = x2.shape
    out = torch.empty((num_rows, num_cols), dtype=x.dtype, device=x.device)
    res2 = as_rows(residual) if residual is not None else x2
    total = torch.empty_like(out) if residual is not None else out
    x_scale, w_scale = residual_scales if residual_scales is not None else (out, out)
    if num_rows:
        block = next_power_of_2(num_cols)
        if num_warps is None:
            num_warps = max(1, min(16, block // 256))
        _rms_norm_kernel[(num_rows,)](
            x2, res2, weight, out, total, x_scale, w_scale, x2.stride(0), res2.stride(0),
            out.stride(0), total.stride(0), num_cols, float(eps),
            HAS_RESIDUAL=residual is not None, ROUND_BEFORE_SCALE=x.dtype in LOW_PRECISION,
            BLOCK=block, COMPUTE_DTYPE=compute_dtype(x.dtype),
            SCALED_RESIDUAL=residual_scales is not None, num_warps=num_warps)
    y = out.view(shape)
    return y if residual is None else (total.view(shape), y)


def rms_norm(x, weight, eps: float, residual=None, *, use_triton=False):
    """Validated fused (residual add +) RMSNorm; see ``rms_norm_ref`` for the contract.
    ``use_triton`` selects the kernel (CUDA tensors, or any under TRITON_INTERPRET=1)."""
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point or x.dim() < 1:
        raise ValueError('x must be a floating tensor with at least one dim')
    if weight.dim() != 1 or weight.shape[0] != x.shape[-1] or weight.stride(0) != 1:
        raise ValueError(f'weight shape {tuple(weight.shape)} must be ({x.shape[-1]},), '
                         'contiguous')
    if weight.dtype != x.dtype or weight.device != x.device:
        raise ValueError(f'weight ({weight.dtype}, {weight.device}) must match x '
                         f'({x.dtype}, {x.device})')
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype
                                 or residual.device != x.device):
        raise ValueError('residual must have the shape, dtype and device of x')
    if not eps > 0:
        raise ValueError(f'eps must be > 0, got {eps}')
    if use_triton:
        check_can_launch(x.device)
        return rms_norm_triton(x, weight, eps, residual)
    return rms_norm_ref(x, weight, eps, residual)
