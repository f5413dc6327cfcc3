"""FP8 activations quantised by the kernel that produces them: the RMS norm before q/k/v and
gate/up, and the SwiGLU activation before down, write e4m3 codes and per-row scales instead of
a bf16 row that a separate launch then reads back and quantises.

Why: with ``weight_dtype: fp8`` every decoder product quantised its own input
(kernels/fp8_quant.py): on the H200 at one row that was 13.4 us of a layer's 76.4 us of FP8
products, in four launches, each reading back a row its producer had just written
(bench/results/h200/20261130b-suite, ``fp8-products.txt``). Here three of the four
quantisations ride in their producer: one launch and no bf16 round trip per product. The
fourth (o_proj's input, the attention's output) still quantises itself.

Contract (bit-exact): each fused kernel gives, byte for byte in the codes and bit for bit in
the scales (and the residual sum), what the two launches it replaces give on the same device:

- ``rms_norm_quant_triton(x, w, eps[, residual])`` equals
  ``quantize_rows_triton(rms_norm_triton(x, w, eps[, residual]))``;
- ``silu_mul_quant_triton(gate, up)`` equals ``quantize_rows_triton(silu_mul_triton(gate, up))``.

The kernels compute the producer's row exactly as its own kernel does (the same operations in
the same order, rounded to the input dtype where it stores), widen it to float32 exactly, and
quantise it with the device functions of kernels/fp8_quant.py (the scale as torch computes it
on the device imitated: ``scale_by_reciprocal``). Through those two launches' own contracts
the result is the reference's, ``quantize_rows`` of the norm's or the activation's output, to
the producers' own tolerance (at most one bf16 ulp before the quantisation: the codes of the
reference and the kernel may then differ by one e4m3 step where a value sits on a rounding
boundary).

Their inputs may come unscaled from the FP8 product before them (``residual_scales`` of the
norm's residual add after o and down, ``scales`` of gate and up: the tensor-wise product's
``acc`` and its scales), applied as kernels/fp8_epilogue.py applies them (rms_norm.py's
``unscaled_row``): the same bits as the scaling launch followed by these, so one kernel then
stands for three launches (scale, produce, quantise).

Layout as elsewhere in this folder: ``rms_norm_quant_ref`` / ``silu_mul_quant_ref`` (plain
torch, the references), ``..._triton`` (the launches, no checks), ``rms_norm_quant`` /
``silu_mul_quant`` (validating wrappers taking ``use_triton``).
"""
import torch

from ._triton_util import (HAS_TRITON, LazyJit, as_rows, check_can_launch, next_power_of_2,
                           tl)
from .fp8_quant import (_INV_FP8_MAX, _TINY, FP8_DTYPE, FP8_MAX, INPUT_DTYPES, MAX_BLOCK_K,
                        quantize_rows)
from .rms_norm import LOW_PRECISION, rms_norm_ref
from .silu_mul import silu_mul_ref

if HAS_TRITON:
    from .fp8_quant import QUANT_HELPERS, _maximum
    from .rms_norm import NORM_HELPERS
    from .silu_mul import SILU_MUL_HELPERS


def rms_norm_quant_ref(x, weight, eps: float, residual=None, residual_scales=None):
    """Plain torch: ``quantize_rows(rms_norm_ref(...))``. Returns ``(q, scale)``, or
    ``(x + residual, q, scale)`` with a residual (``residual_scales`` as in
    ``rms_norm_ref``)."""
    if residual is None:
        return quantize_rows(rms_norm_ref(x, weight, eps))
    total, y = rms_norm_ref(x, weight, eps, residual, residual_scales)
    return (total, *quantize_rows(y))


def silu_mul_quant_ref(gate, up, scales=None):
    """Plain torch: ``quantize_rows(silu_mul_ref(gate, up, scales))`` -> ``(q, scale)``."""
    return quantize_rows(silu_mul_ref(gate, up, scales))


if HAS_TRITON:
    def widen_exactly(y, BF16: tl.constexpr):
        """A value rounded to the io dtype, back to float32 exactly (bf16 by its bits, as
        fp8_quant.load_as_float32 reads a stored bf16 row)."""
        if BF16:
            return (y.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32,
                                                                          bitcast=True)
        return y.to(tl.float32)

    HELPERS = QUANT_HELPERS + (widen_exactly,)

    def _rms_norm_quant_body(x_ptr, res_ptr, w_ptr, sum_ptr, q_ptr, scale_ptr, xs_ptr, ws_ptr,
                             stride_x, stride_r, stride_s, num_cols, eps,
                             HAS_RESIDUAL: tl.constexpr, ROUND_BEFORE_SCALE: tl.constexpr,
                             BF16: tl.constexpr, BLOCK: tl.constexpr,
                             SCALE_BY_RECIPROCAL: tl.constexpr, INV_FP8_MAX: tl.constexpr,
                             FP8_MAX: tl.constexpr, TINY: tl.constexpr,
                             SCALED_RESIDUAL: tl.constexpr):
        # One program per row, the whole row in one block (BLOCK >= num_cols). ``y`` is
        # kernels/rms_norm.py's norm_row (float32 compute: the inputs are bf16, fp16 or
        # float32), the bits that kernel stores, widened exactly.
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < num_cols
        y = widen_exactly(norm_row(  # noqa: F821 (bound by LazyJit's helpers)
            x_ptr, res_ptr, w_ptr, sum_ptr, xs_ptr, ws_ptr, row, cols, mask, stride_x,
            stride_r, stride_s, num_cols, eps, w_ptr.dtype.element_ty, HAS_RESIDUAL,
            SCALED_RESIDUAL, ROUND_BEFORE_SCALE, tl.float32), BF16)
        # The quantisation of fp8_quant.py's kernel on that row (lanes past the row hold 0).
        amax = tl.reduce(tl.abs(y), 0, _maximum)
        scale = row_scale(amax, SCALE_BY_RECIPROCAL, INV_FP8_MAX, FP8_MAX, TINY)  # noqa: F821
        tl.store(scale_ptr + row, scale)
        code = e4m3_codes(y, tl.full((BLOCK,), 0.0, tl.float32) + scale,  # noqa: F821
                          FP8_MAX)
        tl.store(q_ptr + row * num_cols + cols, code.to(tl.uint8), mask=mask)

    def _silu_mul_quant_body(gate_ptr, up_ptr, q_ptr, scale_ptr, xs_ptr, wsg_ptr, wsu_ptr,
                             stride_g, stride_u,
                             K: tl.constexpr, BLOCK_K: tl.constexpr, NUM_BLOCKS: tl.constexpr,
                             BF16: tl.constexpr, SCALE_BY_RECIPROCAL: tl.constexpr,
                             INV_FP8_MAX: tl.constexpr, FP8_MAX: tl.constexpr,
                             TINY: tl.constexpr, SCALED: tl.constexpr):
        # One program per row, two passes over its blocks as in fp8_quant.py: the amax, then
        # the codes; the activation (kernels/silu_mul.py's silu_mul_block) is computed in
        # each, not stored.
        row = tl.program_id(0).to(tl.int64)
        offsets = tl.arange(0, BLOCK_K)
        io_ty = gate_ptr.dtype.element_ty
        running = tl.full((BLOCK_K,), 0.0, tl.float32)
        for b in range(NUM_BLOCKS):
            cols = b * BLOCK_K + offsets
            mask = cols < K
            y = widen_exactly(silu_mul_block(  # noqa: F821 (bound by LazyJit's helpers)
                gate_ptr, up_ptr, xs_ptr, wsg_ptr, wsu_ptr, row, cols, stride_g, stride_u,
                mask, io_ty, tl.float32, SCALED), BF16)
            running = tl.maximum(running, tl.abs(y), propagate_nan=tl.PropagateNan.ALL)
        amax = tl.reduce(running, 0, _maximum)
        scale = row_scale(amax, SCALE_BY_RECIPROCAL, INV_FP8_MAX, FP8_MAX, TINY)  # noqa: F821
        tl.store(scale_ptr + row, scale)
        scale_block = tl.full((BLOCK_K,), 0.0, tl.float32) + scale
        for b in range(NUM_BLOCKS):
            cols = b * BLOCK_K + offsets
            mask = cols < K
            y = widen_exactly(silu_mul_block(  # noqa: F821 (bound by LazyJit's helpers)
                gate_ptr, up_ptr, xs_ptr, wsg_ptr, wsu_ptr, row, cols, stride_g, stride_u,
                mask, io_ty, tl.float32, SCALED), BF16)
            code = e4m3_codes(y, scale_block, FP8_MAX)  # noqa: F821
            tl.store(q_ptr + row * K + cols, code.to(tl.uint8), mask=mask)

    _rms_norm_quant_kernel = LazyJit(_rms_norm_quant_body, helpers=HELPERS + NORM_HELPERS)
    _silu_mul_quant_kernel = LazyJit(_silu_mul_quant_body,
                                     helpers=HELPERS + SILU_MUL_HELPERS)


def _quant_constants(device, scale_by_reciprocal):
    if scale_by_reciprocal is None:
        scale_by_reciprocal = device.type == 'cuda'
    return dict(SCALE_BY_RECIPROCAL=bool(scale_by_reciprocal), INV_FP8_MAX=_INV_FP8_MAX,
                FP8_MAX=FP8_MAX, TINY=_TINY)


def rms_norm_quant_triton(x, weight, eps: float, residual=None, *, residual_scales=None,
                          scale_by_reciprocal=None, num_warps=None):
    """Triton launch with the contract of ``rms_norm_quant_ref`` (the module docstring);
    inputs are NOT checked (``residual_scales`` as in ``rms_norm_triton``).
    ``scale_by_reciprocal`` as in ``quantize_rows_triton`` (default: whether x is on a CUDA
    device). No host sync: CUDA-graph capturable."""
    shape = x.shape
    x2 = as_rows(x)
    num_rows, num_cols = x2.shape
    q = torch.empty((num_rows, num_cols), dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty((num_rows, 1), dtype=torch.float32, device=x.device)
    res2 = as_rows(residual) if residual is not None else x2
    total = torch.empty_like(x2) if residual is not None else x2     # (not written without)
    x_scale, w_scale = residual_scales if residual_scales is not None else (scale, scale)
    if num_rows:
        block = next_power_of_2(num_cols)
        if num_warps is None:
            num_warps = max(1, min(16, block // 256))
        _rms_norm_quant_kernel[(num_rows,)](
            x2, res2, weight, total, q.view(torch.uint8), scale, x_scale, w_scale, x2.stride(0),
            res2.stride(0), total.stride(0), num_cols, float(eps),
            HAS_RESIDUAL=residual is not None, ROUND_BEFORE_SCALE=x.dtype in LOW_PRECISION,
            BF16=x.dtype == torch.bfloat16, BLOCK=block, num_warps=num_warps,
            SCALED_RESIDUAL=residual_scales is not None,
            **_quant_constants(x.device, scale_by_reciprocal))
    q, scale = q.view(shape), scale.view(*shape[:-1], 1)
    return (q, scale) if residual is None else (total.view(shape), q, scale)


def silu_mul_quant_triton(gate, up, scales=None, *, scale_by_reciprocal=None, block_k=None,
                          num_warps=None):
    """Triton launch with the contract of ``silu_mul_quant_ref`` (the module docstring);
    inputs are NOT checked (any row strides: the two halves of the fused gate/up product;
    ``scales`` as in ``silu_mul_triton``).
    ``block_k`` (a power of two): columns per loop step. No host sync: CUDA-graph
    capturable."""
    shape = gate.shape
    g2, u2 = as_rows(gate), as_rows(up)
    num_rows, num_cols = g2.shape
    q = torch.empty((num_rows, num_cols), dtype=FP8_DTYPE, device=gate.device)
    scale = torch.empty((num_rows, 1), dtype=torch.float32, device=gate.device)
    x_scale, w_gate, w_up = scales if scales is not None else (scale, scale, scale)
    if num_rows:
        if block_k is None:
            block_k = min(next_power_of_2(num_cols), MAX_BLOCK_K)
        if num_warps is None:
            num_warps = max(1, min(8, block_k // 512))
        _silu_mul_quant_kernel[(num_rows,)](
            g2, u2, q.view(torch.uint8), scale, x_scale, w_gate, w_up, g2.stride(0),
            u2.stride(0), K=num_cols, BLOCK_K=block_k, NUM_BLOCKS=-(-num_cols // block_k),
            BF16=gate.dtype == torch.bfloat16, SCALED=scales is not None,
            num_warps=num_warps, **_quant_constants(gate.device, scale_by_reciprocal))
    return q.view(shape), scale.view(*shape[:-1], 1)


def _check_input(name, x):
    if not isinstance(x, torch.Tensor) or x.dtype not in INPUT_DTYPES or x.dim() < 1 \
            or x.shape[-1] < 1:
        raise ValueError(f'{name} must be a bfloat16, float16 or float32 tensor with at least '
                         f'one dim and one column, got '
                         f'{getattr(x, "dtype", type(x).__name__)} '
                         f'{tuple(getattr(x, "shape", ()))}')


def rms_norm_quant(x, weight, eps: float, residual=None, *, use_triton=False):
    """Validated RMS norm (after the residual add, if any) quantised per row to e4m3;
    ``use_triton`` selects the kernel (CUDA tensors, or any under TRITON_INTERPRET=1)."""
    _check_input('x', x)
    if not isinstance(weight, torch.Tensor) or weight.shape != (x.shape[-1],) \
            or weight.dtype != x.dtype or weight.device != x.device or weight.stride(0) != 1:
        raise ValueError(f'weight must be a contiguous ({x.shape[-1]},) tensor of x\'s dtype '
                         f'and device ({x.dtype}, {x.device})')
    if residual is not None and (not isinstance(residual, torch.Tensor)
                                 or residual.shape != x.shape or residual.dtype != x.dtype
                                 or residual.device != x.device):
        raise ValueError('residual must have the shape, dtype and device of x')
    if not eps > 0:
        raise ValueError(f'eps must be > 0, got {eps}')
    if use_triton:
        check_can_launch(x.device)
        return rms_norm_quant_triton(x, weight, eps, residual)
    return rms_norm_quant_ref(x, weight, eps, residual)


def silu_mul_quant(gate, up, *, use_triton=False):
    """Validated ``silu(gate) * up`` quantised per row to e4m3; ``use_triton`` selects the
    kernel (CUDA tensors, or any under TRITON_INTERPRET=1)."""
    _check_input('gate', gate)
    if not isinstance(up, torch.Tensor) or up.shape != gate.shape or up.dtype != gate.dtype \
            or up.device != gate.device:
        raise ValueError(f'up must match gate ({tuple(gate.shape)}, {gate.dtype}, '
                         f'{gate.device})')
    if use_triton:
        check_can_launch(gate.device)
        return silu_mul_quant_triton(gate, up)
    return silu_mul_quant_ref(gate, up)
