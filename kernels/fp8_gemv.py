"""The FP8 product for a few rows (a decode step): one Triton launch that streams the e4m3
weights once, beside the activations' one-launch quantisation.

Why: a decode forward multiplies 1 to 16 rows by every decoder weight, so its time is the
weights' bytes over the memory bandwidth. FP8 weights are half of bf16's bytes, yet the H200
measured ``torch._scaled_mm`` (row-wise scales) at 0.98 of bf16's decode step
(bench/results/h200/20261126b-suite): its kernels are tiled for matrices, not for a handful of
rows. This kernel's only job is to read each weight byte once, at the bandwidth.

The function is ``fp8_linear_ref``'s (kernels/fp8_linear.py), the one the engine's other FP8
path computes: each row of x quantised per token to e4m3 with its float32 scale (the caller
passes ``quantize_rows_triton``'s output), the e4m3 products accumulated in float32, times
the row's scale and the output channel's scale, rounded once to the output dtype. e4m3 values
are exact in bf16 and a product of two bf16 values is exact in float32, so the tensor-core dot
on bf16 operands adds the same products as a float32 dot of the dequantised codes; only the
order of the float32 additions differs from ``_scaled_mm``'s (a few float32 ulps, as between
any two matrix kernels).

Layout: ``fp8_gemv_ref`` (plain torch, float64 accumulation, the oracle; any device),
``fp8_gemv_triton`` (the launch, no checks; CUDA, or the CPU under TRITON_INTERPRET=1),
``fp8_gemv`` (the validating wrapper). The decode of an e4m3 byte: on a GPU the hardware
conversion; in the CPU interpreter, integer arithmetic on the byte (Triton's interpreter has no
trustworthy fp8 conversion), exact either way.

Tiling: one program per ``BLOCK_N`` output channels and ``BLOCK_M`` (16, the smallest
tensor-core tile) rows, looping over K in ``BLOCK_K`` steps. The default tile is a guess until
measured (bench/fp8_products.py sweeps the tiles on the GPU and prints the fastest per shape).
"""
import torch

from ._triton_util import HAS_TRITON, LazyJit, check_can_launch, is_interpret_mode, tl

FP8_DTYPE = torch.float8_e4m3fn
MAX_ROWS = 16                 # rows per launch's tile; more rows go to the matrix path
DEFAULT_TILE = dict(block_n=32, block_k=256, num_warps=4, num_stages=4)
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def fp8_gemv_ref(xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor,
                 weight_scale: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """Plain torch, in float64: xq (M, K) e4m3, x_scale (M, 1) float32, weight (N, K) e4m3,
    weight_scale (N,) float32 -> (M, N) ``out_dtype``: ``(xq @ weight.T) * x_scale *
    weight_scale``, rounded once."""
    acc = xq.double() @ weight.double().t()
    return (acc * x_scale.double() * weight_scale.double()[None, :]).to(out_dtype)


if HAS_TRITON:
    def _fp8_gemv_body(xq_ptr, xs_ptr, w_ptr, ws_ptr, out_ptr, M, N, stride_xm, stride_om,
                       K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, NATIVE_FP8: tl.constexpr):
        # Grid: (cdiv(N, BLOCK_N), cdiv(M, BLOCK_M)). K is a compile-time constant (one
        # compilation per projection width; Triton 3.6's interpreter cannot loop to a runtime
        # bound). The weight is row-major (N, K) bytes: each
        # program reads BLOCK_N rows of it once, BLOCK_K bytes at a time, contiguous per row.
        pid_n = tl.program_id(0)
        pid_m = tl.program_id(1)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        chans = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
        offs_k = tl.arange(0, BLOCK_K)
        row_ok = rows < M
        chan_ok = chans < N
        acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + offs_k
            k_ok = ks < K
            x = tl.load(xq_ptr + rows[:, None].to(tl.int64) * stride_xm + ks[None, :],
                        mask=row_ok[:, None] & k_ok[None, :], other=0)
            w = tl.load(w_ptr + chans[:, None] * K + ks[None, :],
                        mask=chan_ok[:, None] & k_ok[None, :], other=0)
            if NATIVE_FP8:
                xb = x.to(tl.float8e4nv, bitcast=True).to(tl.bfloat16)
                wb = w.to(tl.float8e4nv, bitcast=True).to(tl.bfloat16)
                acc += tl.dot(xb, tl.trans(wb), out_dtype=tl.float32)
            else:
                # The CPU interpreter: each e4m3fn byte decoded exactly with integer arithmetic
                # (sign, 4 exponent bits of bias 7, 3 mantissa bits; exponent 0 is subnormal,
                # mantissa x 2^-9). NaN codes are not decoded: quantising finite inputs never
                # makes them. Inlined twice (a jitted helper would be compiled for the mode in
                # force at import, not at launch).
                xi = x.to(tl.int32)
                xe = (xi >> 3) & 15
                xn = (((xi >> 7) << 31) | ((xe + 120) << 23) | ((xi & 7) << 20)).to(
                    tl.float32, bitcast=True)
                xs = (xi & 7).to(tl.float32) * 0.001953125
                xs = tl.where((xi >> 7) == 1, -xs, xs)
                xb = tl.where(xe == 0, xs, xn)
                wi = w.to(tl.int32)
                we = (wi >> 3) & 15
                wn = (((wi >> 7) << 31) | ((we + 120) << 23) | ((wi & 7) << 20)).to(
                    tl.float32, bitcast=True)
                ws = (wi & 7).to(tl.float32) * 0.001953125
                ws = tl.where((wi >> 7) == 1, -ws, ws)
                wb = tl.where(we == 0, ws, wn)
                # float32 operands, IEEE products (the interpreter's bf16 is not trustworthy):
                # the same exact products as the GPU's bf16 dot
                acc += tl.dot(xb, tl.trans(wb), input_precision='ieee', out_dtype=tl.float32)
        x_scale = tl.load(xs_ptr + rows, mask=row_ok, other=0.0)
        w_scale = tl.load(ws_ptr + chans, mask=chan_ok, other=0.0)
        out = acc * x_scale[:, None] * w_scale[None, :]
        tl.store(out_ptr + rows[:, None].to(tl.int64) * stride_om + chans[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & chan_ok[None, :])

    _fp8_gemv_kernel = LazyJit(_fp8_gemv_body)


def fp8_gemv_triton(xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor,
                    weight_scale: torch.Tensor, out_dtype: torch.dtype, *, block_n=None,
                    block_k=None, num_warps=None, num_stages=None) -> torch.Tensor:
    """The launch with ``fp8_gemv_ref``'s contract; inputs are NOT checked: xq (M, K) e4m3
    with unit column stride, x_scale (M, 1) float32 contiguous, weight (N, K) e4m3 row-major,
    weight_scale (N,) float32 contiguous, all on one device. Returns a new (M, N) tensor. No
    host sync: CUDA-graph capturable. Tile arguments default to ``DEFAULT_TILE``."""
    m, k = xq.shape
    n = weight.shape[0]
    out = torch.empty((m, n), dtype=out_dtype, device=xq.device)
    if m == 0 or n == 0:
        return out
    block_n = block_n or DEFAULT_TILE['block_n']
    block_k = block_k or DEFAULT_TILE['block_k']
    interpret = is_interpret_mode()
    grid = (-(-n // block_n), -(-m // MAX_ROWS))
    _fp8_gemv_kernel[grid](
        xq.view(torch.uint8), x_scale, weight.view(torch.uint8), weight_scale, out, m, n,
        xq.stride(0), out.stride(0), K=k, BLOCK_M=MAX_ROWS, BLOCK_N=block_n, BLOCK_K=block_k,
        NATIVE_FP8=not interpret and xq.device.type == 'cuda',
        num_warps=num_warps or DEFAULT_TILE['num_warps'],
        num_stages=num_stages or DEFAULT_TILE['num_stages'])
    return out


def fp8_gemv(xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor,
             weight_scale: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16, *,
             use_triton: bool = False) -> torch.Tensor:
    """Validated FP8 product of a few quantised rows; ``use_triton`` selects the kernel (CUDA
    tensors, or any under TRITON_INTERPRET=1), else ``fp8_gemv_ref``. Any row count is
    accepted (the kernel tiles rows by ``MAX_ROWS``); the engine sends it decode steps only."""
    for name, t in (('xq', xq), ('weight', weight)):
        if not isinstance(t, torch.Tensor) or t.dtype != FP8_DTYPE or t.dim() != 2:
            raise ValueError(f'{name} must be a 2-dim {FP8_DTYPE} tensor, got '
                             f'{getattr(t, "dtype", type(t).__name__)}')
    m, k = xq.shape
    n = weight.shape[0]
    if weight.shape[1] != k:
        raise ValueError(f'xq (M, {k}) and weight {tuple(weight.shape)} disagree on K')
    if not isinstance(x_scale, torch.Tensor) or x_scale.dtype != torch.float32 \
            or tuple(x_scale.shape) != (m, 1):
        raise ValueError(f'x_scale must be float32 ({m}, 1), got '
                         f'{getattr(x_scale, "dtype", None)} '
                         f'{tuple(getattr(x_scale, "shape", ()))}')
    if not isinstance(weight_scale, torch.Tensor) or weight_scale.dtype != torch.float32 \
            or tuple(weight_scale.shape) != (n,):
        raise ValueError(f'weight_scale must be float32 ({n},), got '
                         f'{getattr(weight_scale, "dtype", None)} '
                         f'{tuple(getattr(weight_scale, "shape", ()))}')
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f'out_dtype must be one of {OUT_DTYPES}, got {out_dtype}')
    devices = {t.device for t in (xq, x_scale, weight, weight_scale)}
    if len(devices) != 1:
        raise ValueError(f'all operands must be on one device, got {sorted(map(str, devices))}')
    if not use_triton:
        return fp8_gemv_ref(xq, x_scale, weight, weight_scale, out_dtype)
    check_can_launch(xq.device)
    return fp8_gemv_triton(xq if xq.stride(1) == 1 else xq.contiguous(),
                           x_scale.contiguous(), weight.contiguous(),
                           weight_scale.contiguous(), out_dtype)
