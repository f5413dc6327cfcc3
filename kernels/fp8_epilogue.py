"""The scales of the tensor-wise FP8 product, applied after it in one launch.

Why: on the H200 (bench/results/h200/20261127-fp8), ``torch._scaled_mm`` with row-wise scales
ran at 0.98-1.8x bf16's time for the 7B decoder's products, while the same product with one
scale per tensor ran at 0.45-0.58x at decode's row counts and 0.56-0.86x at a prefill's.
``fp8_linear_tensorwise`` (kernels/fp8_linear.py) therefore multiplies the e4m3 codes with unit
scales, ``acc = xq @ wq.T`` (float32 accumulation, rounded to the output dtype), and this
kernel applies the per-token and per-channel scales: ``out = acc * x_scale[m] * w_scale[n]``
in float32, rounded once more. The function is the row-wise product's (each row's output
depends on that row alone); the intermediate rounding of ``acc`` adds at most one rounding of
the output dtype (two bf16 ulps in all, against the row-wise product's one).

Where a fused kernel follows the product (the residual add of the next norm, the SwiGLU
activation), that kernel applies the scales itself in this order and rounding instead
(kernels/rms_norm.py ``unscaled_row``; models/fp8.py ``UnscaledProduct``).

Layout: ``scale_product_ref`` (plain torch, the oracle), ``scale_product_triton`` (the launch,
no checks), ``scale_product`` (the validating wrapper).
"""
import torch

from ._triton_util import HAS_TRITON, LazyJit, check_can_launch, tl

BLOCK_N = 1024                 # output columns per program


def scale_product_ref(acc: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor):
    """acc (M, N) floating, x_scale (M, 1) float32, w_scale (N,) float32 -> (M, N) in acc's
    dtype: ``acc * x_scale * w_scale`` in float32 (float64 for float64 acc), rounded once."""
    compute = torch.float64 if acc.dtype == torch.float64 else torch.float32
    out = acc.to(compute) * x_scale.to(compute) * w_scale.to(compute)[None, :]
    return out.to(acc.dtype)


if HAS_TRITON:
    def _scale_product_body(acc_ptr, xs_ptr, ws_ptr, out_ptr, N, stride_acc, stride_out,
                            BLOCK: tl.constexpr):
        # Grid: (M, cdiv(N, BLOCK)): one row's BLOCK columns per program, in float32 in the
        # order of the reference ((acc * x_scale) * w_scale).
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = cols < N
        acc = tl.load(acc_ptr + row * stride_acc + cols, mask=ok, other=0.0).to(tl.float32)
        x_scale = tl.load(xs_ptr + row)
        w_scale = tl.load(ws_ptr + cols, mask=ok, other=0.0)
        out = acc * x_scale * w_scale
        tl.store(out_ptr + row * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask=ok)

    _scale_product_kernel = LazyJit(_scale_product_body)


def scale_product_triton(acc: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor):
    """The launch with ``scale_product_ref``'s contract for float32 / bf16 / fp16 ``acc``
    (not float64); inputs are NOT checked: acc (M, N) with unit column stride, x_scale (M, 1)
    float32 contiguous, w_scale (N,) float32 contiguous. Returns a new (M, N) tensor. No host
    sync: CUDA-graph capturable."""
    m, n = acc.shape
    out = torch.empty((m, n), dtype=acc.dtype, device=acc.device)
    if m and n:
        _scale_product_kernel[(m, -(-n // BLOCK_N))](
            acc, x_scale, w_scale, out, n, acc.stride(0), out.stride(0), BLOCK=BLOCK_N,
            num_warps=4)
    return out


def scale_product(acc: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor, *,
                  use_triton: bool = False) -> torch.Tensor:
    """Validated ``acc * x_scale * w_scale``; ``use_triton`` selects the kernel (CUDA tensors,
    or any under TRITON_INTERPRET=1), else the reference."""
    if not isinstance(acc, torch.Tensor) or acc.dim() != 2 or not acc.dtype.is_floating_point:
        raise ValueError(f'acc must be a 2-dim floating tensor, got '
                         f'{getattr(acc, "dtype", type(acc).__name__)}')
    m, n = acc.shape
    if not isinstance(x_scale, torch.Tensor) or x_scale.dtype != torch.float32 \
            or tuple(x_scale.shape) != (m, 1):
        raise ValueError(f'x_scale must be float32 ({m}, 1)')
    if not isinstance(w_scale, torch.Tensor) or w_scale.dtype != torch.float32 \
            or tuple(w_scale.shape) != (n,):
        raise ValueError(f'w_scale must be float32 ({n},)')
    if not use_triton:
        return scale_product_ref(acc, x_scale, w_scale)
    if acc.dtype == torch.float64:
        raise ValueError('use_triton=True: the kernel computes in float32; float64 acc takes '
                         'the reference')
    check_can_launch(acc.device)
    return scale_product_triton(acc if acc.stride(1) == 1 else acc.contiguous(),
                                x_scale.contiguous(), w_scale.contiguous())
